"""benchmarks/oneshot_odds.py recomputes Co-Boosting + FedGO's ensembles from the uploads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import ONESHOT_TINY

from benchmarks import oneshot_odds
from fedgo_app.inprocess import run_inprocess
from strategies import load_experiment

ROOT = Path(__file__).resolve().parents[2]
TINY = [
    *ONESHOT_TINY,
    "strategy.name=coboosting_fedgo",
    "strategy.epochs=1",
    "strategy.discriminator.epochs=1",
]


def test_the_measures_equal_the_strategys_own_and_the_table_shows_them(tmp_path):
    """From a run's uploads, the uniform and the double-sigmoid odds ensembles are the
    accuracies the strategy itself reported (``disc_mode`` default: ``double_sigmoid``), the
    largest weight lies between 1/N and 1, and the table prints them per seed."""
    run_inprocess(load_experiment(ROOT / "conf/coboosting.yaml", [*TINY, f"output_dir={tmp_path}"]))
    summary = json.loads((tmp_path / "summary.json").read_text())
    got = oneshot_odds.measure(tmp_path)
    assert got["clients"] == 4 and len(got["d_median"]) == 4
    assert got["uniform"] == pytest.approx(summary["ensemble_accuracy_uniform"], abs=1e-6)
    assert got["double_sigmoid"]["accuracy"] == pytest.approx(
        summary["ensemble_accuracy_fedgo"], abs=1e-6
    )
    for mode in ("double_sigmoid", "sigmoid"):
        assert 0.25 - 1e-6 <= got[mode]["max_weight"] <= 1
    text = oneshot_odds.table({7: got})
    row = next(x for x in text.splitlines() if x.startswith("| 7 |"))
    assert f"{100 * got['uniform']:.2f} / {100 * got['double_sigmoid']['accuracy']:.2f}" in row
    assert "(1/N = 0.2500)" in row
