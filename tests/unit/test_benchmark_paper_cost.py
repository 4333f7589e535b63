"""benchmarks/paper_cost.py: which counts it cuts, and how it scales each phase back up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark

from fedgo_flwr.runtime import profiling
from strategies import load_experiment

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cost():
    return load_benchmark("paper_cost")


def _preset(name: str, *overrides: str):
    return load_experiment(
        str(ROOT / "conf" / "paper" / name),
        ["data.dataset=imagefolder", "data.path=/nonexistent", *overrides],
    )


def test_cuts_shrink_each_count_the_preset_has(cost) -> None:
    g1 = cost.cuts(_preset("fedgo-cifar10-a0.1.yaml"))
    assert "strategy.generator.steps=200" in g1
    assert "strategy.discriminator.epochs=1" in g1
    assert "strategy.distill.epochs=1" in g1
    assert not any("federated_rounds" in c for c in g1)
    g3 = cost.cuts(_preset("fedgo-g3-cifar10-a0.05.yaml"))
    assert "strategy.generator.federated_rounds=1" in g3
    assert not any("generator.steps" in c for c in g3)  # G3 has no server-side steps
    fedavg = cost.cuts(_preset("fedavg-cifar10-a0.1.yaml"))
    assert fedavg == ["rounds=2", "train.local_epochs=2"]


def test_work_ratios_of_the_g1_preset(cost) -> None:
    full = _preset("fedgo-cifar10-a0.1.yaml")
    cut = _preset("fedgo-cifar10-a0.1.yaml", *cost.cuts(full))
    f, c = cost.work(full), cost.work(cut)
    ratio = {k: f[k] / c[k] for k in f}
    assert ratio["local_training"] == 50 * 15  # 100 / 2 rounds x 30 / 2 epochs
    assert ratio["distillation"] == 50 * 10
    assert ratio["wgan_gp"] == 100_000 / 200
    assert ratio["discriminator_training"] == 30
    assert ratio["discriminator_logits"] == 1
    assert ratio["teacher_logits"] == ratio["rest"] == 50


def test_main_scales_the_measured_seconds(cost, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "data" / "train").mkdir(parents=True)
    fake = {
        "wgan_gp": profiling.PhaseCount(seconds=36.0, images=64_000, calls=1, batch=64),
        "local_training": profiling.PhaseCount(seconds=4.8, images=1000, calls=16, batch=64),
    }
    monkeypatch.setattr(cost, "profile_run", lambda cfg: (fake, 50.0, [{"test_accuracy": 0.1}]))
    cost.main(["--data", str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--tag", "t"])
    report = json.loads((tmp_path / "out" / "t" / "cost.json").read_text())
    phases = report["phases"]
    assert phases["wgan_gp"]["full_hours"] == pytest.approx(36.0 * 500 / 3600)
    assert phases["local_training"]["full_hours"] == pytest.approx(4.8 * 750 / 3600)
    assert phases["rest"]["seconds"] == pytest.approx(50.0 - 36.0 - 4.8)
    assert phases["rest"]["full_hours"] == pytest.approx(9.2 * 50 / 3600)
    assert report["full_hours"] == pytest.approx(5.0 + 1.0 + 9.2 * 50 / 3600)
    assert "**" in (tmp_path / "out" / "t" / "table.md").read_text()
