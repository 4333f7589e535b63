"""``logging.mlflow``: a run tracked in MLflow (:mod:`fedgo_flwr.records.tracking`).

The first tests put a recording stand-in for MLflow's client in place of the package (CI
installs no MLflow: ``.[mlflow]`` is an extra), so what is sent, and what a failing MLflow
does to the run, is checked everywhere; the last one runs the real MLflow on a SQLite store
and skips where it is not installed.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import logging
import sys
import types
from pathlib import Path

import pytest
from helpers import TINY_RUN

from fedgo_app.inprocess import run_inprocess
from fedgo_flwr.config.experiment import ConfigError
from fedgo_flwr.records.tracking import flat_params
from strategies import load_experiment

ROOT = Path(__file__).resolve().parents[2]


class FakeClient:
    """Records what :class:`~fedgo_flwr.records.tracking.MlflowLog` sends to MLflow."""

    calls: list[tuple] = []
    fail_on: str | None = None  # a method that raises

    def __init__(self, tracking_uri: str) -> None:
        self.calls.append(("client", tracking_uri))

    def __getattribute__(self, name: str):
        if name == type(self).fail_on:
            raise RuntimeError("database is locked")
        return object.__getattribute__(self, name)

    def get_experiment_by_name(self, name):
        return None

    def create_experiment(self, name, artifact_location=None):
        self.calls.append(("experiment", name, artifact_location))
        return "7"

    def create_run(self, experiment_id, run_name=None, tags=None):
        self.calls.append(("run", experiment_id, run_name, tags))
        return types.SimpleNamespace(info=types.SimpleNamespace(run_id="r1"))

    def log_batch(self, run_id, metrics=(), params=()):
        self.calls.append(("batch", list(metrics), list(params)))

    def log_artifact(self, run_id, path):
        self.calls.append(("artifact", Path(path).name))

    def log_artifacts(self, run_id, path, artifact_path=None):
        self.calls.append(("artifact", artifact_path + "/"))

    def set_terminated(self, run_id, status):
        self.calls.append(("terminated", status))


@pytest.fixture
def fake_mlflow(monkeypatch):
    """A stand-in ``mlflow`` package (``tracking.MlflowClient`` and ``entities``)."""
    package = types.ModuleType("mlflow")
    package.__spec__ = importlib.machinery.ModuleSpec("mlflow", None)  # found by preflight
    tracking = types.ModuleType("mlflow.tracking")
    tracking.MlflowClient = FakeClient
    entities = types.ModuleType("mlflow.entities")
    entities.Metric = lambda key, value, timestamp, step: (key, value, step)
    entities.Param = lambda key, value: (key, value)
    for name, module in (("", package), (".tracking", tracking), (".entities", entities)):
        monkeypatch.setitem(sys.modules, f"mlflow{name}", module)
    FakeClient.calls, FakeClient.fail_on = [], None
    return FakeClient


def tiny(out: Path, *overrides: str):
    return load_experiment(
        ROOT / "conf" / "default.yaml",
        [*TINY_RUN, "rounds=2", f"output_dir={out}", "logging.mlflow=true", *overrides],
    )


def test_a_run_sends_its_config_every_rounds_metrics_and_its_folder(
    fake_mlflow, tmp_path, monkeypatch
):
    monkeypatch.setenv("FEDGO_WORKDIR", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = tiny(tmp_path / "run")
    summary = run_inprocess(cfg)
    calls = fake_mlflow.calls
    assert calls[0] == ("client", f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert calls[1] == ("experiment", "default", (tmp_path / "mlartifacts").as_uri())
    _, _, run_name, tags = calls[2]
    assert run_name == "run" and tags["fedgo.output_dir"] == str(tmp_path / "run")
    params = dict(p for c in calls if c[0] == "batch" for p in c[2])
    assert params == flat_params(cfg.to_dict())
    assert params["data.num_clients"] == "4" and params["strategy.name"] == "fedavg"
    assert params["strategy.aggregation.clip_norm"] == "null" and params["faults"] == "[]"

    metrics = [m for c in calls if c[0] == "batch" for m in c[1]]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for key in ("test_accuracy", "test_loss", "bytes_up", "round_time"):
        sent = [(step, value) for k, value, step in metrics if k == key]
        assert sent == [(r["round"], r[key]) for r in rows if key in r], key
    assert not [m for m in metrics if m[0] == "round"]
    assert ("summary.final_accuracy", summary["final_accuracy"], 0) in metrics

    artifacts = [c[1] for c in calls if c[0] == "artifact"]
    assert {"model.pt", "summary.json", "config.yaml", "metrics.jsonl", "env.json"} <= set(
        artifacts
    )
    assert "checkpoint.pt" not in artifacts and "client-state/" not in artifacts
    assert calls[-1] == ("terminated", "FINISHED")


def test_a_failing_mlflow_costs_one_warning_and_nothing_of_the_run(fake_mlflow, tmp_path, caplog):
    fake_mlflow.fail_on = "log_artifact"
    with caplog.at_level(logging.WARNING):
        summary = run_inprocess(tiny(tmp_path / "run"))
    assert (tmp_path / "run" / "summary.json").is_file() and summary["rounds"] == 2
    warned = [r.getMessage() for r in caplog.records if "logging.mlflow" in r.getMessage()]
    assert len(warned) == 1
    assert "MLflow failed (RuntimeError: database is locked); the run goes on" in warned[0]
    assert ("terminated", "FINISHED") not in fake_mlflow.calls  # nothing after the failure

    fake_mlflow.calls, fake_mlflow.fail_on = [], "create_run"  # at the start: untracked
    with caplog.at_level(logging.WARNING):
        run_inprocess(tiny(tmp_path / "run2"))
    assert (tmp_path / "run2" / "summary.json").is_file()
    assert not [c for c in fake_mlflow.calls if c[0] == "batch"]


def test_without_the_package_the_run_is_refused_before_it_starts(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow fails, find_spec too
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name)
    )
    with pytest.raises(ConfigError) as err:
        run_inprocess(tiny(tmp_path / "run"))
    assert err.value.key == "logging.mlflow" and "pip install -e '.[mlflow]'" in str(err.value)
    assert not (tmp_path / "run").exists()


def test_the_real_mlflow_holds_the_run(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    (tmp_path / "store").mkdir()
    summary = run_inprocess(tiny(tmp_path / "run", f"logging.mlflow_uri={uri}"))
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("default")
    assert experiment.artifact_location == (tmp_path / "store" / "mlartifacts").as_uri()
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params["data.num_clients"] == "4"
    history = client.get_metric_history(run.info.run_id, "test_accuracy")
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(m.step, m.value) for m in history] == [(r["round"], r["test_accuracy"]) for r in rows]
    assert run.data.metrics["summary.final_accuracy"] == summary["final_accuracy"]
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"model.pt", "summary.json", "config.yaml"} <= names and "checkpoint.pt" not in names
