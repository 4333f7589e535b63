"""The Python API: load an experiment, run it in this process, load a run's model.

``from fedgo_flwr import load_experiment, run, load_model`` (the package re-exports these
names lazily: ``import fedgo_flwr`` imports neither torch nor Flower)::

    cfg = load_experiment("conf/default.yaml", {"rounds": 3, "data.num_clients": 4})
    result = run(cfg)                     # as ./run.sh --local: the same files and numbers
    result.summary["final_accuracy"], result.output_dir
    model = load_model(result.output_dir) # the final global model, in eval mode

- :func:`load_experiment` reads a YAML file and overrides into a checked, resolved
  :class:`~fedgo_flwr.config.experiment.ExperimentConfig`; a bad key, value or file raises one
  :class:`~fedgo_flwr.config.schema.ConfigError` naming it (as ``./run.sh`` exits 2).
- :func:`run` runs it with :func:`fedgo_app.inprocess.run_inprocess` (the ServerApp and
  ClientApp code in this process, clients one after another, no Ray) into a new folder
  ``outputs/<name>/<date-time>`` (or ``output_dir``), and returns a :class:`RunResult`.
- :func:`load_model` builds the architecture a run folder's ``config.yaml`` names and loads its
  ``model.pt`` into it (on the CPU). The architecture's input shape and number of classes come
  from the run's dataset, so the dataset must be readable here (``digits`` and
  ``four_gaussians`` always are).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedgo_flwr.config.experiment import ExperimentConfig, load_config
from fedgo_flwr.config.schema import ConfigError

__all__ = ["Overrides", "RunResult", "load_experiment", "load_model", "run"]

REPO_ROOT = Path(__file__).resolve().parents[1]
"""This checkout's root: relative config paths are also looked up there (``conf/...``)."""

Overrides = Mapping[str, Any] | Iterable[str] | str | None
"""``{"data.alpha": 0.1}``, ``["data.alpha=0.1"]`` or ``"data.alpha=0.1 rounds=3"``."""


@dataclass(frozen=True)
class RunResult:
    """A finished run: its folder, its ``summary.json`` and the config it ran."""

    output_dir: Path
    summary: dict[str, Any]
    config: ExperimentConfig = field(repr=False)

    def metrics(self) -> list[dict[str, Any]]:
        """The rows of the run's ``metrics.jsonl``, one per evaluated round (round 0 first)."""
        lines = (self.output_dir / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]


def _override_words(overrides: Overrides) -> list[str]:
    """Overrides as ``key=value`` words; a mapping's values are written as JSON (valid YAML)."""
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        return [f"{key}={json.dumps(value)}" for key, value in overrides.items()]
    if isinstance(overrides, str):
        from fedgo_flwr.config.experiment import split_overrides

        return split_overrides(overrides)
    return [str(o) for o in overrides]


def load_experiment(
    path: str | os.PathLike[str] | None = "conf/default.yaml", overrides: Overrides = None
) -> ExperimentConfig:
    """The experiment of YAML file ``path`` with ``overrides``, checked and resolved.

    A relative ``path`` is looked up in the current folder, then in this checkout's root (so
    ``conf/fedgo.yaml`` works from anywhere); ``None``: the defaults. Raises
    :class:`~fedgo_flwr.config.schema.ConfigError` naming the key, the value and the file
    or override it came from.
    """
    from strategies import load_experiment as load_resolved

    return load_resolved(path, _override_words(overrides), search_dirs=[REPO_ROOT])


def run(
    experiment: ExperimentConfig | str | os.PathLike[str] | None = "conf/default.yaml",
    overrides: Overrides = None,
    *,
    num_nodes: int | None = None,
) -> RunResult:
    """Run an experiment in this process and return its :class:`RunResult`.

    ``experiment``: a config from :func:`load_experiment`, or a YAML file loaded with
    ``overrides`` (overrides go with a file only). ``num_nodes``: the virtual nodes that serve
    the clients (default: one per client; the results are the same). The run's folder is
    decided as ``./run.sh`` decides it: ``output_dir`` if set (an earlier run there is refused
    unless ``resume`` or ``overwrite``), else a new ``outputs/<name>/<date-time>`` below the
    current folder (``$FEDGO_WORKDIR`` if set).
    """
    from fedgo_app.inprocess import run_inprocess
    from fedgo_flwr.records.recorder import decide_output_dir, resolve_output_dir
    from strategies import resolve

    if isinstance(experiment, ExperimentConfig):
        if overrides:
            raise TypeError(
                "run(): overrides apply to a config file; for a loaded config, pass them to "
                "load_experiment (or use dataclasses.replace on the config)"
            )
        cfg = resolve(experiment)
    else:
        cfg = load_experiment(experiment, overrides)
    cfg = decide_output_dir(cfg)
    summary = run_inprocess(cfg, num_nodes=num_nodes)
    assert cfg.output_dir is not None  # decided above
    return RunResult(resolve_output_dir(cfg.output_dir), summary, cfg)


def load_model(run_dir: str | os.PathLike[str], *, data_path: str | None = None) -> Any:
    """The final global model of the run in ``run_dir``: ``model.name`` of its
    ``config.yaml``, with ``model.pt``'s weights, on the CPU, in eval mode.

    ``data_path``: where the run's dataset is on this machine, if not at its ``data.path``.
    A missing or unreadable ``config.yaml`` is a :class:`ConfigError` naming it; a missing
    ``model.pt`` (an unfinished run), one that is no state dict of tensors, or one whose
    arrays do not fit the architecture is a ``ValueError`` naming the file.
    """
    from fedgo_flwr.learning.task import load_bundle, new_model
    from fedgo_flwr.runtime.fileio import safe_torch_load

    folder = Path(run_dir).expanduser()
    config_file, model_file = folder / "config.yaml", folder / "model.pt"
    if not config_file.is_file():
        raise ConfigError("run_dir", str(folder), "no config.yaml: not a run folder")
    cfg = load_config(config_file)
    if not model_file.is_file():
        raise ValueError(f"{model_file}: no such file (the run has not finished)")
    state = safe_torch_load(model_file, "model file")
    if not isinstance(state, Mapping):
        raise ValueError(f"{model_file}: holds a {type(state).__name__}, not a state dict")
    model = new_model(cfg, load_bundle(cfg.data, data_path))
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError) as exc:
        first = " ".join(str(exc).split())[:300]
        raise ValueError(
            f"{model_file}: does not fit model.name {cfg.model.name!r} of {config_file} ({first})"
        ) from None
    return model.eval()
