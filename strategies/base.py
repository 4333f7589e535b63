"""The base of every fedgo-flwr strategy: the round loop, reply checks and the server's resources.

:class:`Strategy` subclasses Flower's abstract ``flwr.serverapp.strategy.Strategy`` (not its
``FedAvg``: nothing of FedAvg's sampling, message building or aggregation is used) and adds:

- Seeded client sampling over partition ids (:func:`fedgo_flwr.task.sample_clients`), so every
  strategy trains the same clients in the same round and a run is repeatable.
- Training messages that carry the core experiment, the client algorithm's name and its own
  parameters (:mod:`fedgo_flwr.messages`).
- Replies folded in one at a time as they arrive (:func:`fedgo_flwr.messages.stream_replies`):
  each accepted reply goes to :meth:`Strategy.absorb` and its arrays are let go, so the server's
  memory does not grow with the number of clients.
- Every reply checked by the round's intake (:class:`fedgo_flwr.protocol.RoundIntake`) before
  any strategy code sees it, against the client algorithm's declared reply
  (:func:`fedgo_flwr.protocol.declaration`, :meth:`Strategy.reply_spec`) and the server's
  templates of its array records (:meth:`Strategy.reply_templates`): error replies, group ids
  that are not a sampled partition of the replying node in ASCII digits, second replies for a
  client, missing or undeclared records and metrics, arrays whose keys, shapes or dtypes differ
  from the template (the replying client's architecture's: the global model's, unless
  ``model.client_models`` gives it another) or that hold non-finite values, metrics that are
  not finite numbers of their declared kind and bounds, and a ``num-examples`` other than the
  server's own count of the client's partition. A bad reply is logged with its partition and
  node id and the reason and dropped, and the round goes on if at least ``min_clients``
  replied; ``clients_failed`` counts each sampled client without an accepted reply once.
  Nothing a client sends can raise out of the checks; :meth:`Strategy.absorb` may still drop a
  reply by raising :class:`ReplyRejected` (FedDF: teacher logits that are not finite or too
  large). A model whose update is ``strategy.aggregation.update_bound`` times longer than the
  model the client was sent (:meth:`Strategy.sent_arrays`) is dropped too.
- Centralised evaluation (server side); no federated evaluation round.
- A resumable round loop (:meth:`Strategy.start`) that records nothing once a stop was asked for.

**Clients of other architectures** (``model.client_models``; one-shot FL's model market,
Co-Boosting, Dai et al., ICLR 2024): only a strategy that sets
:attr:`Strategy.supports_heterogeneous_models` accepts them; every other strategy averages
parameters and refuses such a configuration (:meth:`Strategy.check_config`). Each sampled
client is sent the arrays of its own architecture (:meth:`Strategy.arrays_for`) and its reply
is checked against that architecture (:meth:`Strategy.reference_arrays`). With
``model.client_models`` empty nothing of this costs anything per round.

**n_k is the server's count.** Every n_k-weighted step (FedAvg's average, SCAFFOLD's buffers,
FedDF's and FedGO's data-size weights) uses the size of the client's partition as the server
computed it (:attr:`Partition.client_sizes <fedgo_flwr.partition.Partition.client_sizes>`),
never the client's claim: a reply claiming another size is dropped, so one client cannot take
over the average by claiming 1e300 examples. A strategy built without :class:`ServerResources`
(unit tests) has no partition and uses the claim, which must be a whole number in
``[1, 2**53]``.

The default aggregation is FedAvg's n_k-weighted average (McMahan et al., AISTATS 2017, Alg. 1).
Every strategy whose ``Config`` extends :class:`BaseConfig` also takes the shared section
``strategy.aggregation`` (:class:`fedgo_flwr.aggregation.AggregationConfig`): the coordinate-wise
median or trimmed mean instead of the mean, and clipping of each client's update; the base
applies it in :meth:`~Strategy.begin_round` / :meth:`~Strategy.absorb` /
:meth:`~Strategy.averaged`, so FedAvg, FedProx and FedDF/FedGO's average initialisation get it
as they are (SCAFFOLD applies it to its model update).

A strategy module (``strategies/<name>.py``) subclasses this and overrides only what differs:
:meth:`~Strategy.train_record` (what is sent), :meth:`~Strategy.absorb` /
:meth:`~Strategy.aggregate` (how accepted replies become the next model),
:meth:`~Strategy.check_reply` (extra reply checks), :meth:`~Strategy.setup` (work before round
1) and :meth:`~Strategy.state_dict` (what a resumed run needs).
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import json
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

from fedgo_flwr import messages as msgs
from fedgo_flwr.aggregation import AggregationConfig, clip_update, new_average, update_problem
from fedgo_flwr.config import ExperimentConfig
from fedgo_flwr.data import ArrayDataset, DataBundle
from fedgo_flwr.data.imagefolder import load_unlabeled
from fedgo_flwr.messages import stream_replies, to_numpy, to_record
from fedgo_flwr.partition import Partition
from fedgo_flwr.protocol import TRAIN, ReplySpec, RoundIntake, declaration, partition_of_reply
from fedgo_flwr.schema import Checker
from fedgo_flwr.shutdown import raise_if_stopping
from fedgo_flwr.task import client_model_name, heterogeneous_models, new_model, sample_clients

__all__ = [
    "BaseConfig",
    "Reply",
    "ReplyRejected",
    "Row",
    "ServerResources",
    "Strategy",
    "client_metrics",
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


class ReplyRejected(Exception):
    """Raised by :meth:`Strategy.absorb` to drop a reply; only before absorb changed anything."""


@dataclass
class Reply:
    """An accepted client reply, unpacked."""

    node_id: int
    partition_id: int
    num_examples: int  # n_k: the server's count of the partition (the claim, without resources)
    arrays: dict[str, np.ndarray]
    metrics: dict[str, Any]
    content: RecordDict


@dataclass
class Row:
    """What one row of the round loop (:meth:`Strategy.run_row`) produced.

    ``arrays``: the new global model (``None``: unchanged); ``metrics``: the row's training
    metrics; ``evaluated``: what the row's evaluation sees, if not the global model (an empty
    record: nothing to evaluate, e.g. CPFL's cohorts before distillation); ``due``: evaluate
    this row even if ``eval.every`` would skip it; ``checkpoint``: the arrays the row's
    checkpoint keeps, if not the global model.
    """

    arrays: ArrayRecord | None = None
    metrics: MetricRecord | None = None
    evaluated: ArrayRecord | None = None
    due: bool = False
    checkpoint: ArrayRecord | None = None


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
    """Set by a strategy whose run ends before ``rounds`` (CPFL, one-shot FL): the loop stops
    after the row that set it, and that row is evaluated."""
    evaluate_now: bool = False
    """True while the current row is evaluated although ``eval.every`` would skip it."""
    supports_heterogeneous_models: ClassVar[bool] = False
    """Whether clients may train architectures other than ``model.name``
    (``model.client_models``). A strategy that averages parameters cannot: it refuses them. One
    that sets it must override :meth:`absorb` / :meth:`aggregate` (the default averages every
    reply's arrays) and may override :meth:`arrays_for`."""

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
        served = collections.Counter(self.node_ids.values())
        # node id -> partition id, for nodes that serve one partition (replies without group id)
        self.partition_of = {n: p for p, n in self.node_ids.items() if served[n] == 1}
        self.param_names = [name for name, _ in model.named_parameters()]
        self.resources = resources
        # n_k of every partition, as the server counts it (None: no resources, trust the claim).
        self.client_sizes = None if resources is None else resources.partition.client_sizes
        self._template = copy.deepcopy(model).cpu()
        self.heterogeneous = heterogeneous_models(cfg)
        # Architectures other than model.name: a seeded initial model of each, built once.
        self._arch_templates: dict[str, nn.Module] = {}
        self._arch_arrays: dict[str, dict[str, np.ndarray]] = {}
        self._arch_records: dict[str, ArrayRecord] = {}
        if self.heterogeneous:
            self._build_architectures()
        self.global_arrays: dict[str, np.ndarray] = {}
        self.num_rounds = cfg.rounds  # set again by start()
        self.sampled: list[int] = []
        self.intake = RoundIntake(self.node_ids, ())  # replaced by each round's
        self.last_round: dict[str, float | int] = {}  # read by the run recorder
        self.run_token = ""  # names this run's client-state files (kept when resuming)
        self.resuming = False  # set by the ServerApp when the run continues from a checkpoint

    @classmethod
    def check_config(cls, config: Any, c: Checker, cfg: ExperimentConfig | None = None) -> None:
        """Checks of ``Config`` that depend on the strategy class or on the rest of the
        experiment ``cfg`` (``c.fail`` names the key). Here: client architectures other than
        ``model.name`` only for a strategy that supports them."""
        if cfg is not None and heterogeneous_models(cfg) and not cls.supports_heterogeneous_models:
            c.at("model.", cfg.model).fail("client_models", cls._homogeneous_only(cfg))
        agg = getattr(config, "aggregation", None)
        if cfg is not None and agg is not None and agg.rule == "trimmed_mean":
            k = cfg.clients_per_round
            c.at(f"{c.prefix}aggregation.", agg).require(
                "trim_fraction",
                agg.trimmed(k) >= 1,
                f"trims no client of the {k} per round (floor(trim_fraction * {k}) = 0); "
                f"use at least {1 / k:.4g}",
            )

    @classmethod
    def preflight(cls, cfg: ExperimentConfig, c: Checker) -> None:
        """Checks of the whole experiment that this strategy needs, run before anything starts
        (by ``prepare`` and the ServerApp: :func:`fedgo_flwr.cli.preflight`); ``c`` has the
        experiment's sources, e.g. ``c.at("data.", cfg.data).require("server_fraction", ...)``.
        """

    @classmethod
    def _homogeneous_only(cls, cfg: ExperimentConfig) -> str:
        return (
            f"strategy {cls.name} averages parameters: every client must train model.name "
            f"('{cfg.model.name}'); clients of other architectures need a strategy with "
            "supports_heterogeneous_models"
        )

    def _build_architectures(self) -> None:
        """The seeded initial model of every client architecture other than ``model.name``."""
        if not self.supports_heterogeneous_models:
            raise ValueError(f"model.client_models: {self._homogeneous_only(self.cfg)}")
        if self.resources is None:
            raise ValueError(
                "model.client_models: the server needs its data bundle (ServerResources) "
                "to build the clients' architectures"
            )
        names = {client_model_name(self.cfg, pid) for pid in range(self.cfg.data.num_clients)}
        for name in sorted(names - {self.cfg.model.name}):
            with torch.random.fork_rng(devices=[]):  # the server's own random stream is kept
                model = new_model(self.cfg, self.resources.bundle, name).cpu()
            self._arch_templates[name] = model
            self._arch_arrays[name] = {k: v.detach().numpy() for k, v in model.state_dict().items()}
            self._arch_records[name] = to_record(self._arch_arrays[name])

    def summary(self) -> None:
        log(INFO, "\t├──> %s, params %s", type(self).__name__, self.params)
        log(
            INFO,
            "\t└──> Seeded sampling: %d of %d clients per round (seed %d)",
            self.cfg.clients_per_round,
            self.cfg.data.num_clients,
            self.cfg.seed,
        )

    def model_factory(self, arch: str | None = None) -> nn.Module:
        """A fresh copy of the experiment's model, or of client architecture ``arch`` (a name
        of ``model.client_models``), with its initial weights (to be replaced by the caller)."""
        if arch is None or arch == self.cfg.model.name:
            return copy.deepcopy(self._template)
        return copy.deepcopy(self._arch_templates[arch])

    def client_arch(self, pid: int) -> str:
        """The architecture client ``pid`` trains (:func:`fedgo_flwr.task.client_model_name`)."""
        return client_model_name(self.cfg, pid)

    def arrays_for(self, arch: str, arrays: ArrayRecord) -> ArrayRecord:
        """What clients of architecture ``arch`` start the round from.

        ``model.name``'s clients get the global model (``arrays``). Clients of any other
        architecture get that architecture's seeded initial model
        (:func:`fedgo_flwr.task.new_model`: seed ``derive_seed(cfg.seed, "model-init", arch)``),
        the same every round, so all clients of one architecture start equal (one-shot FL,
        e.g. Co-Boosting, needs no more). A strategy that keeps a model per architecture
        overrides this.
        """
        if arch == self.cfg.model.name:
            return arrays
        return self._arch_records[arch]

    def reference_arrays(self, pid: int) -> dict[str, np.ndarray]:
        """What client ``pid``'s reply must match in keys, shapes and dtypes: this round's
        global model, or the initial model of the client's own architecture."""
        if not self.heterogeneous:
            return self.global_arrays
        arch = self.client_arch(pid)
        return self.global_arrays if arch == self.cfg.model.name else self._arch_arrays[arch]

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

    def setup(self, grid: Grid) -> None:
        """Work before round 1 (e.g. FedGO's discriminator round); nothing by default."""

    # -- checkpointing ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Server-side state beyond the global model that a resumed run needs (picklable)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    # -- the round loop --------------------------------------------------------------------
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
    ) -> Result:
        """The round loop of every strategy: Flower's, resumable, one row at a time.

        As :meth:`flwr.serverapp.strategy.Strategy.start`, without the federated evaluation
        phase (this framework evaluates on the server), plus: rows start at ``first_round``
        (a resumed run; the initial evaluation is skipped unless it is 1) and
        ``round_end(row, arrays)`` runs after each row's evaluation (checkpointing). What a
        row does is :meth:`run_row` (a communication round here; CPFL's cohort rounds and
        stage two, one-shot FL's clients' round and server epochs elsewhere), which rows
        there are :meth:`rows`; the loop ends early once :attr:`finished`. A stop asked for
        (Ctrl-C, TERM) ends the loop before a row's results are used or checkpointed.
        """
        log(
            INFO,
            "Starting %s strategy (%s)",
            type(self).__name__,
            self.plan(first_round, num_rounds),
        )
        self.summary()
        result = Result()
        result.arrays = initial_arrays
        self.num_rounds = num_rounds
        if not self.begin_run(initial_arrays):
            return result
        arrays = initial_arrays
        if evaluate_fn and first_round == 1:
            res = evaluate_fn(0, arrays)
            if res is not None:
                result.evaluate_metrics_serverapp[0] = res
        train_config = ConfigRecord() if train_config is None else train_config
        for row in self.rows(first_round, num_rounds):
            title = self.row_title(row, num_rounds)
            if title:
                log(INFO, "")
                log(INFO, "%s", title)
            out = self.run_row(row, grid, arrays, ConfigRecord(train_config), timeout)
            # Clients that died with a Ctrl-C/TERM must not make a row (fedgo_flwr.shutdown).
            raise_if_stopping(f"round {row}")
            if out.arrays is not None:
                arrays = out.arrays
                result.arrays = arrays
            if out.metrics is not None:
                result.train_metrics_clientapp[row] = out.metrics
            if evaluate_fn:
                self.evaluate_now = out.due
                res = evaluate_fn(row, arrays if out.evaluated is None else out.evaluated)
                self.evaluate_now = False
                if res is not None:
                    result.evaluate_metrics_serverapp[row] = res
            if round_end is not None:
                raise_if_stopping(f"round {row}'s checkpoint")
                round_end(row, arrays if out.checkpoint is None else out.checkpoint)
            if self.finished:
                break
        return result

    def plan(self, first_round: int, num_rounds: int) -> str:
        """How the start of the loop describes the rows to come (logged)."""
        return f"rounds {first_round}..{num_rounds}"

    def begin_run(self, initial_arrays: ArrayRecord) -> bool:
        """Work before the first row of this (possibly resumed) run; ``False``: nothing is
        left to do (a run resumed after its last row)."""
        return True

    def rows(self, first_round: int, num_rounds: int) -> Iterable[int]:
        """The rows of ``metrics.jsonl`` this run makes: here one per communication round."""
        return range(first_round, num_rounds + 1)

    def row_title(self, row: int, num_rounds: int) -> str | None:
        """The row's heading in the log (``None``: none)."""
        return f"[ROUND {row}/{num_rounds}]"

    def run_row(
        self, row: int, grid: Grid, arrays: ArrayRecord, config: ConfigRecord, timeout: float
    ) -> Row:
        """One communication round: send the global model, take the replies as they come
        (:func:`fedgo_flwr.messages.stream_replies`), aggregate."""
        messages = self.configure_train(row, arrays, config, grid)
        new, metrics = self.aggregate_train(row, stream_replies(grid, messages, timeout))
        return Row(arrays=new, metrics=metrics)

    # -- sending ---------------------------------------------------------------------------
    def client_params(self) -> dict[str, Any]:
        """The client algorithm's own parameters, taken from this strategy's ``Config``."""
        fields = [f.name for f in dataclasses.fields(declaration(self.client_algorithm).Config)]
        own = dataclasses.asdict(self.params)
        return {key: own[key] for key in fields}

    def message_config(self, server_round: int, config: ConfigRecord | None = None) -> ConfigRecord:
        """The ConfigRecord of every message to clients (:mod:`fedgo_flwr.messages`)."""
        config = ConfigRecord() if config is None else config
        config[msgs.SERVER_ROUND] = server_round
        config[msgs.ALGORITHM] = self.client_algorithm
        config[msgs.EXPERIMENT] = self.cfg.to_json(strategy_params=False)
        config[msgs.CLIENT_PARAMS] = json.dumps(
            self.client_params(), sort_keys=True, allow_nan=False
        )
        config[msgs.RUN_TOKEN] = self.run_token
        return config

    def messages_to(
        self, content: RecordDict, pids: Iterable[int], message_type: str
    ) -> list[Message]:
        """One message of ``message_type`` with ``content`` for each partition in ``pids``, to
        the node that serves it, the partition id in its ``group_id`` (a simulated node may
        serve several; the reply carries the group id back: :meth:`pid_of`)."""
        return [
            Message(
                content=content,
                message_type=message_type,
                dst_node_id=self.node_ids[pid],
                group_id=str(pid),
            )
            for pid in pids
        ]

    def pid_of(self, msg: Message) -> int:
        """The partition a reply answers for (``-1``: none this server knows): its group id
        (ASCII digits), which must be a partition the sending node serves; without one, the
        node's only partition."""
        return partition_of_reply(msg, self.node_ids, self.partition_of)

    def train_record(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord
    ) -> RecordDict:
        """The content sent to every sampled client (subclasses add their own records); with
        ``model.client_models``, once per architecture, ``arrays`` being :meth:`arrays_for`'s."""
        return RecordDict({msgs.ARRAYS: arrays, msgs.CONFIG: config})

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self.global_arrays = to_numpy(arrays)
        pids = sample_clients(
            self.cfg.seed, server_round, self.cfg.data.num_clients, self.cfg.clients_per_round
        )
        log(INFO, "configure_train: clients %s", pids)
        config = self.message_config(server_round, config)
        if not self.heterogeneous:
            record = self.train_record(server_round, arrays, config)
            self.open_round(pids)
            return self.messages_to(record, pids, MessageType.TRAIN)
        records: dict[str, RecordDict] = {}  # one per architecture, shared by its clients
        messages: list[Message] = []
        for pid in pids:  # in partition order, as without client_models
            arch = self.client_arch(pid)
            if arch not in records:
                records[arch] = self.train_record(
                    server_round, self.arrays_for(arch, arrays), config
                )
            messages += self.messages_to(records[arch], [pid], MessageType.TRAIN)
        self.open_round(pids)
        return messages

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """No federated evaluation: the server evaluates (``RunRecorder.evaluate``)."""
        return []

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        return None

    # -- receiving -------------------------------------------------------------------------
    def open_round(self, pids: Iterable[int]) -> None:
        """Send work to partitions ``pids`` this round: only their replies are taken, once
        each (:class:`fedgo_flwr.protocol.RoundIntake`)."""
        self.sampled = list(pids)
        self.intake = RoundIntake(self.node_ids, self.sampled, self.client_sizes)

    def reply_spec(self) -> ReplySpec:
        """What a ``train`` reply must hold: the client algorithm's declaration
        (:func:`fedgo_flwr.protocol.declaration`)."""
        return declaration(self.client_algorithm).reply(TRAIN)

    def reply_templates(self, pid: int) -> dict[str, Mapping[str, np.ndarray]]:
        """Per ArrayRecord of client ``pid``'s reply, what it must match in keys, shapes and
        dtypes: the model (:meth:`reference_arrays`); subclasses add their records'."""
        return {msgs.ARRAYS: self.reference_arrays(pid)}

    def check_reply(self, content: RecordDict) -> str | None:
        """Extra checks of a subclass, after the intake's; return why the reply is unusable,
        or ``None``."""
        return None

    def accept(self, msg: Message) -> Reply | None:
        """The reply checked by the round's intake, unpacked; ``None`` (logged) if unusable.

        Whatever a client sent, this returns (:meth:`RoundIntake.take`).
        """
        checked = self.intake.take(
            msg,
            self.reply_spec(),
            self.reply_templates,
            lambda c: self.check_reply(c.content),
            self._record_labels if self.heterogeneous else None,
        )
        if checked is None:
            return None
        reply = Reply(
            node_id=checked.node_id,
            partition_id=checked.partition_id,
            num_examples=checked.num_examples,
            arrays=checked.arrays[msgs.ARRAYS],
            metrics=checked.metrics,
            content=checked.content,
        )
        sent = self.sent_arrays(reply.partition_id)
        if sent is not None:
            problem = update_problem(reply.arrays, sent, self.aggregation.update_bound)
            if problem is not None:
                self.drop(reply, problem)
                return None
        return reply

    def sent_arrays(self, pid: int) -> Mapping[str, np.ndarray] | None:
        """The model client ``pid`` was sent this round, against which its reply's update is
        bounded (``strategy.aggregation.update_bound``, :func:`update_problem`): the global
        model; ``None`` (not checked) for a client of another architecture."""
        if self.heterogeneous and self.client_arch(pid) != self.cfg.model.name:
            return None
        return self.global_arrays or None

    def _record_labels(self, pid: int, key: str) -> tuple[str, str]:
        """How a refused record of client ``pid`` is named with ``model.client_models``."""
        if key == msgs.ARRAYS:
            return f"arrays (its model '{self.client_arch(pid)}')", "that model"
        return f"ArrayRecord {key!r}", "the server's"

    def drop(self, reply: Reply, reason: str) -> None:
        """Drop an accepted ``reply`` after all (:class:`ReplyRejected` from :meth:`absorb`)."""
        self.intake.accepted.discard(reply.partition_id)
        self.intake.reject(reply.partition_id, reply.node_id, reason)

    def begin_round(self, server_round: int) -> None:
        """Reset what :meth:`absorb` accumulates."""
        self.running = new_average(self.aggregation)
        self.clipped_replies = 0

    def robust(self, reply: Reply) -> dict[str, np.ndarray]:
        """``reply``'s arrays with its update clipped to ``strategy.aggregation.clip_norm``
        against this round's global model (unchanged when there is no bound)."""
        bound = self.aggregation.clip_norm
        if bound is None:
            return reply.arrays
        arrays, clipped = clip_update(reply.arrays, self.global_arrays, bound)
        self.clipped_replies += clipped
        return arrays

    def absorb(self, server_round: int, reply: Reply) -> None:
        """Fold one accepted reply in; its arrays are dropped afterwards (kept by the median
        and trimmed mean, which need all of a round's replies at once)."""
        self.running.add(self.robust(reply), reply.num_examples)

    def averaged(self) -> dict[str, np.ndarray]:
        """The round's average under ``strategy.aggregation`` of what :meth:`absorb` took:
        the n_k-weighted mean by default, else the unweighted median or trimmed mean; with
        ``clip_norm`` the round records ``clients_clipped``."""
        if self.aggregation.clip_norm is not None:
            self.last_round["clients_clipped"] = self.clipped_replies
        return self.running.result()

    def aggregate(self, server_round: int, replies: list[Reply]) -> dict[str, np.ndarray]:
        """The average of the client models (``replies`` hold metadata only, sorted by
        partition id; the arrays went through :meth:`absorb`)."""
        return self.averaged()

    def collect(self, server_round: int, replies: Iterable[Message]) -> tuple[list[Reply], float]:
        """The one loop over a round's replies: each, as it arrives, through the intake
        (:meth:`accept`) and into :meth:`absorb`, its arrays let go afterwards; returns the
        accepted replies sorted by partition id (arrival order must not matter) and the
        seconds spent in :meth:`absorb`."""
        accepted: list[Reply] = []
        t_absorb = 0.0
        for msg in replies:  # as they arrive; one reply's arrays in memory at a time
            reply = self.accept(msg)
            del msg
            if reply is None:
                continue
            t0 = time.perf_counter()
            try:
                self.absorb(server_round, reply)
            except ReplyRejected as exc:  # absorb found it unusable before changing anything
                self.drop(reply, str(exc))
                continue
            finally:
                t_absorb += time.perf_counter() - t0
            reply.arrays, reply.content = {}, RecordDict()  # let the model go
            accepted.append(reply)
        accepted.sort(key=lambda r: r.partition_id)
        self.warn_silent(server_round)
        return accepted, t_absorb

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        self.begin_round(server_round)
        accepted, t_absorb = self.collect(server_round, replies)
        self.last_round = {
            "clients_sampled": len(self.sampled),
            "clients_replied": len(accepted),
            "clients_failed": self.intake.failed,
        }
        if len(accepted) < self.cfg.min_clients:
            log(
                WARNING,
                "Round %d: %d usable replies < min_clients %d; the global model is kept",
                server_round,
                len(accepted),
                self.cfg.min_clients,
            )
            return None, MetricRecord(self.last_round)
        t0 = time.perf_counter()
        arrays = self.aggregate(server_round, accepted)
        self.last_round["aggregate_time"] = time.perf_counter() - t0 + t_absorb
        self.last_round.update(client_metrics(accepted, self.reply_metrics))
        return to_record(arrays), MetricRecord(self.last_round)

    def warn_silent(self, server_round: int) -> None:
        """One WARNING per partition of the round that no reply answered for."""
        for pid in self.intake.silent:
            log(
                WARNING,
                "Round %d: client %d (node %d) sent no reply within round_timeout (%.0fs)",
                server_round,
                pid,
                self.node_ids[pid],
                self.cfg.round_timeout,
            )


def client_metrics(replies: list[Reply], extra: Iterable[str] = ()) -> dict[str, float]:
    """Example-weighted train loss; slowest and total client training time; the total time of
    the clients' train handlers, set-up included (when the replies say it); the
    example-weighted mean of each ``extra`` metric over the replies that have it."""
    n = np.array([r.num_examples for r in replies], dtype=np.float64)
    loss = np.array([float(r.metrics.get("train_loss", np.nan)) for r in replies])
    times = [float(r.metrics.get("train_time", 0.0)) for r in replies]
    out = {
        "train_loss": float((n * loss).sum() / n.sum()),
        "client_time_max": max(times),
        "client_time_sum": float(sum(times)),
    }
    handlers = [float(r.metrics["handler_time"]) for r in replies if "handler_time" in r.metrics]
    if handlers:
        out["client_handler_time_sum"] = float(sum(handlers))
    for key in extra:
        have = [(r.num_examples, float(r.metrics[key])) for r in replies if key in r.metrics]
        if have:
            w = np.array([h[0] for h in have], dtype=np.float64)
            out[key] = float((w * np.array([h[1] for h in have])).sum() / w.sum())
    return out
