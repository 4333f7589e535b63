"""MLflow tracking of a run (``logging.mlflow: true``; ``pip install -e '.[mlflow]'``).

One MLflow run per started run (a resumed run is a new MLflow run that holds the earlier
rounds too), in the MLflow experiment named after ``name``, run name the run folder's name:

- params: the resolved configuration, one param per dotted key (``data.alpha``,
  ``strategy.distill.epochs``; lists as JSON); tags ``fedgo.output_dir`` (the run folder) and
  ``fedgo.config_fingerprint`` (:func:`fedgo_flwr.records.provenance.config_fingerprint`);
- metrics: every numeric value of every ``metrics.jsonl`` row, step = round (NaN and
  infinities, text and nested values are left out, as in TensorBoard);
- at the end: the summary's numbers as metrics, and the run folder as artifacts, less the
  checkpoints and the clients' state files (``model.pt``, ``config.yaml``, ``metrics.jsonl``,
  ``summary.json``, ``env.json``, ``partition.json`` ...), and the run marked finished.

Where: ``logging.mlflow_uri``, else ``$MLFLOW_TRACKING_URI``, else the SQLite store
``mlflow.db`` in the folder that holds ``outputs/`` (``$FEDGO_WORKDIR``, else the current
directory); the experiments created in a SQLite store keep their artifacts in ``mlartifacts/``
beside its file (``mlflow ui --backend-store-uri sqlite:///mlflow.db`` shows them). MLflow 3
refuses its plain-folder store unless ``MLFLOW_ALLOW_FILE_STORE=true`` is set; a ``file:`` URI
works with that variable. Tracking is a side channel: if MLflow fails during the run (a locked
database, a server gone), a WARNING names the problem once and the run goes on untracked; its
own files are complete either way.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Mapping
from logging import WARNING
from pathlib import Path
from typing import Any

from flwr.supercore import log

from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.records.provenance import config_fingerprint

__all__ = ["MLFLOW_DB", "MlflowLog", "flat_params", "tracking_uri"]

MLFLOW_DB = "mlflow.db"
ARTIFACTS_DIR = "mlartifacts"
LEFT_OUT = ("checkpoint.pt", "checkpoint.prev.pt", "client-state")
"""Run-folder entries not logged as artifacts: the server's and the clients' resumable state."""
MAX_PARAM = 6000
"""MLflow's longest param value; a longer one (a long ``faults`` list) is cut, marked so; the
whole config is the ``config.yaml`` artifact."""
SQLITE = "sqlite:///"
BATCH = 100  # MLflow takes at most 100 params (and 1000 metrics) per log_batch


def tracking_uri(cfg: ExperimentConfig, workdir: Path) -> str:
    """The tracking URI of the module docstring's *Where*."""
    if cfg.logging.mlflow_uri:
        return cfg.logging.mlflow_uri
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{workdir / MLFLOW_DB}"


def artifact_location(uri: str) -> str | None:
    """Where a new experiment of a SQLite store keeps its artifacts: ``mlartifacts/`` beside
    the database file (MLflow's default would be ``mlruns/`` in the current directory, which
    differs between the ServerApp's process and yours); other stores choose their own."""
    if not uri.startswith(SQLITE):
        return None
    return (Path(uri[len(SQLITE) :]).parent / ARTIFACTS_DIR).resolve().as_uri()


def flat_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``config`` as dotted keys and text values (lists and ``None`` as JSON)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flat_params(value, f"{dotted}."))
            continue
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        if len(text) > MAX_PARAM:
            text = text[: MAX_PARAM - 40] + f"...<{len(text)} characters; see config.yaml>"
        out[dotted] = text
    return out


def _numbers(row: Mapping[str, Any]) -> Iterable[tuple[str, float]]:
    for key, value in row.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            yield key, float(value)


class MlflowLog:
    """The MLflow run of one started run (the module docstring says what it holds)."""

    @classmethod
    def start(cls, cfg: ExperimentConfig, out_dir: Path, workdir: Path) -> MlflowLog | None:
        """The MLflow run, created; ``None`` after a WARNING if MLflow fails to create it (a
        URI with no store behind it): the run goes on untracked."""
        try:
            return cls(cfg, out_dir, workdir)
        except Exception as exc:  # noqa: BLE001 - any MLflow failure: the run goes on
            _warn(exc, out_dir)
            return None

    def __init__(self, cfg: ExperimentConfig, out_dir: Path, workdir: Path) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.out_dir = out_dir
        self.uri = tracking_uri(cfg, workdir)
        self.client = MlflowClient(tracking_uri=self.uri)
        self.failed = False
        experiment = self.client.get_experiment_by_name(cfg.name)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            location = artifact_location(self.uri)
            experiment_id = self.client.create_experiment(cfg.name, artifact_location=location)
        config = cfg.to_dict()
        tags = {
            "fedgo.output_dir": str(out_dir),
            "fedgo.config_fingerprint": config_fingerprint(config),
        }
        run = self.client.create_run(experiment_id, run_name=out_dir.name, tags=tags)
        self.run_id = run.info.run_id
        params = [Param(k, v) for k, v in flat_params(config).items()]
        for i in range(0, len(params), BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + BATCH])

    def write(self, row: Mapping[str, Any]) -> None:
        """Log one ``metrics.jsonl`` row (step = its round)."""
        step = int(row["round"])
        self._guarded(self._metrics, [(k, v) for k, v in _numbers(row) if k != "round"], step)

    def finish(self, summary: Mapping[str, Any]) -> None:
        """Log the summary's numbers (as ``summary.<key>``), the run folder, and end the run."""
        numbers = [(f"summary.{k}", v) for k, v in _numbers(summary)]
        self._guarded(self._metrics, numbers, 0)
        self._guarded(self._artifacts)
        self._guarded(self.client.set_terminated, self.run_id, "FINISHED")

    def _metrics(self, pairs: list[tuple[str, float]], step: int) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        metrics = [Metric(key, value, stamp, step) for key, value in pairs]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def _artifacts(self) -> None:
        for entry in sorted(self.out_dir.iterdir()):
            if entry.name in LEFT_OUT or entry.name.startswith("."):
                continue
            if entry.is_dir():
                self.client.log_artifacts(self.run_id, str(entry), artifact_path=entry.name)
            elif entry.is_file():
                self.client.log_artifact(self.run_id, str(entry))

    def _guarded(self, call: Any, *args: Any) -> None:
        """``call(*args)``, unless MLflow failed before; a failure is one WARNING, then none."""
        if self.failed:
            return
        try:
            call(*args)
        except Exception as exc:  # noqa: BLE001 - any MLflow failure: the run goes on
            self.failed = True
            _warn(exc, self.out_dir)


def _warn(exc: Exception, out_dir: Path) -> None:
    first = " ".join(str(exc).split())[:300]
    log(
        WARNING,
        "logging.mlflow: MLflow failed (%s: %s); the run goes on without it, its files in %s "
        "are complete",
        type(exc).__name__,
        first,
        out_dir,
    )
