"""benchmarks/fedgo_toy.py: FedGO's four-Gaussian toy (App. E.1) end to end, one seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def toy():
    return load_benchmark("fedgo_toy")


def results(out: Path) -> dict[str, dict[str, float]]:
    return json.loads((out / "results.json").read_text())["per_seed"][0]["results"]


def test_informative_discriminators_weight_the_owner(toy, tmp_path) -> None:
    """Trained discriminators (30 epochs) put most weight on the client that holds the point's
    Gaussian; uniform weights put exactly 1/4; the table and the picture are written."""
    out = tmp_path / "toy"
    toy.main(["--seeds", "0", "--disc-epochs", "30", "--disc-lr", "1e-3", "--out", str(out)])
    r = results(out)
    assert r["uniform"]["owner_share"] == pytest.approx(0.25)
    assert r["fedgo_exact"]["owner_share"] > 0.6  # measured 0.83 over 10 seeds
    assert r["fedgo_exact"]["ensemble"] > r["uniform"]["ensemble"]
    assert (out / "boundaries.png").stat().st_size > 0
    table = (out / "table.md").read_text()
    assert "| FedGO (exact odds) |" in table and "| FedAvg (parameter average) |" in table


def test_byzantine_discriminators_and_the_clip(toy, tmp_path) -> None:
    """All four clients Byzantine: equal odds everywhere, so FedGO is n_k weighting (equal n_k:
    1/4 each). One Byzantine client takes every sample under the exact odds; a clip bounds it."""
    every = tmp_path / "all"
    toy.main(["--seeds", "0", "--byzantine", "4", "--clip", "1", "--out", str(every)])
    r = results(every)
    for row in ("fedgo", "fedgo_exact", "fedgo_exact_clip"):
        assert r[row]["owner_share"] == pytest.approx(0.25)
        assert r[row]["ensemble"] == r["uniform"]["ensemble"]
    one = tmp_path / "one"
    toy.main(
        ["--seeds", "0", "--disc-epochs", "30", "--disc-lr", "1e-3", "--byzantine", "1"]
        + ["--clip", "2", "--out", str(one)]
    )
    r = results(one)
    assert r["fedgo_exact_clip"]["owner_share"] > r["fedgo_exact"]["owner_share"]
    with pytest.raises(SystemExit):
        toy.main(["--byzantine", "5", "--out", str(tmp_path / "bad")])
