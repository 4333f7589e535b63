"""CPFL: cohort-parallel federated learning, unified by distillation.

Dhasade, Kermarrec, Nguyen, Pires, de Vos, "Harnessing Increased Client Participation with
Cohort-Parallel Federated Learning", EuroMLSys 2025 (paper 003, Alg. 1; the authors' code is
github.com/sacs-epfl/cpfl). The K clients are split into ``cohorts`` (n) disjoint cohorts
(Sec. 3, step 1). **Stage 1:** every cohort runs its own federated training (FedAvg by default,
``local_algorithm`` names another averaging client algorithm) on its own model, until its own
stopping rule fires (moving average of its clients' validation losses, patience on the minimum;
:class:`fedgo_flwr.cohorts.PlateauStopper`). All running cohorts advance together: one round of
this strategy sends every running cohort's model to that cohort's sampled clients (``fraction``
of its members; the paper: all of them), so the simulation engine trains them concurrently; a
stopped cohort sends nothing. **Stage 2:** the global server distils the cohorts' models
(each cohort's best checkpoint, lowest smoothed validation loss; ``teacher: last`` for the
last) into a fresh student on unlabeled public data, towards ``z~_c = sum_i p_ic z_ic`` with
per-class label weights, L1 loss on logits, Adam (Sec. 3 eqs. 2-3, Sec. 4.1;
:func:`fedgo_flwr.cohorts.distill_l1`). ``cohorts: 1`` is FedAvg with early stopping and no
distillation (the student is the cohort's teacher); ``cohorts: K`` is one-shot FedKD.

The public set is the server's unlabeled share of the training data (``data.server_fraction``)
or, with ``data.public_path``, a folder of images (the paper: STL-10's unlabeled split for
CIFAR-10). Label counts per cohort (step 3) are the server's count of its clients' training
splits (the partition is derived from the config on both sides, as for n_k everywhere).

**Simulated time, CPU-hours, bytes** (Sec. 4.1/4.2, App. B.4; :mod:`fedgo_flwr.systems`): each
client has a device profile (``profiles``: a CSV, or a seeded synthetic population over the
FedScale ranges). A cohort round lasts its slowest participant's download + local training
(``local_epochs`` x its mini-batches x its seconds per batch) + upload; a cohort's time is the
sum of its rounds; time to convergence is the last cohort's finish (distillation excluded and
reported as measured wall time, ``distill_time_s``); CPU-hours sum every participant's
compute; bytes count the model both ways per participant and round, plus each cohort's model
and label counts uploaded to the global server once. A cohort of one client trains locally
without transfers (it is its own cohort server: "at n=200 the only traffic is uploading each
client's model to the global server", App. B.4). Clients that fail a round still count (they
were sent work).

**Beyond the paper** (its future-work suggestion, Sec. 5): ``distill_when: q`` starts stage 2
once a fraction q of the cohorts has converged, at simulated time T_q (the time the
ceil(q n)-th cohort finished), every other cohort taking part with its best model as of T_q;
``distill_at_hours: T`` distils whatever the cohorts hold at simulated time T (the paper's
fixed-time comparison, Sec. 4.2). A cohort never starts a round that would end after the
distillation time.

**Untrusted members** (beyond the paper). A member's ``val_loss`` must be a finite number
``>= 0`` (and be absent for a client without a validation split), else its reply is dropped
with a warning; the round's signal is the paper's mean of the members' losses after leaving
out any above ``loss_bound`` x the round's median (``loss_reduce``: also ``median`` or
``trimmed_mean``; :func:`fedgo_flwr.cohorts.cohort_loss`), so that one member of a cohort of
three or more can neither stop nor stall it with an extreme loss.

**Failures.** A cohort whose clients all fail in a round keeps its model (the round counts as
one without improvement); a cohort that never got a usable reply is reported and left out of
distillation, and the run finishes with the others.

Per round ``metrics.jsonl`` has, besides the usual counts, ``sim_hours`` (the furthest cohort
clock), ``cpu_hours``, ``bytes_total``, ``cohorts_running`` and ``cohorts``: per cohort that
trained, its clock, raw and smoothed validation loss, status and (every ``cohort_eval_every``
rounds, n > 1) test accuracy. The top-level ``test_accuracy`` is the model's for n = 1 and the
student's in the last round (stage 1 of n > 1 has no single model). ``summary.json`` adds
:meth:`CPFL.report`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from fedgo_flwr import messages as msgs
from fedgo_flwr.aggregation import clip_update, new_average
from fedgo_flwr.cohorts import (
    GROUPINGS,
    LOSS_BOUND,
    LOSS_REDUCES,
    CohortDistillConfig,
    PlateauStopper,
    batches_per_epoch,
    class_cohorts,
    cohort_loss,
    cohort_odds_weights,
    combine_per_sample,
    combine_teachers,
    distill_l1,
    holdout_size,
    holdout_split,
    mean_sd,
    random_cohorts,
    teacher_outputs,
    teacher_weights,
)
from fedgo_flwr.config import ExperimentConfig
from fedgo_flwr.data import ArrayDataset, stratified_subset
from fedgo_flwr.fileio import strict_json
from fedgo_flwr.gan import discriminator_logits
from fedgo_flwr.gan.settings import DiscriminatorConfig, GeneratorConfig
from fedgo_flwr.messages import stream_replies, to_numpy, to_record
from fedgo_flwr.protocol import ReplySpec
from fedgo_flwr.protocol.cpfl import CohortClientConfig, local_declaration, member_reply
from fedgo_flwr.rng import derive_seed, make_rng
from fedgo_flwr.schema import Checker, build_section
from fedgo_flwr.shutdown import raise_if_stopping
from fedgo_flwr.systems import (
    DeviceProfile,
    ProfileError,
    SimClock,
    load_profiles,
    round_seconds,
    synthetic_profiles,
)
from fedgo_flwr.task import load_bundle, sample_clients
from fedgo_flwr.training import predict_logits
from fedgo_flwr.weighting import WeightingInputs, compute_weights
from strategies._prefl import DiscriminatorStage, discriminator_stats
from strategies.base import BaseConfig, Reply, ReplyRejected, Row, Strategy, client_metrics

RUNNING, CONVERGED, PAUSED, MAX_ROUNDS, EMPTY = (
    "running",
    "converged",
    "paused",
    "max_rounds",
    "empty",
)
TEACHERS = ("best", "last")


@dataclass
class CPFLConfig(BaseConfig, CohortClientConfig):
    """CPFL's parameters, ``strategy.<key>`` (defaults: the paper's CIFAR-10 setting, Sec. 4.1).

    ``fraction`` (core) is each cohort's participation rate per round (paper: 1.0) and
    ``rounds`` (core) the most rounds a cohort may run. ``loss_reduce`` and ``loss_bound``
    make a round's validation signal out of the members' losses (beyond the paper: the paper's
    mean, each loss above ``loss_bound`` x the round's median left out; null: no bound;
    :func:`fedgo_flwr.cohorts.cohort_loss`).
    """

    cohorts: int = 4
    grouping: str = "random"
    window: int = 20
    patience: int = 50
    loss_reduce: str = "mean"
    loss_bound: float | None = LOSS_BOUND
    teacher: str = "best"
    distill_when: float = 1.0
    distill_at_hours: float | None = None
    cohort_eval_every: int = 1
    teacher_test_size: int | None = None
    profiles: str | None = None
    distill: CohortDistillConfig = field(default_factory=CohortDistillConfig)
    # distill.weights: fedgo (beyond the paper): FedGO's generator and client discriminators
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    discriminator: DiscriminatorConfig = field(default_factory=DiscriminatorConfig)

    def check(self, c: Checker) -> None:
        CohortClientConfig.check(self, c)
        c.require("cohorts", self.cohorts >= 1, "must be >= 1")
        c.choice("grouping", GROUPINGS)
        c.require("window", self.window >= 1, "must be >= 1")
        c.require("patience", self.patience >= 1, "must be >= 1")
        c.choice("loss_reduce", LOSS_REDUCES)
        if self.loss_bound is not None:
            c.require("loss_bound", self.loss_bound > 1, "must be > 1 (or null: no bound)")
        c.choice("teacher", TEACHERS)
        c.require("distill_when", 0 < self.distill_when <= 1, "must be in (0, 1]")
        if self.distill_at_hours is not None:
            c.require("distill_at_hours", self.distill_at_hours > 0, "must be > 0 (or null)")
        c.require("cohort_eval_every", self.cohort_eval_every >= 0, "must be >= 0 (0: never)")
        if self.teacher_test_size is not None:
            c.require("teacher_test_size", self.teacher_test_size >= 1, "must be >= 1 (or null)")
        try:
            local = local_declaration(self.local_algorithm)
        except ValueError as exc:
            c.fail("local_algorithm", str(exc))
        self.local_params = dataclasses.asdict(
            build_section(
                local.Config,
                self.local_params,
                f"{c.prefix}local_params.",
                owner=local.name,
                checker=c,
            )
        )


@dataclass
class Cohort:
    """One cohort's federated training: its members, model, stopping rule and clock."""

    index: int
    members: list[int]
    counts: np.ndarray  # (C,) training samples per class over its members
    arrays: dict[str, np.ndarray]
    stopper: PlateauStopper
    clock: SimClock = field(default_factory=SimClock)
    best: dict[str, np.ndarray] | None = None  # the model with the lowest smoothed val loss
    best_round: int | None = None  # that model is the one sent in this round
    status: str = RUNNING
    rounds: int = 0
    updates: int = 0  # usable replies over the run
    finish_seconds: float | None = None
    # (clock, cpu seconds, bytes down, bytes up) after each round: the totals at a deadline
    trace: list[tuple[float, float, int, int]] = field(default_factory=list)
    # distill_when < 1: (simulated time it became known, model) of the teacher as it changed
    history: list[tuple[float, dict[str, np.ndarray]]] = field(default_factory=list)

    def teacher(self, which: str) -> dict[str, np.ndarray]:
        return self.best if which == "best" and self.best is not None else self.arrays

    @property
    def running(self) -> bool:
        return self.status == RUNNING


class CPFL(DiscriminatorStage, Strategy):
    """Cohorts trained in parallel to convergence, then distilled into one model (Alg. 1)."""

    name = "cpfl"
    client_algorithm = "cpfl"
    Config = CPFLConfig
    uses_public_data = True

    @classmethod
    def check_config(cls, config: Any, c: Checker, cfg: ExperimentConfig | None = None) -> None:
        super().check_config(config, c, cfg)
        if cfg is not None:
            k = cfg.data.num_clients
            c.require(
                "cohorts",
                config.cohorts <= k,
                f"more cohorts than clients (data.num_clients = {k})",
            )

    @classmethod
    def preflight(cls, cfg: ExperimentConfig, c: Checker) -> None:
        super().preflight(cfg, c)  # DiscriminatorStage's: strategy.generator.module
        p: CPFLConfig = cfg.strategy.params
        s = c.at("strategy.", p)
        if p.profiles is not None:
            try:
                load_profiles(p.profiles, cfg.data.num_clients)
            except ProfileError as exc:
                s.fail("profiles", str(exc))
        if p.grouping == "class":
            classes = load_bundle(cfg.data).train.num_classes
            s.require(
                "cohorts",
                p.cohorts == classes,
                f"grouping 'class' makes one cohort per class: set it to {classes}",
            )
        if p.cohorts > 1 and cfg.data.public_path is None:
            c.at("data.", cfg.data).require(
                "server_fraction",
                cfg.data.server_fraction > 0,
                "CPFL with more than one cohort distils on the server's unlabeled share: "
                "make it > 0, or set data.public_path",
            )

    def __init__(self, cfg: ExperimentConfig, node_ids, model, resources=None) -> None:
        super().__init__(cfg, node_ids, model, resources)
        p: CPFLConfig = self.params
        k = cfg.data.num_clients
        if resources is None:
            raise ValueError("CPFL needs the server's resources (data, partition)")
        part, train = resources.partition, resources.bundle.train
        # n_k and the clock use each client's training split (its data less the validation part).
        self.client_sizes = [
            size - holdout_size(size, p.val_fraction, p.min_val_samples)
            for size in part.client_sizes
        ]
        hist = part.histogram(train.y, train.num_classes).astype(np.int64)
        self.num_classes = train.num_classes
        # Label counts of each client's training split (what its cohort reports, step 3).
        self.class_counts = np.zeros_like(hist)
        for pid, idx in enumerate(part.clients):
            kept, _ = holdout_split(len(idx), p.val_fraction, p.min_val_samples, cfg.seed, pid)
            self.class_counts[pid] = np.bincount(train.y[idx[kept]], minlength=self.num_classes)
        if p.grouping == "class":  # one cohort per class (preflight checked the count)
            groups = class_cohorts(hist)
        else:
            groups = random_cohorts(k, p.cohorts, cfg.seed)
        self.groups = groups
        self.cohort_of = {pid: i for i, g in enumerate(groups) for pid in g}
        self.profiles: list[DeviceProfile] = (
            load_profiles(p.profiles, k)
            if p.profiles is not None
            else synthetic_profiles(k, derive_seed(cfg.seed, "cpfl-profiles") % 2**32)
        )
        self.cohorts: list[Cohort] = []
        self.finished = False
        self.final: dict[str, Any] = {}
        self.model_bytes = 0
        self.upload_clock = SimClock()  # cohort models and label counts to the global server
        self.discriminators: dict[int, torch.nn.Module] = {}  # distill.weights: fedgo

    # -- FedGO-weighted distillation (distill.weights: fedgo) --------------------------------
    def setup(self, grid: Grid) -> None:
        """With ``distill.weights: fedgo``, FedGO's pre-FL stage before round 1: a generator
        (trained on the public set, or loaded) and every client's discriminator, trained once
        (:class:`strategies._prefl.DiscriminatorStage`); ``prefl.json`` reports it."""
        if self.params.distill.weights != "fedgo" or len(self.groups) == 1:
            return  # one cohort is not distilled
        generator, disc_path, report = self.obtain_generator(grid)
        self.discriminators, disc_report = self._discriminators(grid, generator, disc_path)
        report.update(disc_report)
        name = "prefl-resume.json" if self.resuming else "prefl.json"
        text = strict_json(report, name=name, indent=2, default=float)
        (self.resources.out_dir / name).write_text(text)

    def generator_data(self) -> ArrayDataset:
        """The generator learns the public set: FedGO's odds compare clients to it."""
        return self.public_set()

    def odds_weights(self, included: list[Cohort], data: ArrayDataset) -> torch.Tensor:
        """``(n, N)`` FedGO weights of the included cohorts on ``data``
        (:func:`fedgo_flwr.cohorts.cohort_odds_weights`); a client without a discriminator
        has the neutral logit 0."""
        members = [k for c in included for k in c.members]
        logits = discriminator_logits(
            {k: d for k, d in self.discriminators.items() if k in members},
            data,
            num_clients=self.cfg.data.num_clients,
            device=self.resources.device,
        )[members, 0]
        inputs = WeightingInputs(
            logits=torch.zeros(len(members), len(data), 1),
            num_examples=torch.tensor([float(self.client_sizes[k]) for k in members]),
            disc_logits=logits,
        )
        weights = compute_weights("fedgo", inputs, disc_mode=self.params.distill.disc_mode)
        self.disc_report = discriminator_stats(logits)
        position = {k: i for i, k in enumerate(members)}
        return cohort_odds_weights(weights, [[position[k] for k in c.members] for c in included])

    def summary(self) -> None:
        sizes = [len(g) for g in self.groups]
        log(INFO, "\t├──> CPFL, params %s", self.params)
        log(
            INFO,
            "\t└──> %d cohorts (%s) of %s clients; %.0f%% participation per cohort round",
            len(self.groups),
            self.params.grouping,
            f"{min(sizes)}-{max(sizes)}" if min(sizes) != max(sizes) else sizes[0],
            100 * self.cfg.fraction,
        )

    # -- state -----------------------------------------------------------------------------
    def _new_cohorts(self, arrays: dict[str, np.ndarray]) -> None:
        p: CPFLConfig = self.params
        self.model_bytes = int(sum(a.nbytes for a in arrays.values()))
        self.cohorts = []
        for i, members in enumerate(self.groups):
            counts = (
                self.class_counts[members].sum(axis=0)
                if members
                else np.zeros(self.num_classes, dtype=np.int64)
            )
            c = Cohort(
                index=i,
                members=list(members),
                counts=counts,
                arrays=arrays,
                stopper=PlateauStopper(p.window, p.patience),
            )
            if not members:
                c.status = EMPTY
                log(WARNING, "CPFL: cohort %d has no clients; it is left out", i)
            if p.distill_when < 1:
                c.history.append((0.0, arrays))
            self.cohorts.append(c)

    def state_dict(self) -> dict[str, Any]:
        return {
            "cohorts": [
                {
                    "arrays": c.arrays,
                    "best": c.best,
                    "best_round": c.best_round,
                    "status": c.status,
                    "rounds": c.rounds,
                    "updates": c.updates,
                    "finish_seconds": c.finish_seconds,
                    "stopper": c.stopper.state(),
                    "clock": c.clock.state(),
                    "history": [[t, a] for t, a in c.history],
                    "trace": [list(t) for t in c.trace],
                }
                for c in self.cohorts
            ],
            "finished": self.finished,
            "final": self.final,
            "model_bytes": self.model_bytes,
            "upload_clock": self.upload_clock.state(),
        }

    def load_state_dict(self, state) -> None:
        saved = state["cohorts"]
        if len(saved) != len(self.groups):
            raise ValueError(f"checkpoint has {len(saved)} cohorts, the config {len(self.groups)}")
        self._new_cohorts({})
        for c, s in zip(self.cohorts, saved, strict=True):
            c.arrays = dict(s["arrays"])
            c.best = None if s["best"] is None else dict(s["best"])
            c.best_round = s["best_round"]
            c.status = str(s["status"])
            c.rounds = int(s["rounds"])
            c.updates = int(s["updates"])
            c.finish_seconds = s["finish_seconds"]
            c.stopper = PlateauStopper.from_state(s["stopper"])
            c.clock = SimClock.from_state(s["clock"])
            c.history = [(float(t), dict(a)) for t, a in s["history"]]
            c.trace = [(float(a), float(b), int(d), int(u)) for a, b, d, u in s["trace"]]
        self.finished = bool(state["finished"])
        self.final = dict(state["final"])
        self.model_bytes = int(state["model_bytes"])
        self.upload_clock = SimClock.from_state(state["upload_clock"])

    # -- the round loop (Strategy.start) -----------------------------------------------------
    def plan(self, first_round: int, num_rounds: int) -> str:
        return f"rounds {first_round}..{num_rounds} at most"

    def begin_run(self, initial_arrays: ArrayRecord) -> bool:
        """The cohorts of a fresh run (a resumed one loaded its own); nothing to do if the run
        was resumed after stage 2 (its student is the checkpoint's model)."""
        if not self.cohorts:
            self._new_cohorts(to_numpy(initial_arrays))
        return not self.finished

    def run_row(
        self, row: int, grid: Grid, arrays: ArrayRecord, config: ConfigRecord, timeout: float
    ) -> Row:
        """Stage 1: one round of every running cohort; stage 2 once every cohort has stopped
        (or in round ``rounds``). The row's model is the student after stage 2, the cohort's
        for one cohort, none before (the checkpoint keeps the initial model then)."""
        messages = self.configure_cohorts(row, config)
        if messages:
            self.aggregate_cohorts(row, stream_replies(grid, messages, timeout))
        else:
            self.last_round = {"clients_sampled": 0, "clients_replied": 0}
        raise_if_stopping(f"round {row}")
        if row == self.num_rounds:
            for c in self.cohorts:
                if c.running:
                    c.status = MAX_ROUNDS
                    c.finish_seconds = c.clock.seconds
        if not any(c.running for c in self.cohorts):
            return Row(arrays=to_record(self.stage_two(row)))
        if len(self.cohorts) == 1:
            model = to_record(self.cohorts[0].arrays)
            return Row(evaluated=model, checkpoint=model)
        return Row(evaluated=ArrayRecord())

    # -- stage 1 ---------------------------------------------------------------------------
    def participants(self, server_round: int, cohort: Cohort) -> list[int]:
        """The cohort's clients trained in ``server_round``: ``fraction`` of its members
        (at least ``min_clients``), a seeded draw per (seed, cohort, round)."""
        members = cohort.members
        m = max(self.cfg.min_clients, int(self.cfg.fraction * len(members) + 1e-9))
        if m >= len(members):
            return list(members)
        seed = derive_seed(self.cfg.seed, "cpfl-cohort", cohort.index)
        picks = sample_clients(seed, server_round, len(members), m)
        return [members[i] for i in picks]

    def round_cost(
        self, cohort: Cohort, pids: list[int]
    ) -> tuple[list[DeviceProfile], list[int], int]:
        """Profiles, mini-batches and bytes each way of each participant of a cohort round."""
        t = self.cfg.train
        batches = [
            t.local_epochs * batches_per_epoch(self.client_sizes[p], t.batch_size) for p in pids
        ]
        transfer = 0 if len(cohort.members) == 1 else self.model_bytes
        return [self.profiles[p] for p in pids], batches, transfer

    def deadline(self) -> float | None:
        """The simulated time stage 2 starts at, as far as known (``None``: not yet)."""
        p: CPFLConfig = self.params
        limits = []
        if p.distill_at_hours is not None:
            limits.append(p.distill_at_hours * 3600.0)
        if p.distill_when < 1:
            live = [c for c in self.cohorts if c.status != EMPTY]
            needed = max(1, math.ceil(p.distill_when * len(live) - 1e-9))
            done = sorted(c.finish_seconds for c in live if c.status == CONVERGED)
            if len(done) >= needed:
                limits.append(done[needed - 1])
        return min(limits) if limits else None

    def configure_cohorts(self, server_round: int, config: ConfigRecord) -> list[Message]:
        config = self.message_config(server_round, config)
        deadline = self.deadline()
        messages: list[Message] = []
        self.sampled, self.round_plan = [], {}
        for c in self.cohorts:
            if not c.running:
                continue
            pids = self.participants(server_round, c)
            profiles, batches, transfer = self.round_cost(c, pids)
            duration = round_seconds(profiles, batches, transfer, transfer)
            if deadline is not None and c.clock.seconds + duration > deadline + 1e-9:
                c.status, c.finish_seconds = PAUSED, c.clock.seconds
                log(
                    INFO,
                    "CPFL: cohort %d paused at %.2f h (distillation time)",
                    c.index,
                    c.clock.hours,
                )
                continue
            record = RecordDict({msgs.ARRAYS: to_record(c.arrays), msgs.CONFIG: config})
            messages += self.messages_to(record, pids, MessageType.TRAIN)
            self.sampled += pids
            self.round_plan[c.index] = pids
        self.open_round(sorted(self.sampled))
        if self.cohorts:
            self.global_arrays = self.cohorts[0].arrays  # keys, shapes, dtypes of every reply
        log(INFO, "configure_train: %d cohorts, clients %s", len(self.round_plan), self.sampled)
        return messages

    def reply_spec(self) -> ReplySpec:
        """A cohort member's reply: its local algorithm's, with the validation report."""
        return member_reply(self.params.local_algorithm)

    def val_problem(self, reply: Reply) -> str | None:
        """Why a reply's validation report is unusable: a client with a validation split must
        report a finite ``val_loss >= 0`` (a number, not a bool) and its split's size; a client
        without one must send no ``val_loss``.

        A client without a split that sends a ``val_loss`` has its whole reply dropped, not the
        loss ignored: an honest client derives its split from the same config and seed as the
        server (``clients/cpfl.py`` reports a loss only with a split), so the reply is off the
        protocol, as one with a wrong ``val_examples`` is (dropped too), and its model update
        comes from a client known to misreport.
        """
        p: CPFLConfig = self.params
        size = self.resources.partition.client_sizes[reply.partition_id]
        expected = holdout_size(size, p.val_fraction, p.min_val_samples)
        if not expected:
            if "val_loss" in reply.metrics:
                return "metric 'val_loss' sent, but the client has no validation split"
            return None
        loss, count = reply.metrics.get("val_loss"), reply.metrics.get("val_examples")
        if (
            isinstance(loss, bool)
            or not isinstance(loss, (int, float))
            or not math.isfinite(loss)
            or loss < 0
        ):
            return f"metric 'val_loss' is {loss!r}, not a finite number >= 0"
        if count != expected:
            return f"val_examples {count!r}, but the client's validation split has {expected}"
        return None

    def sent_arrays(self, pid: int) -> dict[str, np.ndarray]:
        """A member is sent its cohort's model: its update is bounded against that."""
        return self.cohorts[self.cohort_of[pid]].arrays

    def begin_round(self, server_round: int) -> None:
        """Reset what :meth:`absorb` accumulates: per running cohort, its average and its
        members' validation losses."""
        self.averages = {i: new_average(self.aggregation) for i in self.round_plan}
        self.losses: dict[int, list[tuple[int, float]]] = {i: [] for i in self.round_plan}

    def absorb(self, server_round: int, reply: Reply) -> None:
        """Fold a member's reply into its cohort's average (its update clipped to
        ``aggregation.clip_norm`` against the cohort's model) and keep its validation loss; a
        reply whose validation report is unusable (:meth:`val_problem`) is dropped."""
        problem = self.val_problem(reply)
        if problem is not None:
            raise ReplyRejected(problem)
        c = self.cohorts[self.cohort_of[reply.partition_id]]
        arrays = reply.arrays
        if self.aggregation.clip_norm is not None:
            arrays, _ = clip_update(arrays, c.arrays, self.aggregation.clip_norm)
        self.averages[c.index].add(arrays, reply.num_examples)
        if "val_loss" in reply.metrics:
            self.losses[c.index].append((reply.partition_id, float(reply.metrics["val_loss"])))

    def aggregate_cohorts(self, server_round: int, replies: Iterable[Message]) -> None:
        p: CPFLConfig = self.params
        active = [self.cohorts[i] for i in self.round_plan]
        self.begin_round(server_round)
        all_replies, _ = self.collect(server_round, replies)
        averages, losses = self.averages, self.losses
        accepted: dict[int, list[Reply]] = {c.index: [] for c in active}
        for reply in all_replies:
            accepted[self.cohort_of[reply.partition_id]].append(reply)
        rows = []
        for c in active:
            pids = self.round_plan[c.index]
            profiles, batches, transfer = self.round_cost(c, pids)
            seconds = c.clock.add_round(profiles, batches, transfer, transfer)
            k = c.clock
            c.trace.append((k.seconds, k.cpu_seconds, k.bytes_down, k.bytes_up))
            c.rounds += 1
            got = accepted[c.index]
            sent = c.arrays
            if len(got) >= min(self.cfg.min_clients, len(pids)) and got:
                c.arrays = averages[c.index].result()
                c.updates += len(got)
            else:
                log(
                    WARNING,
                    "Round %d: cohort %d has no usable reply; it keeps its model",
                    server_round,
                    c.index,
                )
            reported = losses[c.index]
            val, left_out = cohort_loss([v for _, v in reported], p.loss_reduce, p.loss_bound)
            if left_out:
                log(
                    WARNING,
                    "Round %d: cohort %d leaves out the validation loss of client(s) %s: "
                    "above strategy.loss_bound (%g) x the round's median",
                    server_round,
                    c.index,
                    ", ".join(str(reported[i][0]) for i in left_out),
                    p.loss_bound,
                )
            if c.stopper.observe(val):
                c.best, c.best_round = sent, server_round
                if p.teacher == "best" and p.distill_when < 1:
                    c.history.append((c.clock.seconds, sent))
            if p.teacher == "last" and p.distill_when < 1:
                c.history.append((c.clock.seconds, c.arrays))
            if c.stopper.stopped:
                c.status, c.finish_seconds = CONVERGED, c.clock.seconds
                log(
                    INFO,
                    "CPFL: cohort %d converged in round %d at %.2f simulated hours",
                    c.index,
                    server_round,
                    c.clock.hours,
                )
            rows.append(
                {
                    "cohort": c.index,
                    "clients_sampled": len(pids),
                    "clients_replied": len(got),
                    "val_loss": val,
                    "val_loss_smoothed": c.stopper.smoothed,
                    "round_seconds": seconds,
                    "sim_hours": c.clock.hours,
                    "status": c.status,
                }
            )
        self._prune_history()
        accuracy = self.evaluate_cohorts(server_round, rows)
        total = self.totals()
        self.last_round = {
            "clients_sampled": len(self.sampled),
            "clients_replied": len(all_replies),
            "clients_failed": self.intake.failed,
            "cohorts_running": sum(c.running for c in self.cohorts),
            "sim_hours": total.hours,
            "cpu_hours": total.cpu_hours,
            "bytes_total": total.bytes_total,
            "cohorts": rows,
        }
        if accuracy is not None:
            self.last_round["cohort_accuracy_mean"] = accuracy
        if all_replies:
            self.last_round.update(client_metrics(all_replies))

    def _prune_history(self) -> None:
        """Drop teacher snapshots that can no longer be the one at the distillation time."""
        p: CPFLConfig = self.params
        if p.distill_when >= 1:
            return
        live = [c for c in self.cohorts if c.status != EMPTY]
        needed = max(1, math.ceil(p.distill_when * len(live) - 1e-9))
        # T_q is at least the needed-th smallest of (finish time, or clock if still running).
        bound = sorted(
            c.finish_seconds if c.finish_seconds is not None else c.clock.seconds for c in live
        )[needed - 1]
        for c in live:
            while len(c.history) > 1 and c.history[1][0] <= bound:
                c.history.pop(0)

    def evaluate_cohorts(self, server_round: int, rows: list[dict]) -> float | None:
        """Test accuracy of the models of the cohorts in ``rows`` (every
        ``cohort_eval_every`` rounds, n > 1); their mean, or ``None``."""
        every = self.params.cohort_eval_every
        if len(self.cohorts) == 1 or not every or server_round % every or not rows:
            return None
        for row in rows:
            row["test_accuracy"] = self._accuracy(self.cohorts[row["cohort"]].arrays)
        return float(np.mean([row["test_accuracy"] for row in rows]))

    def _accuracy(self, arrays: dict[str, np.ndarray]) -> float:
        logits = self._test_logits(arrays)
        labels = torch.as_tensor(self.resources.bundle.test.y)
        return float((logits.argmax(1) == labels).float().mean())

    def _test_logits(
        self, arrays: dict[str, np.ndarray], data: ArrayDataset | None = None
    ) -> torch.Tensor:
        model = self.model_factory()
        model.load_state_dict(to_record(arrays).to_torch_state_dict())
        data = self.resources.bundle.test if data is None else data
        return predict_logits(model, data, self.cfg.eval.batch_size, self.resources.device)

    def teacher_test_set(self) -> ArrayDataset:
        """Where the teachers and their ensemble are evaluated: the test split, or a
        stratified ``teacher_test_size`` of it (200 teachers x 10,000 images is most of
        stage 2 on a CPU; the student is always evaluated on the whole split)."""
        test = self.resources.bundle.test
        size = self.params.teacher_test_size
        if size is None or size >= len(test):
            return test
        return test.subset(stratified_subset(test.y, size))

    def totals(self) -> SimClock:
        """The cohorts side by side (time: the furthest clock) plus the uploads to the server.

        Once a deadline applies (``distill_when`` < 1, ``distill_at_hours``), each cohort counts
        as of it: rounds that ended after it (run before it was known) are not counted.
        """
        live = [c for c in self.cohorts if c.status != EMPTY]
        deadline = self.deadline()
        clocks = []
        for c in live:
            if deadline is None:
                clocks.append(c.clock)
                continue
            done = [t for t in c.trace if t[0] <= deadline + 1e-9]
            s, cpu, down, up = done[-1] if done else (0.0, 0.0, 0, 0)
            clocks.append(SimClock(s, cpu, down, up, len(done)))
        total = SimClock.parallel(clocks)
        total.add_bytes(self.upload_clock.bytes_down, self.upload_clock.bytes_up)
        return total

    # -- stage 2 ---------------------------------------------------------------------------
    def distill_time(self) -> float:
        """The simulated time stage 2 starts: the deadline if one applied, else the last
        cohort's finish."""
        live = [c for c in self.cohorts if c.status != EMPTY]
        end = max((c.finish_seconds or c.clock.seconds for c in live), default=0.0)
        deadline = self.deadline()
        return end if deadline is None else min(deadline, end)

    def teacher_of(self, c: Cohort, at: float) -> dict[str, np.ndarray]:
        if self.params.distill_when < 1:
            known = [a for t, a in c.history if t <= at + 1e-9]
            return known[-1] if known else c.history[0][1]
        return c.teacher(self.params.teacher)

    def public_set(self) -> ArrayDataset:
        """The unlabeled public data: ``data.public_path`` if set, else the server's share."""
        return self.server_unlabeled()

    def stage_two(self, server_round: int) -> dict[str, np.ndarray]:
        """Distil the cohorts' teachers into a fresh student (Alg. 1 lines 9-15)."""
        p: CPFLConfig = self.params
        at = self.distill_time()
        live = [c for c in self.cohorts if c.status != EMPTY]
        included = [c for c in live if c.updates > 0]
        for c in live:
            if c.updates == 0:
                log(
                    WARNING,
                    "CPFL: cohort %d (clients %s) never got a usable reply; it is "
                    "left out of distillation",
                    c.index,
                    c.members,
                )
        teachers = [self.teacher_of(c, at) for c in included]
        t0 = time.perf_counter()
        self.finished = True
        report: dict[str, Any] = {
            "distill_at_h": at / 3600.0,
            "cohorts_distilled": [c.index for c in included],
            "cohorts_left_out": [c.index for c in self.cohorts if c not in included],
        }
        if not included:
            log(WARNING, "CPFL: no cohort has a trained model; the result is the initial model")
            student = self.model_arrays()
            self.final = {**report, "distill_time_s": 0.0}
            return student
        test = self.teacher_test_set()
        test_logits = torch.stack([self._test_logits(t, test) for t in teachers])
        labels = torch.as_tensor(test.y)
        teacher_accs = [float((lg.argmax(1) == labels).float().mean()) for lg in test_logits]
        # The ensemble is the distillation target on the test images: the same outputs.
        outputs = teacher_outputs(test_logits, p.distill.outputs)
        per_sample = p.distill.weights == "fedgo"
        if per_sample:
            ensemble = combine_per_sample(outputs, self.odds_weights(included, test))
        else:
            counts = np.stack([c.counts for c in included])
            weights = teacher_weights(counts, p.distill.weights)
            ensemble = combine_teachers(outputs, weights)
        report.update(
            teacher_accuracies=teacher_accs,
            ensemble_accuracy=float((ensemble.argmax(1) == labels).float().mean()),
        )
        if len(self.cohorts) == 1:  # FedAvg with early stopping: no distillation
            self.final = {**report, "distill_time_s": 0.0}
            return teachers[0]
        # Each cohort's model and label counts go to the global server once (step 3).
        self.upload_clock.add_bytes(up=len(included) * (self.model_bytes + 8 * self.num_classes))
        public = self.public_set()
        model = self.model_factory()
        logits = []
        for t in teachers:
            model.load_state_dict(to_record(t).to_torch_state_dict())
            out = predict_logits(model, public, p.distill.teacher_batch_size, self.resources.device)
            logits.append(teacher_outputs(out, p.distill.outputs))
        if per_sample:
            targets = combine_per_sample(torch.stack(logits), self.odds_weights(included, public))
            report["disc_stats_public"] = self.disc_report
        else:
            targets = combine_teachers(torch.stack(logits), weights)
        del logits
        student = self.model_factory()  # a fresh model (the common initial weights)
        result = distill_l1(
            student,
            public,
            targets,
            p.distill,
            rng=make_rng(self.cfg.seed, "cpfl-distill"),
            device=self.resources.device,
        )
        student.cpu()
        self.final = {
            **report,
            "public_size": len(public),
            "distill_loss": result.loss,
            "distill_epoch_losses": result.epoch_losses,
            "distill_steps": result.steps,
            "distill_time_s": time.perf_counter() - t0,
        }
        log(
            INFO,
            "CPFL: distilled %d teachers on %d public samples in %.1fs (L1 %.4f)",
            len(teachers),
            len(public),
            self.final["distill_time_s"],
            result.loss,
        )
        return {k: v.detach().numpy() for k, v in student.state_dict().items()}

    def model_arrays(self) -> dict[str, np.ndarray]:
        return {k: v.detach().numpy() for k, v in self.model_factory().state_dict().items()}

    def report(self) -> dict[str, Any]:
        """CPFL's part of ``summary.json``: simulated time, CPU-hours, bytes, per-cohort
        finish times and rounds, teacher and student accuracy."""
        total = self.totals()
        accs = self.final.get("teacher_accuracies", [])
        mean, sd = mean_sd(accs)
        return {
            "cohorts": len(self.cohorts),
            "sim_time_to_convergence_h": self.distill_time() / 3600.0,
            "cpu_hours": total.cpu_hours,
            "bytes_total": total.bytes_total,
            "bytes_down": total.bytes_down,
            "bytes_up": total.bytes_up,
            "model_bytes": self.model_bytes,
            "cohort_sizes": [len(c.members) for c in self.cohorts],
            "cohort_finish_h": [
                None if c.finish_seconds is None else c.finish_seconds / 3600.0
                for c in self.cohorts
            ],
            "cohort_rounds": [c.rounds for c in self.cohorts],
            "cohort_status": [c.status for c in self.cohorts],
            "cohort_best_round": [c.best_round for c in self.cohorts],
            "teacher_accuracy_mean": mean,
            "teacher_accuracy_sd": sd,
            **self.final,
        }
