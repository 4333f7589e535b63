"""fedgo-flwr: federated ensemble distillation (FedGO and its peers) on Flower.

The Python API (docs/running.md, "Python API")::

    from fedgo_flwr import load_experiment, run, load_model

    cfg = load_experiment("conf/default.yaml", {"rounds": 3})
    result = run(cfg)                      # in this process, as ./run.sh --local
    model = load_model(result.output_dir)  # model.pt in the architecture of config.yaml

The names are imported when first used (:func:`__getattr__`), so ``import fedgo_flwr``, which
every submodule's import runs, imports nothing else: reading a config stays free of torch and
Flower. They live in :mod:`fedgo_app.api` (and the config classes in
:mod:`fedgo_flwr.config`).
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "ExperimentConfig",
    "RunResult",
    "load_experiment",
    "load_model",
    "run",
]


def __getattr__(name: str) -> object:
    """The API's names, imported on first use (a module ``__getattr__``, PEP 562)."""
    if name in ("ConfigError", "ExperimentConfig"):
        from fedgo_flwr.config import experiment as config

        return getattr(config, name)
    if name in ("RunResult", "load_experiment", "load_model", "run"):
        from fedgo_app import api

        return getattr(api, name)
    raise AttributeError(f"module 'fedgo_flwr' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
