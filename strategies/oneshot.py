"""One-shot federated learning: one communication round, then the server works alone.

Co-Boosting (Dai et al., ICLR 2024; paper 004), Sec. 3.1: every client trains once, from
scratch, with its ordinary local training, and uploads its model, nothing else; the server
never talks to the clients again. This base is the paper's simplest baselines:

- **one-shot FedAvg**: the global model is the n_k-weighted average of the uploaded models
  (Table 1's "FedAvg"; only when every client has the server's architecture);
- **FedENS** and **DW-FedENS**: the ensemble of the uploaded models with uniform and
  data-size weights (eq. 2 with ``w_k = 1/n`` and ``w_k = n_k / sum n``), whose test accuracy
  every one-shot run reports (``ensemble_accuracy_uniform``, ``ensemble_accuracy_data_size``).

Subclasses (:mod:`strategies.coboosting`, :mod:`strategies.dense`, :mod:`strategies.fadi`)
add server epochs after the clients' round (:meth:`OneShot.server_epoch`).

**Rounds and rows.** ``rounds`` must be 1. ``metrics.jsonl`` has that round as ``round: 1`` and
then one row per server epoch ``e`` as ``round: 1 + e`` with ``epoch: e``; the student is
evaluated every ``eval.every`` epochs and in the last. A checkpoint after each row holds the
uploaded models, so a resumed run never trains the clients again; during the clients' round
the accepted uploads are kept as they arrive (:data:`PARTIAL_FILE`, at most once a minute),
so a run stopped half-way through it (a session's end, on a CPU) trains only the clients still
missing when resumed.

**A client that fails** its round, or whose model is no usable teacher (its logits on the test
split not finite, above :data:`~fedgo_flwr.learning.distill.MAX_TEACHER_LOGIT`, or of a scale
above ``strategy.aggregation.upload_bound`` times the median client's), is left out, named in a
WARNING and in ``summary.json`` (``clients_left_out``); the run stops with an error naming them
if fewer than ``min_clients`` remain. ``teacher_norm: std`` rescales every teacher to the median
teacher's scale wherever the ensemble is formed. ``docs/architecture.md`` ("One-shot FL") says
why each check is there.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log
from torch import Tensor, nn

from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.config.schema import Checker
from fedgo_flwr.datafree import weighted_logits
from fedgo_flwr.learning.aggregation import check_arrays
from fedgo_flwr.learning.distill import (
    TEACHER_NORMS,
    normalise_teachers,
    teacher_logits_problem,
    teacher_scale_outliers,
)
from fedgo_flwr.learning.training import predict_logits
from fedgo_flwr.records.checkpoint import arrays_problem
from fedgo_flwr.runtime.fileio import atomic_torch_save, safe_torch_load
from fedgo_flwr.runtime.messages import stream_replies, to_numpy, to_record
from fedgo_flwr.runtime.shutdown import raise_if_stopping
from strategies.base import BaseConfig, Reply, ReplyRejected, Row, Strategy

__all__ = ["OneShot", "OneShotConfig"]


@dataclass
class OneShotConfig(BaseConfig):
    """``teacher_batch_size``: batch of the client models' test-set inference.
    ``teachers_from``: reuse the models uploaded in an earlier one-shot run (its folder or its
    ``client_models.pt``) instead of training the clients again; its data, model, training,
    seed and sampling settings must equal this run's (the models would differ otherwise).
    ``teacher_norm``: ``none`` (the papers' ensembles) or ``std``: each teacher's logits
    rescaled to the median teacher's scale wherever the ensemble is formed
    (:func:`fedgo_flwr.learning.distill.normalise_teachers`)."""

    teacher_batch_size: int = 256
    teachers_from: str | None = None
    teacher_norm: str = "none"

    def check(self, c: Checker) -> None:
        c.require("teacher_batch_size", self.teacher_batch_size >= 1, "must be >= 1")
        c.choice("teacher_norm", TEACHER_NORMS)


class OneShot(Strategy):
    """One round of local training; the global model is the clients' average (one-shot FedAvg)."""

    name = "oneshot"
    rolls_back = False  # one round of clients, then server epochs
    client_algorithm = "fedavg"
    Config = OneShotConfig

    @classmethod
    def preflight(cls, cfg: ExperimentConfig, c: Checker) -> None:
        epochs = "epochs" in {f.name for f in dataclasses.fields(cls.Config)}
        c.at("", cfg).require(
            "rounds",
            cfg.rounds == 1,
            f"must be 1 for {cls.name}: a one-shot run has one communication round"
            + ("; the server's epochs are strategy.epochs" if epochs else ""),
        )
        source = cfg.strategy.params.teachers_from
        if source:
            try:
                read_client_models(source, cfg, cls.extra_fingerprint(cfg))
            except ValueError as exc:
                c.at("strategy.", cfg.strategy.params).fail("teachers_from", str(exc))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.resources is None:
            raise ValueError(f"{self.name} needs the server's resources (its test split)")
        self.teachers: dict[int, dict[str, np.ndarray]] = {}
        self.teacher_sizes: dict[int, int] = {}
        self.left_out: list[int] = []
        self.average: dict[str, np.ndarray] | None = None
        self.epochs_done = 0
        self.finished = False
        self._test_logits: Tensor | None = None
        self._member_test: dict[int, Tensor] = {}  # each teacher's test logits, from its check
        self._modules: list[nn.Module] | None = None
        self._kept: dict[int, Mapping[str, Any]] = {}  # an interrupted round's uploads
        self._saved: set[int] = set()  # the clients in PARTIAL_FILE

    # -- what subclasses change ------------------------------------------------------------
    @property
    def epochs(self) -> int:
        """Server epochs after the clients' round (none for one-shot FedAvg)."""
        return int(getattr(self.params, "epochs", 0))

    @classmethod
    def extra_fingerprint(cls, cfg: ExperimentConfig) -> dict[str, Any] | None:
        """What besides the models' settings the saved uploads must match (``None``: the
        models only). :class:`~strategies.coboosting_fedgo.CoBoostingFedGO`: its GAN settings."""
        return None

    def extra_uploads(self, pid: int) -> dict[str, np.ndarray] | None:
        """What else client ``pid`` uploaded, saved beside its model (its discriminator)."""
        return None

    def load_extra_uploads(self, pid: int, arrays: dict[str, np.ndarray]) -> None:
        """Take back what :meth:`extra_uploads` saved."""

    def needs_average(self) -> bool:
        """Whether the clients' parameter average is computed (one architecture for all)."""
        return True

    def after_clients(self, initial: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The global model once the clients' models are in: their average."""
        assert self.average is not None
        return self.average

    def server_epoch(self, epoch: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Server epoch ``epoch`` (1-based): the new global model and the row's metrics."""
        raise NotImplementedError

    # -- the clients' models ---------------------------------------------------------------
    @property
    def pids(self) -> list[int]:
        """Partition ids of the uploaded models, in order (the ensemble's member order)."""
        return sorted(self.teachers)

    def client_model(self, pid: int) -> nn.Module:
        """A fresh module of client ``pid``'s architecture (``model.client_models``)."""
        return self.model_factory(self.architectures.of(pid))

    def teacher_modules(self) -> list[nn.Module]:
        """The uploaded models as modules (built once), in :attr:`pids` order, in eval mode."""
        if self._modules is None:
            mods = []
            for pid in self.pids:
                m = self.client_model(pid)
                m.load_state_dict({k: torch.from_numpy(v) for k, v in self.teachers[pid].items()})
                mods.append(m.to(self.resources.device).eval())
            self._modules = mods
        return self._modules

    def data_size_weights(self) -> Tensor:
        sizes = torch.tensor([self.teacher_sizes[p] for p in self.pids], dtype=torch.float32)
        return sizes / sizes.sum()

    def test_logits(self) -> Tensor:
        """Every uploaded model's logits on the test split, ``(n, N, C)``, under
        ``teacher_norm`` (computed once; those of the round's checks are reused)."""
        if self._test_logits is None:
            if all(p in self._member_test for p in self.pids):
                raw = torch.stack([self._member_test[p] for p in self.pids])
            else:
                raw = torch.stack([self.member_test_logits(m) for m in self.teacher_modules()])
            self._test_logits = normalise_teachers(raw, self.params.teacher_norm)
        return self._test_logits

    def member_test_logits(self, model: nn.Module) -> Tensor:
        """One client model's logits on the test split, ``(N, C)``."""
        test, dev = self.resources.bundle.test, self.resources.device
        return predict_logits(model, test, self.params.teacher_batch_size, dev).float()

    def check_teacher(self, pid: int, arrays: dict[str, np.ndarray]) -> Tensor:
        """Client ``pid``'s model's test logits, if it is a usable teacher
        (:func:`~fedgo_flwr.learning.distill.teacher_logits_problem`); :class:`ReplyRejected` if
        not."""
        model = self.client_model(pid)
        model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in arrays.items()})
        logits = self.member_test_logits(model.to(self.resources.device))
        problem = teacher_logits_problem(logits, "the test split")
        if problem is not None:
            raise ReplyRejected(problem)
        return logits

    def ensemble_accuracy(self, weights: Tensor) -> float:
        """Test accuracy of ``A_w`` (eq. 2) for scalar weights ``(n,)`` or per-sample weights
        ``(n, N_test)`` (FedGO's odds)."""
        labels = torch.as_tensor(self.resources.bundle.test.y, dtype=torch.long)
        pred = weighted_logits(self.test_logits(), weights).argmax(1)
        return float((pred == labels).float().mean())

    def ensemble_metrics(self) -> dict[str, float]:
        n = len(self.pids)
        return {
            "ensemble_accuracy_uniform": self.ensemble_accuracy(torch.full((n,), 1.0 / n)),
            "ensemble_accuracy_data_size": self.ensemble_accuracy(self.data_size_weights()),
        }

    # -- the round -------------------------------------------------------------------------
    def begin_round(self, server_round: int) -> None:
        super().begin_round(server_round)
        self._arrival: list[int] = []
        for pid, entry in self._kept.items():  # in the order they first arrived
            self.take_saved(pid, entry, PARTIAL_FILE)

    def replies_carried(self) -> int:
        return sum(pid in self.teachers for pid in self._kept)  # a rejected one is left out

    def absorb(self, server_round: int, reply: Reply) -> None:
        """Keep the model if it is a usable teacher (:meth:`check_teacher`, before anything
        changes); the average waits for the round's relative check (:meth:`finish_uploads`)."""
        logits = self.check_teacher(reply.partition_id, reply.arrays)
        self._member_test[reply.partition_id] = logits
        self.teachers[reply.partition_id] = {k: np.array(v) for k, v in reply.arrays.items()}
        self.teacher_sizes[reply.partition_id] = reply.num_examples
        self._arrival.append(reply.partition_id)

    def aggregate(self, server_round: int, replies: list[Reply]) -> dict[str, np.ndarray]:
        self.finish_uploads()
        return self.average if self.average is not None else self.global_arrays

    def finish_uploads(self) -> None:
        """Once every upload is in: leave out each client whose logits on the test split are
        larger in scale than ``strategy.aggregation.upload_bound`` times the median client's
        (:func:`~fedgo_flwr.learning.distill.teacher_scale_outliers`: a scaled-up output layer),
        named in a WARNING; then the parameter average of the others, added in the order they
        arrived (as a streaming average would have)."""
        pids = self.pids
        logits = torch.stack([self._member_test[p] for p in pids]) if pids else None
        dropped = 0
        if logits is not None:
            for k, scale, median in teacher_scale_outliers(logits, self.aggregation.upload_bound):
                log(
                    WARNING,
                    "%s: leaving out client %d: the scale of its logits on the test split, "
                    "%.3g, is %.3g x the median client's %.3g, above "
                    "strategy.aggregation.upload_bound = %g",
                    self.name,
                    pids[k],
                    scale,
                    scale / median if median > 0 else float("inf"),
                    median,
                    self.aggregation.upload_bound,
                )
                self.drop_teacher(pids[k])
                dropped += 1
        if dropped and "clients_replied" in self.last_round:
            self.last_round["clients_replied"] -= dropped
            self.last_round["clients_failed"] += dropped
        self.average = None
        if self.needs_average() and self.teachers:
            for pid in self._arrival:
                if pid in self.teachers:
                    size = self.teacher_sizes[pid]
                    self.averager.add(self.teachers[pid], size, pid, self.global_arrays)
            self.average = self.averaged()

    def drop_teacher(self, pid: int) -> None:
        """Forget client ``pid``'s upload (it is left out)."""
        for store in (self.teachers, self.teacher_sizes, self._member_test):
            store.pop(pid, None)
        self._modules, self._test_logits = None, None

    def clients_round(
        self, grid: Grid, initial: ArrayRecord, config: ConfigRecord, timeout: float
    ) -> dict[str, np.ndarray]:
        """Round 1: every sampled client trains once and uploads; the rest are left out.
        With ``teachers_from`` the uploads of an earlier run are taken instead."""
        if self.params.teachers_from:
            return self.reuse_uploads(self.params.teachers_from, initial)
        messages = list(self.configure_train(1, initial, config, grid))
        self._kept = self.kept_uploads()
        if self._kept:  # an interrupted round: only the clients still missing train
            messages = [m for m in messages if int(m.metadata.group_id) not in self._kept]
            self.intake.open([p for p in self.sampled if p not in self._kept])
            log(
                INFO,
                "%s: the uploads of clients %s kept from an interrupted round (%s); "
                "%d clients train",
                self.name,
                sorted(self._kept),
                PARTIAL_FILE,
                len(messages),
            )
        replies = self.keeping_uploads(stream_replies(grid, messages, timeout))
        arrays, _ = self.aggregate_train(1, replies)
        raise_if_stopping("the clients' round")
        self.left_out = [p for p in self.sampled if p not in self.teachers]
        if self.left_out:
            log(WARNING, "%s: clients %s are left out (no usable model)", self.name, self.left_out)
        if arrays is None or len(self.teachers) < self.cfg.min_clients:
            raise RuntimeError(
                f"{self.name}: only {len(self.teachers)} usable client models (clients "
                f"{self.pids}); min_clients is {self.cfg.min_clients}. Left out: {self.left_out}"
            )
        self.save_uploads()
        (self.resources.out_dir / PARTIAL_FILE).unlink(missing_ok=True)
        return to_numpy(arrays)

    def keeping_uploads(self, replies: Iterable[Message]) -> Iterator[Message]:
        """``replies`` as they come; after one is taken, the uploads so far are kept in
        :data:`PARTIAL_FILE` when they changed and the file is :data:`KEEP_EVERY` seconds old,
        so that a round stopped half-way (a session that ends, a killed process) goes on with
        the clients still missing when the run is resumed (:meth:`kept_uploads`). The file
        holds every upload so far: rewriting it for each of many quick clients would cost
        more than training them again, while a long round (each client's training many
        minutes) keeps each upload."""
        saved_at = time.monotonic()
        for msg in replies:
            yield msg
            if set(self.teachers) != self._saved and time.monotonic() - saved_at >= KEEP_EVERY:
                self.save_uploads(PARTIAL_FILE)
                self._saved = set(self.teachers)
                saved_at = time.monotonic()

    def kept_uploads(self) -> dict[int, Mapping[str, Any]]:
        """The uploads an interrupted clients' round of this run kept (:data:`PARTIAL_FILE`
        in the run folder), in the order they arrived; none if there is no such file, or
        (WARNING, naming it) if it was made with other settings or another sample of clients:
        the round then trains every client and replaces the file."""
        path = self.resources.out_dir / PARTIAL_FILE
        if not path.is_file():
            return {}
        try:
            saved = read_client_models(str(path), self.cfg, self.extra_fingerprint(self.cfg))
            sampled = [int(p) for p in saved.get("sampled", [])]
            arrival = [int(p) for p in saved.get("arrival", [])]
            clients = {int(k): v for k, v in saved["clients"].items()}
        except (ValueError, TypeError, AttributeError) as exc:
            log(WARNING, "%s: %s not used: %s", self.name, path, exc)
            return {}
        if sampled != self.sampled or set(arrival) != set(clients):
            log(
                WARNING,
                "%s: %s not used: it holds the uploads of another sample of clients (%s, "
                "this round: %s)",
                self.name,
                path,
                sampled,
                self.sampled,
            )
            return {}
        return {pid: clients[pid] for pid in arrival}

    def save_uploads(self, name: str | None = None) -> None:
        """``client_models.pt`` (``name``): the uploaded models (and extras) with what made
        them, the clients sampled and the order the uploads arrived in."""
        clients = {}
        for pid in self.pids:
            entry: dict[str, Any] = {
                "size": self.teacher_sizes[pid],
                "state": {k: torch.from_numpy(np.array(v)) for k, v in self.teachers[pid].items()},
            }
            extra = self.extra_uploads(pid)
            if extra is not None:
                entry["extra"] = {k: torch.from_numpy(np.array(v)) for k, v in extra.items()}
            clients[str(pid)] = entry
        atomic_torch_save(
            self.resources.out_dir / (name or UPLOADS_FILE),
            {
                "fingerprint": fingerprint(self.cfg),
                "extra_fingerprint": self.extra_fingerprint(self.cfg),
                "clients": clients,
                "left_out": list(self.left_out),
                "sampled": list(self.sampled),
                "arrival": [p for p in self._arrival if p in self.teachers],
            },
        )

    def reuse_uploads(self, source: str, initial: ArrayRecord) -> dict[str, np.ndarray]:
        """Round 1 from an earlier run's ``client_models.pt`` (checked before the run)."""
        saved = read_client_models(source, self.cfg, self.extra_fingerprint(self.cfg))
        reference = to_numpy(initial)
        self.begin_round(1)
        self.global_arrays = reference
        self.sampled = [int(p) for p in saved["sampled"]]
        self.left_out = [int(p) for p in saved["left_out"]]
        for key, entry in saved["clients"].items():
            if not self.take_saved(int(key), entry, f"{UPLOADS_FILE} in {source}"):
                self.left_out.append(int(key))
        self.finish_uploads()
        self.left_out += [
            p for p in self.sampled if p not in self.teachers and p not in self.left_out
        ]
        if len(self.teachers) < max(self.cfg.min_clients, 1):
            raise ValueError(
                f"{UPLOADS_FILE} in {source}: only {len(self.teachers)} usable client models; "
                f"min_clients is {self.cfg.min_clients}"
            )
        log(INFO, "%s: the uploads of %s reused (clients %s)", self.name, source, self.pids)
        self.last_round = {
            "clients_sampled": len(self.sampled),
            "clients_replied": len(self.teachers),
            "clients_failed": len(self.left_out),
            "uploads_reused": 1,
        }
        return self.average if self.average is not None else reference

    def take_saved(self, pid: int, entry: Mapping[str, Any], source: str) -> bool:
        """Client ``pid``'s saved upload (``entry`` of a ``client_models.pt``), checked as a
        reply is and absorbed; ``ValueError`` naming ``source`` if it does not fit this run's
        model or data, ``False`` (WARNING) if it is no usable teacher."""
        arrays = {k: v.numpy() for k, v in entry["state"].items()}
        problem = check_arrays(arrays, self.client_reference(pid))
        size = int(entry["size"])
        if problem is None and self.client_sizes is not None and size != self.client_sizes[pid]:
            problem = f"size {size}, but the server counts {self.client_sizes[pid]}"
        if problem is not None:
            raise ValueError(f"{source}: client {pid}: {problem}")
        if "extra" in entry:
            self.load_extra_uploads(pid, {k: v.numpy() for k, v in entry["extra"].items()})
        try:
            self.absorb(1, Reply(-1, pid, size, arrays, {}, RecordDict()))
        except ReplyRejected as exc:  # saved before the check existed
            log(WARNING, "%s: leaving out client %d of %s: %s", self.name, pid, source, exc)
            return False
        return True

    def client_reference(self, pid: int) -> dict[str, np.ndarray]:
        """What client ``pid``'s uploaded arrays must look like (keys, shapes, dtypes)."""
        return {k: v.numpy() for k, v in self.client_model(pid).state_dict().items()}

    # -- the loop (Strategy.start) -----------------------------------------------------------
    def plan(self, first_round: int, num_rounds: int) -> str:
        return f"one round, then {self.epochs} server epochs"

    def rows(self, first_round: int, num_rounds: int) -> list[int]:
        """Row 1 (the clients' round) unless resumed after it, then ``1 + e`` for the server
        epochs ``e`` not done yet."""
        first = [1] if first_round == 1 else []
        return first + [1 + e for e in range(self.epochs_done + 1, self.epochs + 1)]

    def row_title(self, row: int, num_rounds: int) -> str | None:
        return "[ROUND 1/1] clients train once" if row == 1 else None

    def run_row(
        self, row: int, grid: Grid, arrays: ArrayRecord, config: ConfigRecord, timeout: float
    ) -> Row:
        """Row 1: the clients' round (:meth:`clients_round`, :meth:`after_clients`); row
        ``1 + e``: server epoch ``e`` (:meth:`server_epoch`). Evaluated every ``eval.every``
        epochs and in the last row."""
        if row == 1:
            initial = to_numpy(arrays)
            self.clients_round(grid, arrays, config, timeout)
            t0 = time.perf_counter()
            state = self.after_clients(initial)
            self.last_round.update(self.ensemble_metrics())
            self.last_round["clients_left_out"] = len(self.left_out)
            self.last_round["server_setup_time"] = time.perf_counter() - t0
            self.finished = self.epochs == 0
            return Row(arrays=to_record(state), due=True, finished=self.finished)
        epoch = row - 1
        state, metrics = self.server_epoch(epoch)
        raise_if_stopping(f"server epoch {epoch}")
        self.epochs_done = epoch
        self.finished = epoch == self.epochs
        self.last_round = {"epoch": epoch, **metrics}
        due = epoch % self.cfg.eval.every == 0 or self.finished
        evaluated = None if due else ArrayRecord()
        return Row(arrays=to_record(state), evaluated=evaluated, due=due, finished=self.finished)

    def row_label(self, row: int) -> str:
        """How the log names a row: the clients' round, or a server epoch."""
        if row <= 1:
            return f"round {row}/1"
        return f"server epoch {row - 1}/{self.epochs}"

    # -- results and resume ----------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "clients_used": self.pids,
            "clients_left_out": self.left_out,
            "server_epochs": self.epochs_done,
        }
        if self.teachers:
            out.update(self.ensemble_metrics())
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "teachers": [
                {"pid": p, "size": self.teacher_sizes[p], "arrays": self.teachers[p]}
                for p in self.pids
            ],
            "left_out": list(self.left_out),
            "average": self.average,
            "epochs_done": self.epochs_done,
            "sampled": list(self.sampled),
        }

    @classmethod
    def final_row(cls, cfg: ExperimentConfig) -> int:
        """Row ``1 + epochs``, the last server epoch's."""
        return 1 + int(getattr(cfg.strategy.params, "epochs", 0))

    def state_problem(self, state: Mapping[str, Any], server_round: int) -> str | None:
        """Each uploaded model is one of a client of this run, shaped as its architecture's
        (its weights unbounded: what an accepted upload holds is bounded by its logits, see
        the module's documentation); the average is ``None`` or a model of ``model.name``."""
        teachers = state.get("teachers", [])
        if not isinstance(teachers, list):
            return "'strategy_state.teachers': not a list"
        for i, t in enumerate(teachers):
            what = f"'strategy_state.teachers[{i}]'"
            pid = t.get("pid") if isinstance(t, Mapping) else None
            if type(pid) is not int or not 0 <= pid < self.cfg.data.num_clients:
                return f"{what}: 'pid' {pid!r} is no client of this run"
            problem = arrays_problem(
                t.get("arrays"), self.client_reference(pid), what, f"client {pid}'s model", None
            )
            if problem:
                return problem
        average = state.get("average")
        if average is not None:
            return self.model_problem(average, "'strategy_state.average'", bound=None)
        return None

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.teachers = {int(t["pid"]): dict(t["arrays"]) for t in state.get("teachers", [])}
        self.teacher_sizes = {int(t["pid"]): int(t["size"]) for t in state.get("teachers", [])}
        self.left_out = [int(p) for p in state.get("left_out", [])]
        self.average = state.get("average")
        self.epochs_done = int(state.get("epochs_done", 0))
        self.sampled = [int(p) for p in state.get("sampled", [])]
        self._modules, self._test_logits, self._member_test = None, None, {}


UPLOADS_FILE = "client_models.pt"
PARTIAL_FILE = "client_models.partial.pt"
"""The uploads of a clients' round so far, until it ends (:meth:`OneShot.keeping_uploads`)."""
KEEP_EVERY = 60.0
"""Seconds between two rewrites of :data:`PARTIAL_FILE`."""
FINGERPRINT_KEYS = ("seed", "fraction", "min_clients", "data", "model", "train", "faults")


def fingerprint(cfg: ExperimentConfig) -> dict[str, Any]:
    """The settings that decide what the clients upload in a one-shot round."""
    full = cfg.to_dict(strategy_params=False)
    return {k: full[k] for k in FINGERPRINT_KEYS}


def read_client_models(
    source: str, cfg: ExperimentConfig, extra: dict[str, Any] | None
) -> dict[str, Any]:
    """An earlier run's ``client_models.pt``, checked against ``cfg`` (``ValueError`` naming the
    file and the settings that differ)."""
    path = Path(source)
    if path.is_dir():
        path = path / UPLOADS_FILE
    if not path.is_file():
        raise ValueError(f"{path} does not exist (a one-shot run writes it after its round)")
    saved = safe_torch_load(path, "uploads file")
    if not isinstance(saved, Mapping) or not {"fingerprint", "clients"} <= set(saved):
        raise ValueError(f"{path} is not a one-shot run's {UPLOADS_FILE}")
    mine = fingerprint(cfg)
    theirs = saved["fingerprint"]
    differ = sorted(k for k in mine if not isinstance(theirs, Mapping) or theirs.get(k) != mine[k])
    if differ:
        raise ValueError(f"{path} was made with other settings: {', '.join(differ)} differ")
    if extra is not None and saved.get("extra_fingerprint") != extra:
        raise ValueError(
            f"{path} holds no uploads made with this strategy's client settings "
            "(e.g. its discriminators' generator and training)"
        )
    return dict(saved)
