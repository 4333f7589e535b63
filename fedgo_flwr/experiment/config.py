"""Experiment configuration: the core sections, YAML files and command-line overrides.

One YAML file describes one experiment. A file may start from another with ``base: other.yaml``
(resolved relative to the file); keys are merged recursively, the later file winning. Overrides
``dotted.key=value`` (value parsed as YAML) are applied last. :func:`load_config` validates the
core sections below (built by :func:`fedgo_flwr.experiment.schema.build_section`); the first problem
stops with one :class:`ConfigError` naming the key, the bad value and where it came from.

The YAML reader refuses what a configuration never means but YAML would silently accept: an
empty file (it would run the defaults), a key given twice in one mapping (the last would win), a
file that is not UTF-8 text, an integer of more than ``MAX_DIGITS`` digits, nesting deeper than
``MAX_DEPTH`` levels and more than ``MAX_NODES`` values once aliases are expanded (these would
crash or exhaust the reader instead).

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

from fedgo_flwr.experiment.names import (
    DATASET_NAMES,
    HF_PREFIX,
    MAX_NAME_BYTES,
    MODEL_NAMES,
    NAME_PATTERN,
    PARTITION_SCHEMES,
    PRECISIONS,
    is_dataset_name,
    path_problem,
    unprintable,
)
from fedgo_flwr.experiment.schema import Checker, ConfigError, build_section

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
    path: str | None = None
    download: bool = False
    num_clients: int = 20
    alpha: float = 0.1
    server_fraction: float = 0.5
    min_client_size: int = 2
    augment: bool = True
    train_subset: int | None = field(default=None, metadata={"max": 2**31 - 1})
    test_subset: int | None = field(default=None, metadata={"max": 2**31 - 1})
    public_path: str | None = None
    partition: str = "dirichlet"
    quantity_sigma: float = 0.0
    classes_per_client: int | None = None

    def check(self, c: Checker) -> None:
        names = ", ".join(DATASET_NAMES)
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
        if self.dataset == "imagefolder":
            c.require("path", bool(self.path), "imagefolder needs data.path")
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
    """Model architecture by name (see ``fedgo_flwr.experiment.names.MODEL_NAMES``).

    ``name`` is the server's (global) model. ``client_models`` lets clients train other
    architectures, as in one-shot FL's "model market" (Co-Boosting, Dai et al., ICLR 2024,
    Sec. 3): client ``k`` trains ``client_models[k % len(client_models)]``
    (:func:`fedgo_flwr.experiment.task.client_model_name`); empty, every client trains ``name``.
    Only a strategy that declares ``supports_heterogeneous_models`` accepts names other than
    ``name``.
    """

    name: str = "cnn"
    client_models: list[str] = field(default_factory=list)

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
    batch_size: int = 16
    optimizer: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0

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
    every: int = 1
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
    WARNING and the run goes on (:mod:`fedgo_flwr.experiment.tracking`)."""
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
    client_gpus: float = 0.0
    server_cpus: int | None = None
    server_cpus_waiting: int | None = None
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

    ``output_dir`` unset (``None``) means a new folder ``outputs/<name>/<date-time>`` for every
    run; the run's entry point sets it to that folder before anything is written
    (:func:`fedgo_flwr.experiment.recorder.decide_output_dir`).
    """

    name: str = "default"
    seed: int = field(default=0, metadata={"max": 2**32 - 1})
    rounds: int = 40
    fraction: float = 0.4
    min_clients: int = 1
    output_dir: str | None = None
    device: str = "auto"
    client_device: str = "auto"
    round_timeout: float = 3600.0
    checkpoint: bool = True
    resume: bool = False
    overwrite: bool = False
    strict: bool = False
    """Refuse, instead of dropping with a warning, every key of the configuration that the run
    would not use: a parameter of another strategy (``strategy.mu`` with ``strategy.name:
    fedavg``; without ``strict`` it is dropped with a WARNING, so that swapping
    ``strategy.name`` stays a one-line change), and a key set that the strategy ignores
    (``strategy.generator.steps`` for ``dafkd``). A key that no strategy or section knows is an
    error either way. The check only: it changes no result."""
    faults: list[FaultConfig] = field(default_factory=list)
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


def _merge(
    dst: dict[str, Any],
    src: Mapping[str, Any],
    sources: dict[str, str],
    source: str,
    prefix: str = "",
) -> None:
    for key, value in src.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and isinstance(dst.get(key), dict):
            _merge(dst[key], value, sources, source, f"{dotted}.")
        else:
            dst[key] = copy.deepcopy(value)
            sources[dotted] = source
            if isinstance(value, Mapping):
                for sub in _flat_keys(value, f"{dotted}."):
                    sources[sub] = source


def _flat_keys(mapping: Mapping[str, Any], prefix: str) -> Iterable[str]:
    for key, value in mapping.items():
        yield f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _flat_keys(value, f"{prefix}{key}.")


MAX_DIGITS = 100
"""Longest integer literal read (Python refuses to convert more than 4300 digits)."""
MAX_DEPTH = 50
"""Deepest nesting of mappings and lists read (far below Python's recursion limit)."""
MAX_NODES = 100_000
"""Most values read, aliases expanded (a few nested aliases can stand for billions)."""

_MERGE_TAG = "tag:yaml.org,2002:merge"
_INT_TAG = "tag:yaml.org,2002:int"


class _Refused(Exception):
    """A YAML text that parses but is refused: ``key`` (dotted, or ``None``: the whole text)."""

    def __init__(self, key: str | None, value: Any, problem: str) -> None:
        super().__init__(problem)
        self.key, self.value, self.problem = key, value, problem


def _load_yaml(text: str, prefix: str = "") -> Any:
    """``text`` parsed by PyYAML's safe loader, after checking the node tree (see the module
    docstring); ``prefix`` is the dotted key the text is the value of (an override's).

    Raises :class:`yaml.YAMLError` for text that is not YAML and :class:`_Refused` otherwise.
    """
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_node(node, prefix.rstrip("."), 0, [0])
        return loader.construct_document(node)
    except RecursionError:
        raise _Refused(None, None, f"nested too deeply (at most {MAX_DEPTH} levels)") from None
    finally:
        loader.dispose()


def _check_node(node: yaml.Node, key: str, depth: int, count: list[int]) -> None:
    """Refuse duplicate keys, overlong integers, deep nesting and alias bombs below ``node``."""
    count[0] += 1
    if count[0] > MAX_NODES:
        raise _Refused(None, None, f"too large: more than {MAX_NODES} values, aliases expanded")
    if depth > MAX_DEPTH:
        raise _Refused(None, None, f"nested too deeply (at most {MAX_DEPTH} levels)")
    if isinstance(node, yaml.ScalarNode):
        if node.tag == _INT_TAG and len(node.value) > MAX_DIGITS:
            problem = f"too many digits ({len(node.value)}; at most {MAX_DIGITS})"
            raise _Refused(key or None, node.value, problem)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_node(item, f"{key}[{i}]", depth + 1, count)
    elif isinstance(node, yaml.MappingNode):
        seen: dict[tuple[str, str], int] = {}
        for key_node, value_node in node.value:
            _check_node(key_node, key, depth + 1, count)
            dotted = key
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE_TAG:
                dotted = f"{key}.{key_node.value}" if key else key_node.value
                line = key_node.start_mark.line + 1
                ident = (key_node.tag, key_node.value)
                if ident in seen:
                    shown = value_node.value if isinstance(value_node, yaml.ScalarNode) else "..."
                    problem = f"duplicate key (line {seen[ident]}, again on line {line})"
                    raise _Refused(dotted, shown, problem)
                seen[ident] = line
            _check_node(value_node, dotted, depth + 1, count)


def _yaml_problem(exc: yaml.YAMLError, text: str) -> str:
    """One line for a YAML syntax error: where (line, column, the line), what, and what the
    parser was reading (e.g. a string left open on an earlier line)."""
    mark = getattr(exc, "problem_mark", None)
    what = " ".join(str(getattr(exc, "problem", None) or exc).split())
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and context_mark is not None:
        what += f" ({context} {_where(context_mark, text)})"
    return f"not valid YAML {_where(mark, text)}: {what}" if mark else f"not valid YAML: {what}"


def _where(mark: Any, text: str) -> str:
    """``at line L, column C ('the line')`` of a YAML mark (the line's text when it has one)."""
    lines = text.splitlines()
    shown = lines[mark.line].strip() if mark.line < len(lines) else ""
    at = f"at line {mark.line + 1}, column {mark.column + 1}"
    return f"{at} ({shown[:60]!r})" if shown else at


def _read_yaml(path: Path, chain: tuple[Path, ...] = ()) -> tuple[dict[str, Any], dict[str, str]]:
    if not path.is_file():
        problem = "a folder, not a YAML file" if path.is_dir() else "file not found"
        if chain:  # named by the 'base:' key of the file before it
            raise ConfigError("base", str(path), problem, str(chain[-1]))
        raise ConfigError("config", str(path), problem)
    if path in chain:
        raise ConfigError("base", str(path), "circular 'base:' chain", str(chain[-1]))
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        problem = f"not a UTF-8 text file (byte {exc.start} is not UTF-8)"
        raise ConfigError("config", str(path), problem) from None
    except OSError as exc:
        raise ConfigError("config", str(path), f"cannot be read: {exc.strerror}") from None
    try:
        raw = _load_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError("config", str(path), _yaml_problem(exc, text)) from None
    except _Refused as exc:
        if exc.key is None:
            raise ConfigError("config", str(path), exc.problem) from None
        raise ConfigError(exc.key, exc.value, exc.problem, str(path)) from None
    if raw is None:
        problem = "the file is empty: an experiment needs at least one key (e.g. base: base.yaml)"
        raise ConfigError("config", str(path), problem)
    if not isinstance(raw, dict):
        raise ConfigError("config", str(path), "the file must hold a mapping of keys")
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    base = raw.pop("base", None)
    if base is not None:
        if not isinstance(base, str):
            raise ConfigError("base", base, "must be a file name", str(path))
        merged, sources = _read_yaml((path.parent / base).resolve(), (*chain, path))
    _merge(merged, raw, sources, str(path))
    return merged, sources


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
        parsed = _load_yaml(value, key) if value.strip() else None
    except yaml.YAMLError:
        parsed = value
    except _Refused as exc:
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
        merged, sources = _read_yaml(resolved)
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
