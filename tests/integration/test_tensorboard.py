"""``logging.tensorboard``: the rounds' metrics as TensorBoard scalars, refused before the run
where the package is missing (issue 17)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedgo_app import cli
from fedgo_app.inprocess import run_inprocess
from strategies import load_experiment

ROOT = Path(__file__).resolve().parents[2]
TINY = ["rounds=3", "data.num_clients=4", "fraction=0.5", "train.local_epochs=1"]


def test_tensorboard_gets_the_rounds_metrics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "tb"
    cfg = load_experiment(
        ROOT / "conf/default.yaml", [*TINY, f"output_dir={out}", "logging.tensorboard=true"]
    )
    run_inprocess(cfg)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    scalars = events.Scalars("accuracy/test_accuracy")
    assert [e.step for e in scalars] == [r["round"] for r in rows]
    assert [e.value for e in scalars] == pytest.approx([r["test_accuracy"] for r in rows])
    assert [e.step for e in events.Scalars("traffic/bytes_up")] == [r["round"] for r in rows]


def test_tensorboard_without_its_package_is_refused_before_the_run(tmp_path, monkeypatch):
    import importlib.util

    from fedgo_flwr.config.experiment import ConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name)
    )
    cfg = load_experiment(ROOT / "conf/default.yaml", ["logging.tensorboard=true"])
    with pytest.raises(ConfigError) as err:
        cli.preflight(cfg)
    assert err.value.key == "logging.tensorboard"
