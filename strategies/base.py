"""The base of every fedgo-flwr strategy: the round loop, reply checks and the server's resources.

:class:`Strategy` subclasses Flower's abstract ``flwr.serverapp.strategy.Strategy`` (nothing of
Flower's ``FedAvg`` is used) and adds seeded client sampling over partition ids
(:func:`fedgo_flwr.learning.task.sample_clients`: every strategy trains the same clients in the
same round), messages that carry the experiment and the client algorithm's parameters
(:mod:`fedgo_flwr.runtime.messages`), replies folded in one at a time as they arrive
(:meth:`Strategy.absorb`: the server's memory does not grow with the number of clients),
centralised evaluation and a resumable round loop (:meth:`Strategy.start`).

Every reply is checked by the round's intake (:class:`fedgo_flwr.protocol.RoundIntake`) against
the client algorithm's declared reply (:meth:`Strategy.reply_spec`) and the server's templates of
its arrays (:meth:`Strategy.reply_templates`) before any strategy code sees it; a bad reply is
logged naming the client and dropped, and the round goes on if at least ``min_clients`` replied.
Nothing a client sends can raise out of the checks. **n_k is the server's count** of the
client's partition, never the client's claim (a strategy built without
:class:`ServerResources`, in unit tests, takes the claim: a whole number in ``[1, 2**53]``).

The default aggregation is FedAvg's n_k-weighted average (McMahan et al., AISTATS 2017, Alg. 1),
under ``strategy.aggregation`` (median, trimmed mean, update clipping) for every ``Config`` that
extends :class:`BaseConfig`. Clients of other architectures (``model.client_models``) are
accepted only by a strategy that sets :attr:`Strategy.supports_heterogeneous_models`.

**How it reads.** :meth:`Strategy.start` is the whole run, as Flower's own: per row, sample and
send, take the replies and aggregate, undo a broken row, evaluate and record, checkpoint. The jobs
it delegates are parts the strategy owns (``self.outbox``, ``self.intake``, ``self.averager``,
``self.architectures``, ``self.rollback``), each in a private module of this package; what a
strategy varies are the hook methods below, each with its docstring. ``docs/architecture.md``
("The base strategy") lists the checks, the parts and the hooks in full.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from logging import INFO, WARNING
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from flwr.serverapp.strategy import Strategy as FlowerStrategy
from flwr.supercore import log
from torch import nn

from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.config.schema import Checker
from fedgo_flwr.data import ArrayDataset, DataBundle
from fedgo_flwr.data.imagefolder import load_unlabeled
from fedgo_flwr.data.partition import Partition
from fedgo_flwr.learning.aggregation import AggregationConfig
from fedgo_flwr.learning.task import heterogeneous_models
from fedgo_flwr.protocol import TRAIN, ReplySpec, declaration
from fedgo_flwr.records.checkpoint import MAX_PARAMETER, arrays_problem
from fedgo_flwr.runtime import messages as msgs
from fedgo_flwr.runtime.messages import stream_replies, to_numpy, to_record
from fedgo_flwr.runtime.shutdown import raise_if_stopping
from fedgo_flwr.weighting import share_cap_warning
from strategies._aggregation import RobustAveraging, update_norms
from strategies._architectures import ClientArchitectures, homogeneous_only
from strategies._replies import Reply, ReplyIntake, ReplyRejected, client_metrics
from strategies._rounds import Rollback, Row
from strategies._sending import Outbox

# What a strategy module needs to subclass Strategy: the parts' modules are private, so the
# types and functions a subclass uses are taken from here.
__all__ = [
    "BaseConfig",
    "Reply",
    "ReplyRejected",
    "Row",
    "ServerResources",
    "Strategy",
    "client_metrics",
    "update_norms",
]


@dataclass
class BaseConfig:
    """What every parameter-averaging strategy takes: ``strategy.aggregation.*``.

    A strategy's ``Config`` extends this (FedAvg uses it as it is); one whose ``Config`` does
    not gets the plain mean.
    """

    aggregation: AggregationConfig = field(default_factory=AggregationConfig)


@dataclass
class ServerResources:
    """What the server holds besides the model: its data, partition, device and run folder."""

    bundle: DataBundle
    partition: Partition
    device: torch.device
    out_dir: Path


class Strategy(FlowerStrategy):
    """Seeded sampling, per-reply validation, streaming aggregation, resumable rounds."""

    name: ClassVar[str] = ""
    """The YAML name (``strategy.name``); equal to the module's name."""
    client_algorithm: ClassVar[str] = "fedavg"
    """The client algorithm: a module of ``clients/``."""
    Config: ClassVar[type] = BaseConfig
    """The strategy's own YAML parameters (``strategy.<key>``), a dataclass."""
    uses_public_data: ClassVar[bool] = False
    """Whether it distils on ``data.public_path`` when given (other strategies refuse it)."""
    reply_metrics: ClassVar[tuple[str, ...]] = ()
    """The client algorithm's own reply metrics the round records (FedUV's ``uv_var``): the
    n_k-weighted mean over the accepted replies that have it (the declaration checks them)."""
    finished: bool = False
    """Whether the run ended before ``rounds`` (CPFL, one-shot FL: part of their state, so a
    resumed run knows; the loop itself stops after a row that is ``finished``)."""
    supports_heterogeneous_models: ClassVar[bool] = False
    """Whether clients may train architectures other than ``model.name``
    (``model.client_models``). A strategy that averages parameters cannot: it refuses them. One
    that sets it must override :meth:`absorb` / :meth:`aggregate` (the default averages every
    reply's arrays) and may override :meth:`arrays_for`."""
    rolls_back: ClassVar[bool] = True
    """Whether a row whose replies say its model was broken is undone
    (:mod:`strategies._rounds`); ``False`` for a strategy whose rows are not rounds of one
    global model (CPFL's cohorts, one-shot FL, central training)."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        node_ids: Mapping[int, int],
        model: nn.Module,
        resources: ServerResources | None = None,
    ):
        if not isinstance(cfg.strategy.params, self.Config):
            raise TypeError(
                f"{type(self).__name__} needs cfg.strategy.params built into {self.Config.__name__}"
                " (load the experiment with strategies.load_experiment or strategies.resolve)"
            )
        self.cfg = cfg
        self.params: Any = cfg.strategy.params
        self.aggregation: AggregationConfig = getattr(
            self.params, "aggregation", AggregationConfig()
        )
        self.node_ids = dict(node_ids)  # partition id -> node id (a node may serve several)
        self.param_names = [name for name, _ in model.named_parameters()]
        self.resources = resources
        # n_k of every partition, as the server counts it (None: no resources, trust the claim).
        self.client_sizes = None if resources is None else resources.partition.client_sizes
        self.architectures = ClientArchitectures(
            cfg,
            model,
            None if resources is None else resources.bundle,
            supported=self.supports_heterogeneous_models,
            strategy=self.name,
        )
        own = {f.name for f in dataclasses.fields(declaration(self.client_algorithm).Config)}
        mine = dataclasses.asdict(self.params)
        self.outbox = Outbox(cfg, self.node_ids, self.client_algorithm, {k: mine[k] for k in own})
        self.intake = ReplyIntake(
            self.node_ids, self.client_sizes, self.outbox.tokens, cfg.round_timeout
        )
        self.averager = RobustAveraging(self.aggregation)
        self.global_arrays: dict[str, np.ndarray] = {}  # the model sent this round
        self.rollback = Rollback(ArrayRecord())  # per run: start()
        self.num_rounds = cfg.rounds  # set again by start()
        self.sampled: list[int] = []
        self.last_round: dict[str, float | int] = {}  # the current row's metrics
        self.run_token = ""  # names this run's client-state files (kept when resuming)
        self.resuming = False  # set by the ServerApp when the run continues from a checkpoint
        # seconds of named stages of setup() (``generator``, ``discriminators``), for the
        # summary's stage_times (fedgo_flwr.records.recorder.STAGES)
        self.stage_times: dict[str, float] = {}
        # Asked before every row for the partitions whose node is now ambiguous (a node that
        # connected after discovery claims its partition): the ServerApp sets it without a
        # node map (fedgo_app.discovery.LateClaims); None: never.
        self.late_nodes: Callable[[Grid, Mapping[int, int]], list[int]] | None = None

    @classmethod
    def check_config(cls, config: Any, c: Checker, cfg: ExperimentConfig | None = None) -> None:
        """Checks of ``Config`` that depend on the strategy class or on the rest of the
        experiment ``cfg`` (``c.fail`` names the key). Here: client architectures other than
        ``model.name`` only for a strategy that supports them."""
        if cfg is not None and heterogeneous_models(cfg) and not cls.supports_heterogeneous_models:
            c.at("model.", cfg.model).fail("client_models", homogeneous_only(cls.name, cfg))
        agg = getattr(config, "aggregation", None)
        if cfg is not None and agg is not None and agg.rule == "trimmed_mean":
            k = cfg.clients_per_round
            c.at(f"{c.prefix}aggregation.", agg).require(
                "trim_fraction",
                agg.trimmed(k) >= 1,
                f"trims no client of the {k} per round (floor(trim_fraction * {k}) = 0); "
                + (
                    f"use at least {1 / k:.4g}"
                    if k >= 3
                    else "a trimmed mean needs 3 or more clients per round (trim_fraction < 0.5)"
                ),
            )

    @classmethod
    def preflight(cls, cfg: ExperimentConfig, c: Checker) -> None:
        """Checks of the whole experiment that this strategy needs, run before anything starts
        (by ``prepare`` and the ServerApp: :func:`fedgo_app.cli.preflight`); ``c`` has the
        experiment's sources, e.g. ``c.at("data.", cfg.data).require("server_fraction", ...)``.
        """

    @classmethod
    def ensemble_teachers(cls, cfg: ExperimentConfig) -> int | None:
        """Hook: how many teachers the share-capped ensembles of a run of ``cfg`` weigh
        (:func:`~fedgo_flwr.weighting.mean_share_caps`), ``None`` for a strategy without
        one; here none."""
        return None

    def summary(self) -> None:
        log(INFO, "\t├──> %s, params %s", type(self).__name__, self.params)
        log(
            INFO,
            "\t└──> Seeded sampling: %d of %d clients per round (seed %d)",
            self.cfg.clients_per_round,
            self.cfg.data.num_clients,
            self.cfg.seed,
        )

    def warn_share_cap(self) -> None:
        """A WARNING at the start of a run whose ensembles have two teachers, where no share
        cap can keep one client from half (:func:`~fedgo_flwr.weighting.share_cap_warning`)."""
        teachers = self.ensemble_teachers(self.cfg)
        warning = None if teachers is None else share_cap_warning(self.name, teachers)
        if warning is not None:
            log(WARNING, "%s", warning)

    def server_unlabeled(self) -> ArrayDataset:
        """The server's unlabeled images, loaded once: every image under ``data.public_path``
        (a strategy with :attr:`uses_public_data`; resized to the clients' image size, labels
        unknown) if it is set, else the server's share of the training set (labels known, in
        simulation only)."""
        cached = getattr(self, "_server_unlabeled", None)
        if cached is not None:
            return cached
        if self.resources is None:
            raise ValueError(f"{self.name} needs the server's data (ServerResources)")
        train = self.resources.bundle.train
        path = self.cfg.data.public_path
        if path is None:
            data = train.subset(self.resources.partition.server)
        else:
            images = load_unlabeled(path, tuple(train.input_shape[1:]))
            if tuple(images.input_shape) != tuple(train.input_shape):
                raise ValueError(
                    f"data.public_path: images of shape {tuple(images.input_shape)} after "
                    f"resizing, but the clients' are {tuple(train.input_shape)} (channels differ)"
                )
            data = ArrayDataset(
                x=images.x,
                y=np.zeros(len(images), dtype=np.int64),
                num_classes=train.num_classes,
                flip=train.flip,
            )
        self._server_unlabeled = data
        return data

    # -- the run: Flower's start, resumable, one row at a time -----------------------------
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
        *,
        first_round: int = 1,
        round_end: Callable[[int, ArrayRecord], None] | None = None,
        record: Callable[[int, ArrayRecord, Row], MetricRecord | None] | None = None,
    ) -> Result:
        """The run of every strategy: Flower's ``Strategy.start``, resumable, one row at a time.

        Per row of ``metrics.jsonl``: sample, send, take the replies and aggregate
        (:meth:`run_row`: a communication round here; CPFL's cohort rounds and stage two,
        one-shot FL's clients' round and server epochs elsewhere), undo the row if its replies
        say its model was broken (:attr:`rolls_back`, :class:`strategies._rounds.Rollback`),
        evaluate and record (``record(row, arrays, out)``: the run recorder gets the row's
        :class:`Row` whole, its figures in ``fields``; or Flower's ``evaluate_fn(row,
        arrays)``), checkpoint (``round_end(row, arrays)``). Unlike Flower's there is no
        federated evaluation (this framework evaluates on the server); rows start at
        ``first_round`` (a resumed run: the initial evaluation is skipped unless it is 1);
        which rows there are is :meth:`rows`, and the loop ends early after a row that is
        ``finished``. A stop asked for (Ctrl-C, TERM) ends the loop before a row's results are
        used or checkpointed.
        """
        log(
            INFO,
            "Starting %s strategy (%s)",
            type(self).__name__,
            self.plan(first_round, num_rounds),
        )
        self.summary()
        self.warn_share_cap()
        result = Result()
        result.arrays = arrays = initial_arrays
        self.num_rounds = num_rounds
        if not self.begin_run(initial_arrays):
            return result
        if record is None and evaluate_fn is not None:
            record = lambda n, evaluated, _: evaluate_fn(n, evaluated)  # noqa: E731
        if record is not None and first_round == 1:
            res = record(0, arrays, Row(label=self.row_label(0)))
            if res is not None:
                result.evaluate_metrics_serverapp[0] = res
        train_config = ConfigRecord() if train_config is None else train_config
        self.rollback = Rollback(arrays)  # after a resume, the model resumed from
        for row in self.rows(first_round, num_rounds):
            title = self.row_title(row, num_rounds)
            if title:
                log(INFO, "")
                log(INFO, "%s", title)
            if self.late_nodes is not None:  # before the row's messages go out
                for pid in self.late_nodes(grid, self.node_ids):
                    self.refuse_partition(pid)
            # Sample, send, take the replies as they come, aggregate.
            out = self.run_row(row, grid, arrays, ConfigRecord(train_config), timeout)
            # Clients that died with a Ctrl-C/TERM must not make a row (runtime.shutdown).
            raise_if_stopping(f"round {row}")
            if self.rolls_back:  # a broken model: back to the last good one
                undone = self.rollback.check(row, self.intake.round, self.last_round, out, arrays)
                if undone is not None:
                    out, arrays = undone, self.rollback.good
                    result.arrays = arrays
            if out.arrays is not None:
                result.arrays = arrays = out.arrays
            if out.metrics is not None:
                result.train_metrics_clientapp[row] = out.metrics
            out.fields = dict(self.last_round)  # the row's figures, as the rollback left them
            out.label = out.label or self.row_label(row)
            if record is not None:  # evaluate and record
                res = record(row, arrays if out.evaluated is None else out.evaluated, out)
                if res is not None:
                    result.evaluate_metrics_serverapp[row] = res
            if round_end is not None:  # checkpoint
                raise_if_stopping(f"round {row}'s checkpoint")
                round_end(row, arrays if out.checkpoint is None else out.checkpoint)
            if out.finished:
                break
        return result

    def refuse_partition(self, pid: int) -> None:
        """Send partition ``pid`` nothing from now on: its node is ambiguous (another node
        claims its partition). Its client is then left out of every round like one refused at
        node discovery (counted as failed; ``Round r: client k has no node``)."""
        self.node_ids.pop(pid, None)  # the intake's map too (the same dict)
        self.outbox.refuse(pid)

    def run_row(
        self, row: int, grid: Grid, arrays: ArrayRecord, config: ConfigRecord, timeout: float
    ) -> Row:
        """Hook: what one row does. Here one communication round: sample and send the global
        model ``arrays`` (:meth:`configure_train`), take the replies as they come
        (:func:`fedgo_flwr.runtime.messages.stream_replies`), aggregate
        (:meth:`aggregate_train`). CPFL and one-shot FL override it."""
        messages = self.configure_train(row, arrays, config, grid)
        new, metrics = self.aggregate_train(row, stream_replies(grid, messages, timeout))
        return Row(arrays=new, metrics=metrics)

    def plan(self, first_round: int, num_rounds: int) -> str:
        """Hook: how the start of the run describes the rows to come (logged)."""
        return f"rounds {first_round}..{num_rounds}"

    def begin_run(self, initial_arrays: ArrayRecord) -> bool:
        """Hook: work before the first row of this (possibly resumed) run; ``False``: nothing
        is left to do (a run resumed after its last row)."""
        return True

    def rows(self, first_round: int, num_rounds: int) -> Iterable[int]:
        """Hook: the rows of ``metrics.jsonl`` this run makes: here one per round."""
        return range(first_round, num_rounds + 1)

    def row_title(self, row: int, num_rounds: int) -> str | None:
        """Hook: the row's heading in the log (``None``: none)."""
        return f"[ROUND {row}/{num_rounds}]"

    def row_label(self, row: int) -> str | None:
        """Hook: how the row's evaluation line names it (``None``: ``round r/rounds``)."""
        return None

    def report(self) -> dict[str, Any]:
        """Hook: this strategy's part of ``summary.json`` (CPFL's simulated time, CPU-hours,
        bytes); nothing here."""
        return {}

    # -- a round: sample and send ----------------------------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The round's training messages: the seeded sample of clients
        (:meth:`Outbox.sample <strategies._sending.Outbox.sample>`), each sent
        :meth:`train_record` (with ``model.client_models``, one record per architecture, built
        once, ``arrays`` being :meth:`arrays_for`'s); opens the round's intake."""
        self.global_arrays = to_numpy(arrays)
        pids = self.outbox.sample(server_round)
        log(INFO, "configure_train: clients %s", pids)
        config = self.message_config(server_round, config)
        if not self.architectures.heterogeneous:
            record = self.train_record(server_round, arrays, config)
            self.open_round(pids)
            return self.messages_to(record, pids, MessageType.TRAIN)
        records: dict[str, RecordDict] = {}  # one per architecture, shared by its clients
        messages: list[Message] = []
        for pid in pids:  # in partition order, as without client_models
            arch = self.architectures.of(pid)
            if arch not in records:
                records[arch] = self.train_record(
                    server_round, self.arrays_for(arch, arrays), config
                )
            messages += self.messages_to(records[arch], [pid], MessageType.TRAIN)
        self.open_round(pids)
        return messages

    def train_record(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord
    ) -> RecordDict:
        """Hook: the content sent to every sampled client (subclasses add their own records)."""
        return RecordDict({msgs.ARRAYS: arrays, msgs.CONFIG: config})

    def arrays_for(self, arch: str, arrays: ArrayRecord) -> ArrayRecord:
        """Hook: what clients of architecture ``arch`` start the round from (the global model
        ``arrays`` for ``model.name``'s; :meth:`ClientArchitectures.initial_record
        <strategies._architectures.ClientArchitectures.initial_record>` for the others). A
        strategy that keeps a model per architecture (FedDF's prototypes) overrides it."""
        return self.architectures.initial_record(arch, arrays)

    def message_config(self, server_round: int, config: ConfigRecord | None = None) -> ConfigRecord:
        """The ConfigRecord of every message to clients (:meth:`Outbox.config
        <strategies._sending.Outbox.config>`)."""
        return self.outbox.config(server_round, self.run_token, config)

    def messages_to(
        self, content: RecordDict, pids: Iterable[int], message_type: str
    ) -> list[Message]:
        """One message of ``message_type`` with ``content`` per partition in ``pids``, each
        with a fresh reply token (:meth:`Outbox.to <strategies._sending.Outbox.to>`)."""
        return self.outbox.to(content, pids, message_type)

    def pid_of(self, msg: Message) -> int:
        """The partition a reply answers for (``-1``: none this server knows)."""
        return self.outbox.pid_of(msg)

    def open_round(self, pids: Iterable[int]) -> None:
        """Send work to partitions ``pids`` this round (``sampled``): only their replies are
        taken, once each (:meth:`ReplyIntake.open <strategies._replies.ReplyIntake.open>`)."""
        self.sampled = list(pids)
        self.intake.open(self.sampled)

    # -- a round: take the replies and aggregate ---------------------------------------------
    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The round's replies, each checked (:meth:`accept`) and folded in (:meth:`absorb`)
        as it arrives, then :meth:`aggregate`; the round's metrics in ``last_round``. With
        fewer than ``min_clients`` usable replies the global model is kept (``None``)."""
        self.begin_round(server_round)
        accepted, t_absorb = self.intake.collect(server_round, replies, self.accept, self.absorb)
        replied = len(accepted) + self.replies_carried()
        self.last_round = {
            "clients_sampled": len(self.sampled),
            "clients_replied": replied,
            "clients_failed": self.intake.round.failed,
        }
        if replied < self.cfg.min_clients:
            log(
                WARNING,
                "Round %d: %d usable replies < min_clients %d; the global model is kept",
                server_round,
                replied,
                self.cfg.min_clients,
            )
            return None, MetricRecord(self.last_round)
        t0 = time.perf_counter()
        arrays = self.aggregate(server_round, accepted)
        self.last_round["aggregate_time"] = time.perf_counter() - t0 + t_absorb
        self.last_round.update(client_metrics(accepted, self.reply_metrics))
        return to_record(arrays), MetricRecord(self.last_round)

    def replies_carried(self) -> int:
        """Hook: usable replies of this round that :meth:`begin_round` took before any reply
        arrived (a one-shot round resumed after an interruption: the uploads it had kept,
        :meth:`OneShot.kept_uploads <strategies.oneshot.OneShot.kept_uploads>`); counted with
        the round's own replies."""
        return 0

    def accept(self, msg: Message) -> Reply | None:
        """``msg`` through the round's intake with this strategy's :meth:`reply_spec`,
        :meth:`reply_templates`, :meth:`check_reply` and :meth:`sent_arrays`
        (:meth:`ReplyIntake.accept <strategies._replies.ReplyIntake.accept>`); ``None``
        (logged) if unusable. Whatever a client sent, this returns."""
        archs = self.architectures
        return self.intake.accept(
            msg,
            self.reply_spec(),
            self.reply_templates,
            self.check_reply,
            archs.record_labels if archs.heterogeneous else None,
            self.sent_arrays,
            self.aggregation.update_bound,
        )

    def reply_spec(self) -> ReplySpec:
        """Hook: what a ``train`` reply must hold: the client algorithm's declaration
        (:func:`fedgo_flwr.protocol.declaration`)."""
        return declaration(self.client_algorithm).reply(TRAIN)

    def reply_templates(self, pid: int) -> dict[str, Mapping[str, np.ndarray]]:
        """Hook: per ArrayRecord of client ``pid``'s reply, what it must match in keys, shapes
        and dtypes: the model it trained (this round's global model, or its architecture's
        initial model); subclasses add their records'."""
        return {msgs.ARRAYS: self.architectures.reference(pid, self.global_arrays)}

    def check_reply(self, content: RecordDict) -> str | None:
        """Hook: extra checks of a subclass, after the intake's; why the reply is unusable,
        or ``None``."""
        return None

    def sent_arrays(self, pid: int) -> Mapping[str, np.ndarray] | None:
        """Hook: the model client ``pid`` was sent this round, against which its reply's
        update is bounded (``strategy.aggregation.update_bound``): the global model; ``None``
        (not checked) for a client of another architecture."""
        if not self.architectures.trains_main(pid):
            return None
        return self.global_arrays or None

    def begin_round(self, server_round: int) -> None:
        """Hook: reset what :meth:`absorb` accumulates (here the averager, against the model
        the clients were sent)."""
        self.averager.begin(self.global_arrays, f"Round {server_round}")

    def absorb(self, server_round: int, reply: Reply) -> None:
        """Hook: fold one accepted reply in as it arrives (here into the averager, its update
        clipped under ``strategy.aggregation``); its arrays are dropped afterwards. Raise
        :class:`ReplyRejected` to drop the reply, only before changing anything."""
        self.averager.add(reply.arrays, reply.num_examples, reply.partition_id, self.global_arrays)

    def aggregate(self, server_round: int, replies: list[Reply]) -> dict[str, np.ndarray]:
        """Hook: the next global model from the round's accepted ``replies`` (metadata only,
        sorted by partition id; the arrays went through :meth:`absorb`): here
        :meth:`averaged`."""
        return self.averaged()

    def averaged(self) -> dict[str, np.ndarray]:
        """The averager's result for the round, its figures (``clients_clipped``,
        ``update_ratio_*``) into the round's metrics."""
        out, figures = self.averager.result()
        self.last_round.update(figures)
        return out

    # -- models ----------------------------------------------------------------------------
    def model_factory(self, arch: str | None = None) -> nn.Module:
        """A fresh copy of the experiment's model, or of client architecture ``arch``, with
        its initial weights (:meth:`ClientArchitectures.model
        <strategies._architectures.ClientArchitectures.model>`)."""
        return self.architectures.model(arch)

    def setup(self, grid: Grid) -> None:
        """Hook: work before round 1 (e.g. FedGO's discriminator round); nothing by default."""

    # -- checkpointing ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Server-side state beyond the global model that a resumed run needs (picklable)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def state_problem(self, state: Mapping[str, Any], server_round: int) -> str | None:
        """Why ``state``, a checkpoint's ``strategy_state`` after ``server_round``, cannot be
        this strategy's (``"'strategy_state.<key>': ..."``), or ``None``. Called before
        :meth:`load_state_dict` on resume; the checkpoint has already been checked for
        non-finite values. A strategy whose state holds arrays of a known form (a model, a
        control variate) says here what they must be; this one holds none."""
        return None

    def model_problem(
        self, arrays: Any, what: str, bound: float | None = MAX_PARAMETER
    ) -> str | None:
        """Why ``arrays`` is not a model of ``model.name`` (keys, shapes, dtypes, finite values
        of at most ``bound``, :data:`~fedgo_flwr.records.checkpoint.MAX_PARAMETER` unless
        told), or ``None``."""
        template = self.architectures.template.state_dict()
        template = {k: v.detach().numpy() for k, v in template.items()}
        return arrays_problem(arrays, template, what, bound=bound)

    @classmethod
    def final_row(cls, cfg: ExperimentConfig) -> int:
        """The run's last row of ``metrics.jsonl``, the largest round a checkpoint may have:
        ``rounds``."""
        return cfg.rounds

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """No federated evaluation: the server evaluates (``RunRecorder.evaluate``)."""
        return []

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        return None
