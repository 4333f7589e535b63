"""Server algorithms, one module per strategy, found by name (``strategies/<name>.py``).

Each module defines one strategy class (a subclass of :class:`strategies.base.Strategy`) whose
``name`` is the module's name. The class names its client-side algorithm (``client_algorithm``,
a module of ``clients/``) and declares its YAML parameters as a ``Config`` dataclass. Adding an
algorithm is ``strategies/<x>.py`` + ``clients/<x>.py`` + ``conf/<x>.yaml``: nothing here lists
them (the FL-bench convention).

:func:`load_experiment` is how the apps read an experiment: the core sections come from
:func:`fedgo_flwr.config.experiment.load_config`, then the strategy's own parameters are built,
once, into its typed ``Config`` (``cfg.strategy.params``), which travels from there.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fedgo_flwr.config.experiment import ExperimentConfig, load_config
from fedgo_flwr.config.schema import Checker, ConfigError, build_section
from fedgo_flwr.runtime.plugins import load_class, module_names
from strategies.base import Strategy

log = logging.getLogger("fedgo_flwr")

__all__ = [
    "ConfigError",
    "Strategy",
    "available",
    "build_params",
    "is_resolved",
    "load_experiment",
    "require_resolved",
    "resolve",
    "strategy_class",
]


def available() -> list[str]:
    """Names of every strategy module in this package."""
    return module_names(sys.modules[__name__])


def strategy_class(name: str) -> type[Strategy]:
    """The strategy class of module ``strategies.<name>`` (``ValueError`` if there is none)."""
    return load_class(sys.modules[__name__], name, Strategy, "strategy")


def _others_with(key: str, name: str) -> list[str]:
    """Strategies other than ``name`` that have a parameter ``key``."""
    found = []
    for other in available():
        if other != name:
            config = strategy_class(other).Config
            if key in {f.name for f in dataclasses.fields(config)}:
                found.append(other)
    return found


def build_params(cfg: ExperimentConfig) -> Any:
    """``cfg.strategy.params`` built into the strategy's typed ``Config`` (once; idempotent).

    Swapping ``strategy.name`` must be a one-line change, so parameters of *other* strategies
    are dropped with a warning (with ``strict: true``, an error naming the first of them); a
    key no strategy knows is an error naming it.
    """
    strategy = cfg.strategy
    checker = Checker(strategy.sources)
    try:
        cls = strategy_class(strategy.name)
    except ValueError:
        checker.at("strategy.", strategy).choice("name", available())
        raise
    if isinstance(strategy.params, cls.Config):
        return strategy.params
    own = {f.name for f in dataclasses.fields(cls.Config)}
    kept = {}
    for key, value in strategy.raw_params.items():
        if key not in own:
            others = _others_with(key, strategy.name)
            if others:
                whose = f"a parameter of {', '.join(others)}, not of {strategy.name}"
                if cfg.strict:
                    checker.at("strategy.").fail(key, f"{whose} (strict: true refuses it)", value)
                log.warning(
                    "strategy.%s ignored: %s (strict: true makes this an error)", key, whose
                )
                continue
        kept[key] = value
    params = build_section(cls.Config, kept, "strategy.", owner=strategy.name, checker=checker)
    cls.check_config(params, checker.at("strategy.", params), cfg)
    return params


def load_experiment(
    path: str | Path | None = None,
    overrides: str | Iterable[str] | None = None,
    search_dirs: Iterable[Path] = (),
) -> ExperimentConfig:
    """Load, check and type a whole experiment (raises :class:`ConfigError`).

    As :func:`fedgo_flwr.config.experiment.load_config`, then the strategy's parameters are built
    into its ``Config`` and stored in ``cfg.strategy.params``.
    """
    return resolve(load_config(path, overrides, search_dirs))


def resolve(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` with typed strategy parameters (built here if they are still a mapping).

    Once per run, where the config is read (:func:`load_experiment`); what runs it afterwards
    (the pre-flight check, the ServerApp's run) takes it resolved (:func:`require_resolved`).
    """
    cfg.strategy.params = build_params(cfg)
    return cfg


def is_resolved(cfg: ExperimentConfig) -> bool:
    """Whether ``cfg.strategy.params`` is already its strategy's typed ``Config``."""
    return isinstance(cfg.strategy.params, strategy_class(cfg.strategy.name).Config)


def require_resolved(cfg: ExperimentConfig, user: str) -> ExperimentConfig:
    """``cfg``, if its strategy's parameters are typed (``TypeError`` naming ``user`` if not)."""
    if not is_resolved(cfg):
        raise TypeError(
            f"{user} needs a resolved config (cfg.strategy.params built into "
            f"{strategy_class(cfg.strategy.name).Config.__name__}): load the experiment with "
            "strategies.load_experiment, or pass it through strategies.resolve once"
        )
    return cfg
