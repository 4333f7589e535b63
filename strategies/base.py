"""The base of every fedgo-flwr strategy: the round loop, reply checks and the server's resources.

:class:`Strategy` subclasses Flower's abstract ``flwr.serverapp.strategy.Strategy`` (not its
``FedAvg``: nothing of FedAvg's sampling, message building or aggregation is used) and adds:

- Seeded client sampling over partition ids (:func:`fedgo_flwr.experiment.task.sample_clients`), so
  every strategy trains the same clients in the same round and a run is repeatable.
- Training messages that carry the core experiment, the client algorithm's name and its own
  parameters (:mod:`fedgo_flwr.runtime.messages`).
- Replies folded in one at a time as they arrive
  (:func:`fedgo_flwr.runtime.messages.stream_replies`): each accepted reply goes to
  :meth:`Strategy.absorb` and its arrays are let go, so the server's memory does not grow with the
  number of clients.
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
computed it (:attr:`Partition.client_sizes <fedgo_flwr.data.partition.Partition.client_sizes>`),
never the client's claim: a reply claiming another size is dropped, so one client cannot take
over the average by claiming 1e300 examples. A strategy built without :class:`ServerResources`
(unit tests) has no partition and uses the claim, which must be a whole number in
``[1, 2**53]``.

The default aggregation is FedAvg's n_k-weighted average (McMahan et al., AISTATS 2017, Alg. 1).
Every strategy whose ``Config`` extends :class:`BaseConfig` also takes the shared section
``strategy.aggregation`` (:class:`fedgo_flwr.learning.aggregation.AggregationConfig`): the
coordinate-wise median or trimmed mean instead of the mean, and clipping of each client's update;
the base applies it in :meth:`~Strategy.begin_round` / :meth:`~Strategy.absorb` /
:meth:`~Strategy.averaged`, so FedAvg, FedProx and FedDF/FedGO's average initialisation get it
as they are (SCAFFOLD applies it to its model update).

A strategy module (``strategies/<name>.py``) subclasses this and overrides only what differs:
:meth:`~Strategy.train_record` (what is sent), :meth:`~Strategy.absorb` /
:meth:`~Strategy.aggregate` (how accepted replies become the next model),
:meth:`~Strategy.check_reply` (extra reply checks), :meth:`~Strategy.setup` (work before round
1) and :meth:`~Strategy.state_dict` (what a resumed run needs).

**Where the parts are.** :class:`Strategy` is composed of one mixin per job, each in a private
module of this package (private: :func:`strategies.available` does not take them for
strategies); this module holds the class itself (its class attributes, constructor, config and
pre-flight checks, the server's resources and data, the setup and checkpoint hooks) and the
shared ``BaseConfig``:

- :mod:`strategies._rounds`: the round loop (:class:`~strategies._rounds.RoundLoop`, ``Row``);
- :mod:`strategies._sending`: sampling and the training messages;
- :mod:`strategies._replies`: reply intake and unpacking (``Reply``, ``ReplyRejected``,
  ``client_metrics``);
- :mod:`strategies._aggregation`: robust averaging and the round's metrics;
- :mod:`strategies._architectures`: client architectures other than the global model's.
"""

from __future__ import annotations

import collections
import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from logging import INFO
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy as FlowerStrategy
from flwr.supercore import log
from torch import nn

from fedgo_flwr.data import ArrayDataset, DataBundle
from fedgo_flwr.data.imagefolder import load_unlabeled
from fedgo_flwr.data.partition import Partition
from fedgo_flwr.experiment.checkpoint import MAX_PARAMETER, arrays_problem
from fedgo_flwr.experiment.config import ExperimentConfig
from fedgo_flwr.experiment.schema import Checker
from fedgo_flwr.experiment.task import heterogeneous_models
from fedgo_flwr.learning.aggregation import AggregationConfig
from fedgo_flwr.protocol import RoundIntake
from strategies._aggregation import RobustAveraging
from strategies._architectures import ClientArchitectures
from strategies._replies import Reply, ReplyIntake, ReplyRejected, client_metrics
from strategies._rounds import RoundLoop, Row
from strategies._sending import Sending

# What a strategy module needs to subclass Strategy: the mixins' modules are private, so the
# types a subclass uses (Reply, ReplyRejected, Row, client_metrics) are taken from here.
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


class Strategy(
    RoundLoop, Sending, ReplyIntake, RobustAveraging, ClientArchitectures, FlowerStrategy
):
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
        # partition id -> the reply token of the latest message sent to it (messages_to)
        self.reply_tokens: dict[int, str] = {}
        self.intake = RoundIntake(self.node_ids, (), tokens=self.reply_tokens)  # each round's
        self.last_round: dict[str, float | int] = {}  # read by the run recorder
        self.run_token = ""  # names this run's client-state files (kept when resuming)
        self.resuming = False  # set by the ServerApp when the run continues from a checkpoint
        # seconds of named stages of setup() (``generator``, ``discriminators``), for the
        # summary's stage_times (fedgo_flwr.experiment.recorder.STAGES)
        self.stage_times: dict[str, float] = {}

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
                + (
                    f"use at least {1 / k:.4g}"
                    if k >= 3
                    else "a trimmed mean needs 3 or more clients per round (trim_fraction < 0.5)"
                ),
            )

    @classmethod
    def preflight(cls, cfg: ExperimentConfig, c: Checker) -> None:
        """Checks of the whole experiment that this strategy needs, run before anything starts
        (by ``prepare`` and the ServerApp: :func:`fedgo_flwr.app.cli.preflight`); ``c`` has the
        experiment's sources, e.g. ``c.at("data.", cfg.data).require("server_fraction", ...)``.
        """

    def summary(self) -> None:
        log(INFO, "\t├──> %s, params %s", type(self).__name__, self.params)
        log(
            INFO,
            "\t└──> Seeded sampling: %d of %d clients per round (seed %d)",
            self.cfg.clients_per_round,
            self.cfg.data.num_clients,
            self.cfg.seed,
        )

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
        of at most ``bound``, :data:`~fedgo_flwr.experiment.checkpoint.MAX_PARAMETER` unless
        told), or ``None``."""
        template = {k: v.detach().numpy() for k, v in self._template.state_dict().items()}
        return arrays_problem(arrays, template, what, bound=bound)

    @classmethod
    def last_round(cls, cfg: ExperimentConfig) -> int:
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
