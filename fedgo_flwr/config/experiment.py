"""Experiment configuration: the core sections, YAML files and command-line overrides.

One YAML file describes one experiment. A file may start from another with ``base: other.yaml``
(resolved relative to the file); keys are merged recursively, the later file winning. Overrides
``dotted.key=value`` (value parsed as YAML) are applied last. :func:`load_config` validates the
core sections below (built by :func:`fedgo_flwr.config.schema.build_section`); the first problem
stops with one :class:`ConfigError` naming the key, the bad value and where it came from.

The YAML reader (:mod:`fedgo_flwr.config.yaml_files`) refuses what a configuration never
means but YAML would silently accept: an empty file, a key given twice in one mapping, a file
that is not UTF-8 text, overlong integers, deep nesting and alias bombs.

This module knows the core sections only. ``strategy:`` holds the algorithm's name and its own
parameters as an unchecked mapping; the strategy package builds them, once, into the
algorithm's typed ``Config`` (:func:`strategies.load_experiment`, which is what the apps call).
``conf/base.yaml`` lists every core key with the default declared here (a test keeps them equal),
and docs/configuration.md documents each key (generated from these dataclasses).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedgo_flwr.config.names import (
    HF_PREFIX,
    MAX_NAME_BYTES,
    MODEL_NAMES,
    NAME_PATTERN,
    PARTITION_SCHEMES,
    PRECISIONS,
    dataset_entry,
    dataset_names,
    is_dataset_name,
    path_problem,
    unprintable,
)
from fedgo_flwr.config.schema import Checker, ConfigError, build_section
from fedgo_flwr.config.yaml_files import Refused, load_yaml, read_yaml

__all__ = [
    "DEFAULT_CONFIG",
    "ConfigError",
    "DataConfig",
    "EvalConfig",
    "ExperimentConfig",
    "FaultConfig",
    "ModelConfig",
    "LoggingConfig",
    "ResourcesConfig",
    "StrategyConfig",
    "TrainConfig",
    "config_and_overrides",
    "load_config",
    "parse_override",
    "resolve_config_path",
    "split_overrides",
]

DEVICE_PATTERN = re.compile(r"^(auto|cpu|mps|cuda(:\d{1,4})?)$")
OPTIMIZERS = ("sgd", "adam")
MAX_SECONDS = 30 * 24 * 3600
"""Upper bound of every duration key (``round_timeout``, ``faults[].seconds``): 30 days."""


@dataclass
class DataConfig:
    """Dataset and partition (FedGO paper Sec. 4: server share + Dirichlet client split).

    ``partition`` picks the client split (:mod:`fedgo_flwr.data.partition`): ``dirichlet``
    (per-class Dirichlet over clients, FedGO/FedDF/CPFL), ``dirichlet_prior`` (per-client Dirichlet
    class priors and ``LogNormal(quantity_sigma)`` amounts, the Co-Boosting code's "dir") or
    ``classes`` (``classes_per_client`` classes per client, Co-Boosting's ``C_cls``).
    """

    dataset: str = "digits"
    """{datasets}, or ``hf:<id>`` (a Hugging Face image dataset: ``pip install -e .[hf]``, needs
    internet)."""
    path: str | None = None
    """The folder that holds the dataset's files, for the datasets that have them:
    {dataset_folders}. A missing folder stops the run before it starts."""
    download: bool = False
    """Let the loader download a dataset that can be downloaded ({downloadable}; needs internet);
    without it a missing archive stops the run before it starts."""
    num_clients: int = 20
    """K, the number of clients (partitions)."""
    alpha: float = 0.1
    """Dirichlet concentration of the ``dirichlet`` and ``dirichlet_prior`` splits (smaller: more
    skewed)."""
    server_fraction: float = 0.5
    """Share of each class the server holds (unlabeled for training; its labels only feed
    diagnostics). 0: none (FedAvg, FedProx, SCAFFOLD, the one-shot data-free strategies, FedGO
    distilling on generated data). FedDF and FedGO on server data need it; CPFL with more than one
    cohort needs it or ``data.public_path``."""
    min_client_size: int = 2
    """The split is redrawn until every client holds this many samples."""
    augment: bool = True
    """Random horizontal flips during training, where the dataset allows them."""
    train_subset: int | None = field(default=None, metadata={"max": 2**31 - 1})
    """Use a stratified subset of this many training images (fixed, independent of the seed)."""
    test_subset: int | None = field(default=None, metadata={"max": 2**31 - 1})
    """Evaluate on a stratified subset of this many test images (fixed, independent of the seed)."""
    public_path: str | None = None
    """The server's unlabeled images from another data set: a folder of images (any depth), resized
    to the training images' size, e.g. STL-10's unlabeled split for CIFAR-10 clients (FedDF Fig.
    5-6, FedGO App. F.3). CPFL and the FedDF family distil on it, and FedGO trains its G1 generator
    and server-referenced discriminators on it; ``data.server_fraction`` may then be 0. Other
    strategies refuse it. ``null``: the server's share."""
    partition: str = "dirichlet"
    quantity_sigma: float = 0.0
    """``dirichlet_prior`` only: client amounts ~ LogNormal(log(N/K), sigma) over the client pool of
    N samples (0: equal amounts; Co-Boosting uses 0.4, 0.8, 1.2)."""
    classes_per_client: int | None = None

    def check(self, c: Checker) -> None:
        names = ", ".join(dataset_names())
        c.require(
            "dataset",
            is_dataset_name(self.dataset),
            f"unknown; choose one of {names}, or {HF_PREFIX}<Hugging Face dataset id>",
        )
        c.require("num_clients", self.num_clients >= 1, "must be >= 1")
        c.require("alpha", self.alpha > 0, "must be > 0")
        c.require("server_fraction", 0 <= self.server_fraction < 1, "must be in [0, 1)")
        c.require("min_client_size", self.min_client_size >= 1, "must be >= 1")
        if self.train_subset is not None:
            c.require("train_subset", self.train_subset >= 1, "must be >= 1")
        if self.test_subset is not None:
            c.require("test_subset", self.test_subset >= 1, "must be >= 1")
        entry = dataset_entry(self.dataset)
        if entry is not None and entry.folder is not None and entry.default_path is None:
            c.require("path", bool(self.path), f"{self.dataset} needs data.path")
        if entry is not None and entry.num_classes is not None:
            c.require(
                "classes_per_client",
                (self.classes_per_client or 0) <= entry.num_classes,
                f"is more than the {entry.num_classes} classes of {self.dataset}",
            )
        c.choice("partition", PARTITION_SCHEMES)
        c.require("quantity_sigma", self.quantity_sigma >= 0, "must be >= 0")
        c.require(
            "quantity_sigma",
            self.quantity_sigma == 0 or self.partition == "dirichlet_prior",
            "only data.partition: dirichlet_prior draws client amounts (log-normal); "
            f"data.partition is {self.partition}",
        )
        if self.classes_per_client is None:
            c.require(
                "classes_per_client",
                self.partition != "classes",
                "data.partition: classes needs it (the number of classes of every client)",
            )
        else:
            c.require("classes_per_client", self.classes_per_client >= 1, "must be >= 1")
            c.require(
                "classes_per_client",
                self.partition == "classes",
                f"only used by data.partition: classes; data.partition is {self.partition}",
            )


@dataclass
class ModelConfig:
    """Model architecture by name (see ``fedgo_flwr.config.names.MODEL_NAMES``): the
    server's, and the clients' where they train others, as in one-shot FL's "model market"
    (Co-Boosting, Dai et al., ICLR 2024, Sec. 3). Only a strategy that declares
    ``supports_heterogeneous_models`` accepts client architectures other than the server's.
    """

    name: str = "cnn"
    """The server's (global) model: ``cnn`` (small, CPU-sized), ``cnn_bn`` (the same with
    BatchNorm), ``mlp``, ``resnet8`` (FedDF's CIFAR ResNet-8), ``resnet18`` (CIFAR variant),
    ``vgg11_bn``, ``resnet50``, ``gn_lenet`` (GroupNorm LeNet of Hsieh et al. 2020, CPFL's CIFAR-10
    model; raw logits), ``cnn5`` (Co-Boosting's 5-layer CNN, the authors' ``CNNCifar``), ``lenet5``
    (the PyTorch tutorial's LeNet-5, Co-Boosting's MNIST model), ``mobilenetv3_small`` and
    ``shufflenetv2`` (Co-Boosting's heterogeneous clients, ImageNet layouts as in the authors'
    code). A model that cannot take the dataset's inputs is refused by key when the run starts."""
    client_models: list[str] = field(default_factory=list)
    """Client ``k`` trains ``client_models[k % len(client_models)]``
    (:func:`fedgo_flwr.learning.task.client_model_name`): one name per client, or a shorter
    list repeated over the partition ids, at most ``data.num_clients`` names; empty, every client
    trains ``model.name``. Strategies that average parameters refuse names other than
    ``model.name``; ``coboosting``, ``coboosting_fedgo``, ``dense`` and ``fadi`` take them (their
    ensemble meets in the logits; the student is ``model.name``), and so do ``feddf`` and ``fedgo``
    (FedDF Alg. 3: one prototype per architecture, each started from its own clients' average and
    distilled towards the ensemble of all clients; the others report ``test_accuracy_<arch>``). Each
    client is sent its own architecture's arrays and its reply is checked against them."""

    def check(self, c: Checker) -> None:
        c.choice("name", MODEL_NAMES)
        for i, model in enumerate(self.client_models):
            if model not in MODEL_NAMES:
                c.fail(
                    f"client_models[{i}]", f"unknown; choose one of {', '.join(MODEL_NAMES)}", model
                )


@dataclass
class TrainConfig:
    """Client-side local training (the same for every strategy unless it says otherwise)."""

    local_epochs: int = 5
    """Client epochs per round."""
    batch_size: int = 16
    """Client batch size."""
    optimizer: str = "sgd"
    """The clients' optimiser."""
    lr: float = 0.05
    """The clients' learning rate."""
    momentum: float = 0.0
    """SGD momentum."""
    weight_decay: float = 0.0
    """L2 weight decay of the clients' optimiser."""

    def check(self, c: Checker) -> None:
        c.require("local_epochs", self.local_epochs >= 1, "must be >= 1")
        c.require("batch_size", self.batch_size >= 1, "must be >= 1")
        c.choice("optimizer", OPTIMIZERS)
        c.require("lr", self.lr > 0, "must be > 0")
        c.require("momentum", 0 <= self.momentum < 1, "must be in [0, 1)")
        c.require("weight_decay", self.weight_decay >= 0, "must be >= 0")


@dataclass
class EvalConfig:
    """Server-side evaluation of the global model on the test split; ``target_accuracy``: the
    summary reports the first round that reaches it (``rounds_to_target``)."""

    batch_size: int = 64
    """Batch of the server's test evaluation (64: the fastest on a CPU; the results do not depend on
    it; 512 or more on a GPU)."""
    every: int = 1
    """Evaluate every N rounds (and in the last)."""
    target_accuracy: float | None = None

    def check(self, c: Checker) -> None:
        c.require("batch_size", self.batch_size >= 1, "must be >= 1")
        c.require("every", self.every >= 1, "must be >= 1")
        if self.target_accuracy is not None:
            c.require(
                "target_accuracy",
                0 < self.target_accuracy <= 1,
                "must be in (0, 1] (or null: none)",
            )


@dataclass
class LoggingConfig:
    """What a run writes besides its own files: ``tensorboard`` also writes every round's
    metrics (those of ``metrics.jsonl``) as TensorBoard scalars to ``<output_dir>/tensorboard``
    (needs the ``tensorboard`` package: ``pip install -e '.[tensorboard]'``)."""

    tensorboard: bool = False
    mlflow: bool = False
    """Track the run in MLflow (``pip install -e '.[mlflow]'``; experiment ``name``): config as
    params, every round's metrics, summary and run folder as artifacts; an MLflow failure is a
    WARNING and the run goes on (:mod:`fedgo_flwr.records.tracking`)."""
    mlflow_uri: str | None = None
    """The MLflow tracking URI (``http://host:5000``, ``sqlite:///path.db``); null:
    ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db`` in the folder of ``outputs/``."""

    def check(self, c: Checker) -> None:
        if self.mlflow_uri is not None:
            c.require("mlflow_uri", bool(self.mlflow_uri.strip()), "must not be empty (or null)")


@dataclass
class ResourcesConfig:
    """Ray resources of one simulated ClientApp (fractional GPUs spread clients over GPUs),
    the ServerApp's torch threads (``server_cpus_waiting``: while a round's clients still
    train, :func:`fedgo_flwr.runtime.messages.use_waiting_threads`), and ``channels_last``: run
    convolutions in the channels-last memory format, server and clients
    (:mod:`fedgo_flwr.runtime.kernels`: faster on CPU; the numbers differ from the default format's
    in the last float bits); ``gpu_inference_batch``: on a CUDA device, the least batch of the
    forward-only passes (teacher logits, ensemble and test evaluation, discriminator logits;
    :func:`fedgo_flwr.runtime.kernels.inference_batch`), server and clients; 0 keeps the
    configured batches. CPU runs always keep them. ``precision``: ``fp32`` (default) or
    ``bf16``, the classifiers' forward passes and losses under bfloat16 autocast
    (:func:`fedgo_flwr.runtime.kernels.autocast`; it changes the numbers, so it is opt-in).
    ``deterministic``: PyTorch's deterministic kernels, server and clients
    (:func:`fedgo_flwr.runtime.kernels.use_deterministic`): on a GPU, two runs of one seed then
    give the same numbers (CPU runs do already); slower, so off by default."""

    client_cpus: int = 1
    """CPUs of one simulated ClientApp (also its torch threads; a SuperNode caps them at its CPU
    count or its ``max-threads``)."""
    client_gpus: float = 0.0
    """GPU share of one simulated ClientApp (0.25: four clients per GPU); with 0 Ray hides the GPUs
    from the clients."""
    server_cpus: int | None = None
    """Torch threads of the ServerApp (distillation, evaluation); ``null``: all cores."""
    server_cpus_waiting: int | None = None
    local_workers: int | str = 1
    """Worker processes of ``./run.sh --local`` (and ``run_inprocess``) that train a round's
    clients side by side, each with ``client_cpus`` threads, each message going to the first
    free worker (with its node's ``Context.state``, kept from round to round); ``auto``: one per
    ``client_cpus`` of the CPUs the process may use; 1: one after another in the one process.
    The metrics do not depend on it (the replies are taken in the same order). With
    ``client_cpus`` 1 on Linux the workers are forked (at once); otherwise each starts a fresh
    interpreter (its imports and data: several seconds). Not used by the Ray simulation or a
    deployment."""
    channels_last: bool = False
    gpu_inference_batch: int = 512
    precision: str = "fp32"
    deterministic: bool = False

    def check(self, c: Checker) -> None:
        c.require("client_cpus", self.client_cpus >= 1, "must be >= 1")
        c.require("client_gpus", self.client_gpus >= 0, "must be >= 0")
        if self.server_cpus is not None:
            c.require("server_cpus", self.server_cpus >= 1, "must be >= 1")
        if self.server_cpus_waiting is not None:
            c.require("server_cpus_waiting", self.server_cpus_waiting >= 1, "must be >= 1")
        workers = self.local_workers
        c.require(
            "local_workers",
            workers == "auto" or (isinstance(workers, int) and workers >= 1),
            "must be auto or an integer >= 1",
        )
        c.require("gpu_inference_batch", self.gpu_inference_batch >= 0, "must be >= 0 (0: off)")
        c.choice("precision", PRECISIONS)


FAULT_KINDS = ("crash", "hang", "nan", "shape", "exit")


@dataclass
class FaultConfig:
    """A deliberate client failure, for testing how a run survives it.

    The client with partition id ``partition`` misbehaves when it trains in round ``round``
    (every round it trains if ``round`` is 0): ``crash`` raises an exception in the ClientApp
    (the server gets an error reply), ``hang`` sleeps ``seconds`` before replying (longer than
    ``round_timeout`` means no reply in time), ``nan`` replies non-finite weights, ``shape``
    replies a wrongly shaped array, ``exit`` ends the ClientApp process at once (a hard crash;
    in a Ray simulation this kills the worker, so use it in deployments).
    """

    partition: int = 0
    round: int = 0
    kind: str = "crash"
    """What the client does (see above)."""
    seconds: float = 60.0

    def check(self, c: Checker) -> None:
        c.require("partition", self.partition >= 0, "must be >= 0")
        c.require("round", self.round >= 0, "must be >= 0 (0: every round)")
        c.choice("kind", FAULT_KINDS)
        c.require("seconds", self.seconds >= 0, "must be >= 0")
        c.require("seconds", self.seconds <= MAX_SECONDS, f"must be <= {MAX_SECONDS} (30 days)")

    def applies(self, partition_id: int, server_round: int) -> bool:
        return self.partition == partition_id and self.round in (0, server_round)


@dataclass
class StrategyConfig:
    """Server algorithm by name plus its own parameters (flat keys beside ``name``).

    ``params`` is the raw mapping until the strategy package builds it into the algorithm's
    typed ``Config`` (:func:`strategies.load_experiment`); ``sources`` remembers which file or
    override set each key, so the strategy's errors name it too.
    """

    name: str = "fedavg"
    """The server algorithm: a module of ``strategies/`` ({strategies}). Its own parameters sit
    beside it (``strategy.<key>``, below); parameters of other strategies are ignored with a
    warning, so swapping ``strategy.name`` is a one-line change (``strict: true`` makes them an
    error)."""
    params: Any = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def raw_params(self) -> dict[str, Any]:
        """The parameters as a plain mapping (typed or not)."""
        if dataclasses.is_dataclass(self.params):
            return dataclasses.asdict(self.params)
        return dict(self.params)


@dataclass
class ExperimentConfig:
    """A whole experiment. ``to_dict``/``from_dict`` round-trip it (clients get it as JSON).

    The run's entry point decides the run's folder before anything is written
    (:func:`fedgo_flwr.records.recorder.decide_output_dir`).
    """

    name: str = "default"
    """Run name: the prefix of the run's log lines, and the folder ``outputs/<name>/`` of its runs
    when ``output_dir`` is not set. Never a control character (newline, NUL, ...), whatever
    ``output_dir``."""
    seed: int = field(default=0, metadata={"max": 2**32 - 1})
    """Seeds the partition, the model's initialisation, client sampling and client training; every
    random draw of a round is derived from ``(seed, round, ...)``."""
    rounds: int = 40
    """Federated rounds (for CPFL: the most rounds a cohort runs; the one-shot strategies need
    1)."""
    fraction: float = 0.4
    """Share of the clients sampled each round: ``max(min_clients, floor(fraction *
    data.num_clients))``."""
    min_clients: int = 1
    """A round needs this many usable replies, else the model is kept."""
    output_dir: str | None = None
    """Where the run writes its files (relative paths: against ``$FEDGO_WORKDIR`` if set, else the
    working directory). Not set (``null``), every run gets a new folder
    ``outputs/<name>/<date-time>`` (``%Y-%m-%d_%H-%M-%S``, then ``-1``, ``-2`` ... if taken), and
    ``outputs/<name>/latest`` links to the newest (a ``latest`` there that is not a link is refused,
    never replaced); the folder chosen is logged. A folder named here that holds another run's files
    is refused unless ``resume`` or ``overwrite`` is set, and so is a path with a control character
    (newline, NUL, ...) or a component over 255 bytes."""
    device: str = "auto"
    """The server's device: ``auto`` (CUDA if present, else MPS, else the CPU), ``cpu``, ``cuda``,
    ``cuda:N`` or ``mps``."""
    client_device: str = "auto"
    """The clients' device, the same choices. In a simulation a client sees a GPU only with
    ``resources.client_gpus > 0``; ``cuda`` without it is refused."""
    round_timeout: float = 3600.0
    """Seconds the server waits for a round's replies; a client that has not replied by then is left
    out of the round (logged with its id)."""
    checkpoint: bool = True
    """Write ``checkpoint.pt`` (the server's state) after every round, and let clients keep their
    state (SCAFFOLD's c_i) on disk."""
    resume: bool = False
    """Continue from ``output_dir/checkpoint.pt`` (or ``checkpoint.prev.pt``) if there is one, or
    without ``output_dir`` from the run ``outputs/<name>/latest`` names (none yet: a new run); a run
    that stopped before its first checkpoint starts again. The configuration must equal the
    checkpoint's except for ``rounds``, ``resume``, ``overwrite``, ``strict``, ``round_timeout``,
    ``faults``, ``checkpoint``, ``device``, ``client_device``, ``resources``, ``eval``, ``logging``,
    ``name`` and ``output_dir``; raising ``rounds`` extends a finished run. A checkpoint whose
    values do not fit the configured run (its model's shapes or dtypes, non-finite or huge values, a
    round beyond ``rounds``) is refused with one error naming the file, as is resuming a finished
    run without raising ``rounds`` ([running.md](running.md), *Checkpoints are data, checked on
    load*)."""
    overwrite: bool = False
    """Replace the earlier run in ``output_dir``. Without it (or ``resume``), a folder that holds a
    run's files (``metrics.jsonl``, ``summary.json``, ``model.pt``, checkpoints, FedGO's files) is
    refused before anything is written."""
    strict: bool = False
    """Refuse, instead of dropping with a warning, every key of the configuration that the run
    would not use: a parameter of another strategy (``strategy.mu`` with ``strategy.name:
    fedavg``; without ``strict`` it is dropped with a WARNING, so that swapping
    ``strategy.name`` stays a one-line change), and a key set that the strategy ignores
    (``strategy.generator.steps`` for ``dafkd``). A key that no strategy or section knows is an
    error either way. The check only: it changes no result."""
    faults: list[FaultConfig] = field(default_factory=list)
    """Deliberate client failures for tests and demos, e.g. ``[{partition: 1, round: 2, kind:
    crash}]``. Only nodes that opted in act them out (node config ``allow-faults=true``; simulated
    nodes: ``FEDGO_ALLOW_FAULTS=1``, which ``./run.sh`` sets); other nodes ignore them with a
    WARNING."""
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    @property
    def clients_per_round(self) -> int:
        """Number of clients sampled each round: ``max(min_clients, floor(fraction * K))``."""
        return max(self.min_clients, int(self.fraction * self.data.num_clients + 1e-9))

    def to_dict(self, strategy_params: bool = True) -> dict[str, Any]:
        """Plain data; without ``strategy_params`` the strategy section holds its name only."""
        out = {
            f.name: dataclasses.asdict(getattr(self, f.name))
            if dataclasses.is_dataclass(getattr(self, f.name))
            else copy.deepcopy(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if f.name not in ("strategy", "faults")
        }
        out["faults"] = [dataclasses.asdict(f) for f in self.faults]
        out["strategy"] = {"name": self.strategy.name}
        if strategy_params:
            out["strategy"].update(self.strategy.raw_params)
        return {f.name: out[f.name] for f in dataclasses.fields(self)}

    def to_json(self, strategy_params: bool = True) -> str:
        return json.dumps(self.to_dict(strategy_params), sort_keys=True, allow_nan=False)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_dict(
        cls, raw: Mapping[str, Any], sources: Mapping[str, str] | None = None
    ) -> ExperimentConfig:
        """Build and check the core sections of a plain mapping (raises :class:`ConfigError`).

        The strategy's own parameters stay an unchecked mapping in ``strategy.params``.
        """
        checker = Checker(sources)
        raw = dict(raw)
        strategy = raw.pop("strategy", None)
        strategy = {} if strategy is None else strategy
        if not isinstance(strategy, Mapping):
            checker.at("").fail("strategy", "must be a mapping of keys", strategy)
        params = dict(strategy)
        name = params.pop("name", StrategyConfig.name)
        if not isinstance(name, str):
            checker.at("strategy.").fail("name", "must be a str", name)
        cfg = build_section(cls, raw, checker=checker)
        cfg.strategy = StrategyConfig(name=name, params=params, sources=dict(sources or {}))
        return cfg

    @classmethod
    def from_json(cls, text: str) -> ExperimentConfig:
        return cls.from_dict(json.loads(text))

    def check(self, c: Checker) -> None:
        """Checks of the top-level keys and of what spans sections."""
        k = self.data.num_clients
        c.require("seed", self.seed >= 0, "must be >= 0")
        c.require("rounds", self.rounds >= 1, "must be >= 1")
        c.require("fraction", 0 < self.fraction <= 1, "must be in (0, 1]")
        c.require("min_clients", self.min_clients >= 1, "must be >= 1")
        c.require("min_clients", self.min_clients <= k, f"must be <= data.num_clients ({k})")
        c.require(
            "output_dir",
            self.output_dir is None or bool(self.output_dir),
            "must not be empty",
        )
        if self.output_dir is not None:
            problem = path_problem(self.output_dir)
            c.require("output_dir", problem is None, f"{problem}: not a folder name")
        c.require(
            "name",
            self.output_dir is not None
            or (
                NAME_PATTERN.fullmatch(self.name) is not None
                and len(self.name.encode()) <= MAX_NAME_BYTES
            ),
            "must be a plain folder name when output_dir is not set (letters, digits, '.', "
            f"'_', '+', '-'; not starting with '.'; at most {MAX_NAME_BYTES} bytes)",
        )
        problem = unprintable(self.name)  # the name is in every log line and summary.json
        c.require("name", problem is None, f"{problem}")
        c.require("round_timeout", self.round_timeout > 0, "must be > 0 (seconds)")
        c.require(
            "round_timeout",
            self.round_timeout <= MAX_SECONDS,
            f"must be <= {MAX_SECONDS} (30 days)",
        )
        c.at("model.", self.model).require(
            "client_models",
            len(self.model.client_models) <= k,
            f"{len(self.model.client_models)} names, more than data.num_clients ({k}): one per "
            "client, or a shorter list repeated over the partition ids",
        )
        for i, fault in enumerate(self.faults):
            c.at(f"faults[{i}].", fault).require(
                "partition", fault.partition < k, f"must be < data.num_clients ({k})"
            )
        for key in ("device", "client_device"):
            ok = bool(DEVICE_PATTERN.match(getattr(self, key)))
            c.require(key, ok, "must be auto, cpu, mps, cuda or cuda:N")


# ------------------------------------------------------------------------------------------
# Loading files and overrides
# ------------------------------------------------------------------------------------------


OVERRIDE_KEY = re.compile(r"[A-Za-z_][\w.]*")
"""The dotted key of an override ``key=value``."""


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``a.b=value`` into the dotted key and the YAML-parsed value."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key or not OVERRIDE_KEY.fullmatch(key):
        problem = "expected dotted.key=value (only the first argument names a config file)"
        raise ConfigError("override", text, problem, "command line")
    try:
        parsed = load_yaml(value, key) if value.strip() else None
    except yaml.YAMLError:
        parsed = value
    except Refused as exc:
        shown = value if exc.key is None else exc.value
        raise ConfigError(exc.key or key, shown, exc.problem, f"override '{text}'") from None
    return key, parsed


DEFAULT_CONFIG = "conf/default.yaml"
"""The experiment ``./run.sh`` and ``./run.sh --local`` run when no file is named."""


def config_and_overrides(first: str | None, rest: Iterable[str] = ()) -> tuple[str, list[str]]:
    """The config file and overrides of a command line ``[CONFIG.yaml] [k=v ...]``: a first
    word that is no file but ``key=value`` is an override of :data:`DEFAULT_CONFIG`
    (``./run.sh rounds=3``), as no first word means that file too."""
    rest = list(rest)
    if first is None:
        return DEFAULT_CONFIG, rest
    key = first.partition("=")[0].strip() if "=" in first else ""
    if OVERRIDE_KEY.fullmatch(key) and not Path(first).expanduser().is_file():
        return DEFAULT_CONFIG, [first, *rest]
    return first, rest


def split_overrides(overrides: str | Iterable[str] | None) -> list[str]:
    """Accept overrides as one shell-like string or as a list of ``k=v`` items."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        return shlex.split(overrides)
    return [o for o in overrides if o]


def load_config(
    path: str | Path | None = None,
    overrides: str | Iterable[str] | None = None,
    search_dirs: Iterable[Path] = (),
) -> ExperimentConfig:
    """Load a YAML experiment, apply overrides and validate everything.

    A relative ``path`` is looked up in the current directory, then in ``search_dirs`` (the
    Flower app directory, so ``conf/x.yaml`` also works inside a submitted Flower app).
    """
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if path is not None:
        resolved = resolve_config_path(path, search_dirs)
        merged, sources = read_yaml(resolved)
        sources[""] = str(resolved)
    for item in split_overrides(overrides):
        key, value = parse_override(item)
        node = merged
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(key, value, f"'{part}' is not a section", f"override '{item}'")
            node = child
        node[parts[-1]] = value
        sources[key] = f"override '{item}'"
    return ExperimentConfig.from_dict(merged, sources)


def resolve_config_path(path: str | Path, search_dirs: Iterable[Path] = ()) -> Path:
    candidate = Path(path).expanduser()
    if candidate.is_absolute() or candidate.is_file():
        return candidate.resolve()
    for directory in search_dirs:
        if (Path(directory) / candidate).is_file():
            return (Path(directory) / candidate).resolve()
    problem = "a folder, not a YAML file" if candidate.is_dir() else "file not found"
    raise ConfigError("config", str(path), problem)
