"""Experiment configuration: YAML files, command-line overrides and validation.

One YAML file describes one experiment. A file may start from another with ``base: other.yaml``
(resolved relative to the file); keys are merged recursively, the later file winning. Overrides
``dotted.key=value`` (value parsed as YAML) are applied last. The whole result is validated before
anything starts; the first problem stops the run with one :class:`ConfigError` naming the key, the
bad value and where it came from (file or override).

The schema is the set of dataclasses below; every field is documented in README.md.
Strategy-specific parameters (``strategy.mu`` for FedProx, ...) are declared by each strategy and
validated by :func:`strategies.validate_strategy_params`.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import re
import shlex
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DEVICE_PATTERN = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
OPTIMIZERS = ("sgd", "adam")


class ConfigError(ValueError):
    """A configuration value is missing, unknown, mistyped or out of range."""

    def __init__(self, key: str, value: Any, problem: str, source: str | None = None) -> None:
        self.key, self.value, self.problem, self.source = key, value, problem, source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{key} = {value!r}: {problem}")


# ------------------------------------------------------------------------------------------
# Schema
# ------------------------------------------------------------------------------------------


@dataclass
class DataConfig:
    """Dataset and partition (FedGO paper Sec. 4: server share + Dirichlet client split)."""

    dataset: str = "digits"
    path: str | None = None
    download: bool = False
    num_clients: int = 20
    alpha: float = 0.1
    server_fraction: float = 0.5
    min_client_size: int = 2
    augment: bool = True
    train_subset: int | None = None

    def check(self, err: _Checker) -> None:
        from fedgo_flwr.data import DATASET_NAMES

        err.choice("data.dataset", self.dataset, DATASET_NAMES)
        err.require("data.num_clients", self.num_clients, self.num_clients >= 1, "must be >= 1")
        err.require("data.alpha", self.alpha, self.alpha > 0, "must be > 0")
        err.require(
            "data.server_fraction",
            self.server_fraction,
            0 <= self.server_fraction < 1,
            "must be in [0, 1)",
        )
        err.require(
            "data.min_client_size", self.min_client_size, self.min_client_size >= 1, "must be >= 1"
        )
        if self.train_subset is not None:
            err.require(
                "data.train_subset", self.train_subset, self.train_subset >= 1, "must be >= 1"
            )
        if self.dataset == "imagefolder":
            err.require("data.path", self.path, bool(self.path), "imagefolder needs data.path")


@dataclass
class ModelConfig:
    """Model architecture by name (see ``fedgo_flwr.models.MODEL_NAMES``)."""

    name: str = "cnn"

    def check(self, err: _Checker) -> None:
        from fedgo_flwr.models import MODEL_NAMES

        err.choice("model.name", self.name, MODEL_NAMES)


@dataclass
class TrainConfig:
    """Client-side local training (the same for every strategy unless it says otherwise)."""

    local_epochs: int = 1
    batch_size: int = 32
    optimizer: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0

    def check(self, err: _Checker) -> None:
        err.require("train.local_epochs", self.local_epochs, self.local_epochs >= 1, "must be >= 1")
        err.require("train.batch_size", self.batch_size, self.batch_size >= 1, "must be >= 1")
        err.choice("train.optimizer", self.optimizer, OPTIMIZERS)
        err.require("train.lr", self.lr, self.lr > 0, "must be > 0")
        err.require("train.momentum", self.momentum, 0 <= self.momentum < 1, "must be in [0, 1)")
        err.require("train.weight_decay", self.weight_decay, self.weight_decay >= 0, "must be >= 0")


@dataclass
class EvalConfig:
    """Server-side evaluation of the global model on the test split."""

    batch_size: int = 512
    every: int = 1

    def check(self, err: _Checker) -> None:
        err.require("eval.batch_size", self.batch_size, self.batch_size >= 1, "must be >= 1")
        err.require("eval.every", self.every, self.every >= 1, "must be >= 1")


@dataclass
class ResourcesConfig:
    """Ray resources of one simulated ClientApp (fractional GPUs spread clients over GPUs)."""

    client_cpus: int = 1
    client_gpus: float = 0.0
    server_cpus: int | None = None

    def check(self, err: _Checker) -> None:
        err.require(
            "resources.client_cpus", self.client_cpus, self.client_cpus >= 1, "must be >= 1"
        )
        err.require(
            "resources.client_gpus", self.client_gpus, self.client_gpus >= 0, "must be >= 0"
        )
        if self.server_cpus is not None:
            err.require(
                "resources.server_cpus", self.server_cpus, self.server_cpus >= 1, "must be >= 1"
            )


FAULT_KINDS = ("crash", "hang", "nan", "shape", "exit")


@dataclass
class FaultSpec:
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

    def check(self, err: _Checker, key: str) -> None:
        err.require(f"{key}.partition", self.partition, self.partition >= 0, "must be >= 0")
        err.require(f"{key}.round", self.round, self.round >= 0, "must be >= 0 (0: every round)")
        err.choice(f"{key}.kind", self.kind, FAULT_KINDS)
        err.require(f"{key}.seconds", self.seconds, self.seconds >= 0, "must be >= 0")

    def applies(self, partition_id: int, server_round: int) -> bool:
        return self.partition == partition_id and self.round in (0, server_round)


@dataclass
class StrategyConfig:
    """Server algorithm by name plus its own parameters (flat keys beside ``name``)."""

    name: str = "fedavg"
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class ExperimentConfig:
    """A whole experiment. ``to_dict``/``from_dict`` round-trip it (clients get it as JSON)."""

    name: str = "default"
    seed: int = 0
    rounds: int = 10
    fraction: float = 0.4
    min_clients: int = 1
    output_dir: str = "outputs/default"
    device: str = "auto"
    round_timeout: float = 3600.0
    checkpoint: bool = True
    resume: bool = False
    faults: list[FaultSpec] = field(default_factory=list)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)

    @property
    def clients_per_round(self) -> int:
        """Number of clients sampled each round: ``max(min_clients, floor(fraction * K))``."""
        return max(self.min_clients, int(self.fraction * self.data.num_clients + 1e-9))

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        params = out["strategy"].pop("params")
        out["strategy"].update(params)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], sources: Mapping[str, str] | None = None) -> Any:
        """Build and validate a config from a plain mapping (raises :class:`ConfigError`)."""
        checker = _Checker(sources or {})
        cfg = _build(cls, dict(raw), "", checker)
        cfg.check(checker)
        return cfg

    @classmethod
    def from_json(cls, text: str) -> ExperimentConfig:
        return cls.from_dict(json.loads(text))

    def check(self, err: _Checker) -> None:
        err.require("seed", self.seed, self.seed >= 0, "must be >= 0")
        err.require("rounds", self.rounds, self.rounds >= 1, "must be >= 1")
        err.require("fraction", self.fraction, 0 < self.fraction <= 1, "must be in (0, 1]")
        err.require("min_clients", self.min_clients, self.min_clients >= 1, "must be >= 1")
        err.require(
            "min_clients",
            self.min_clients,
            self.min_clients <= self.data.num_clients,
            f"must be <= data.num_clients ({self.data.num_clients})",
        )
        err.require("output_dir", self.output_dir, bool(self.output_dir), "must not be empty")
        err.require(
            "round_timeout", self.round_timeout, self.round_timeout > 0, "must be > 0 (seconds)"
        )
        for i, fault in enumerate(self.faults):
            fault.check(err, f"faults[{i}]")
            err.require(
                f"faults[{i}].partition",
                fault.partition,
                fault.partition < self.data.num_clients,
                f"must be < data.num_clients ({self.data.num_clients})",
            )
        err.require(
            "device",
            self.device,
            bool(DEVICE_PATTERN.match(self.device)),
            "must be auto, cpu, mps, cuda or cuda:N",
        )
        for sub in (self.data, self.model, self.train, self.eval, self.resources):
            sub.check(err)
        from strategies import STRATEGIES, validate_strategy_params

        err.choice("strategy.name", self.strategy.name, tuple(STRATEGIES))
        self.strategy.params = validate_strategy_params(
            self.strategy.name, self.strategy.params, err
        )


# ------------------------------------------------------------------------------------------
# Building dataclasses from mappings with type checks
# ------------------------------------------------------------------------------------------


class _Checker:
    """Raises :class:`ConfigError` with the source (file or override) of the offending key."""

    def __init__(self, sources: Mapping[str, str]) -> None:
        self.sources = sources

    def source_of(self, key: str) -> str | None:
        key = re.sub(r"\[\d+\]", "", key)
        while key:
            if key in self.sources:
                return self.sources[key]
            key = key.rpartition(".")[0]
        return self.sources.get("")

    def fail(self, key: str, value: Any, problem: str) -> typing.NoReturn:
        raise ConfigError(key, value, problem, self.source_of(key))

    def require(self, key: str, value: Any, ok: bool, problem: str) -> None:
        if not ok:
            self.fail(key, value, problem)

    def choice(self, key: str, value: Any, allowed: Iterable[str]) -> None:
        allowed = tuple(allowed)
        if value not in allowed:
            self.fail(key, value, f"unknown; choose one of {', '.join(allowed)}")


def _type_ok(value: Any, tp: Any) -> tuple[bool, Any]:
    """Check ``value`` against a simple annotation; ints are accepted (and cast) for floats."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            ok, cast = _type_ok(value, arg)
            if ok:
                return True, cast
        return False, value
    if tp is type(None):
        return value is None, value
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return True, float(value)
        return False, value
    if tp is str:
        return isinstance(value, str), value
    return True, value


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _list_item_dataclass(tp: Any) -> type | None:
    """``X`` if ``tp`` is ``list[X]`` with ``X`` a dataclass, else ``None``."""
    if typing.get_origin(tp) is list:
        (arg,) = typing.get_args(tp)
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def _build(
    cls: type, raw: dict[str, Any], prefix: str, err: _Checker, owner: str | None = None
) -> Any:
    """Instantiate dataclass ``cls`` from ``raw``, checking keys and types recursively.

    A ``ValueError`` raised by the dataclass itself (its range checks in ``__post_init__``)
    becomes a :class:`ConfigError`; if its message starts with a field name, that field is named.
    """
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    if cls is StrategyConfig:
        raw = dict(raw)
        name = raw.pop("name", StrategyConfig.name)
        if not isinstance(name, str):
            err.fail(f"{prefix}name", name, "must be a str")
        return StrategyConfig(name=name, params=raw)
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
            if owner is not None:
                known = ", ".join(names) or "none"
                err.fail(
                    dotted, value, f"not a parameter of {owner}{hint} (its parameters: {known})"
                )
            err.fail(dotted, value, f"unknown key{hint}; known keys: {', '.join(names)}")
        tp = hints[key]
        item_tp = _list_item_dataclass(tp)
        if item_tp is not None:
            if value is None:
                value = []
            if not isinstance(value, list):
                err.fail(dotted, value, "must be a list of mappings")
            items = []
            for i, item in enumerate(value):
                if not isinstance(item, Mapping):
                    err.fail(f"{dotted}[{i}]", item, "must be a mapping of keys")
                items.append(_build(item_tp, dict(item), f"{dotted}[{i}].", err))
            kwargs[key] = items
            continue
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, Mapping):
                err.fail(dotted, value, "must be a mapping of keys")
            kwargs[key] = _build(tp, dict(value), f"{dotted}.", err)
            continue
        ok, cast = _type_ok(value, tp)
        if not ok:
            err.fail(dotted, value, f"must be {_type_name(tp)}, got {type(value).__name__}")
        kwargs[key] = cast
    try:
        return cls(**kwargs)
    except ValueError as exc:
        field_name, _, rest = str(exc).partition(" ")
        if field_name in names and rest:
            err.fail(f"{prefix}{field_name}", kwargs.get(field_name, raw.get(field_name)), rest)
        err.fail(prefix.rstrip(".") or cls.__name__, raw, str(exc))


def build_section(cls: type, raw: Mapping[str, Any], prefix: str, owner: str | None = None) -> Any:
    """Build a dataclass section defined outside this module (e.g. a strategy's ``Params``)."""
    return _build(cls, dict(raw), prefix, _Checker({}), owner)


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


def _read_yaml(path: Path, chain: tuple[Path, ...] = ()) -> tuple[dict[str, Any], dict[str, str]]:
    if not path.is_file():
        raise ConfigError("config", str(path), "file not found")
    if path in chain:
        raise ConfigError("base", str(path), "circular 'base:' chain", str(chain[-1]))
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError("config", str(path), f"not valid YAML: {exc}") from None
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


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``a.b=value`` into the dotted key and the YAML-parsed value."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key or not re.fullmatch(r"[A-Za-z_][\w.]*", key):
        raise ConfigError("override", text, "expected dotted.key=value", "command line")
    try:
        parsed = yaml.safe_load(value) if value.strip() else None
    except yaml.YAMLError:
        parsed = value
    return key, parsed


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
    raise ConfigError("config", str(path), "file not found")
