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


def _row(rnd: int, wall: float, agg: float, ev: float, acc: float = 0.1) -> dict:
    return {
        "round": rnd,
        "round_time": wall,
        "aggregate_time": agg,
        "eval_time": ev,
        "test_accuracy": acc,
    }


def test_side_by_side_takes_the_client_span_of_the_later_rounds(cost) -> None:
    # round 1 (Ray's start) is left out; rounds 2 and 3: spans 10 - 2 - 1 = 7 and 9 - 2 - 1 = 6
    serial = [_row(0, 0, 0, 1), _row(1, 99, 2, 1), _row(2, 10, 2, 1), _row(3, 9, 2, 1)]
    side = [_row(1, 50, 2, 1), _row(2, 5, 2, 1), _row(3, 4, 2, 1)]  # spans 2 and 1
    out = cost.side_by_side(serial, side, 4, "4 per GPU", full_hours=10.0, factor=750, rounds=3)
    assert out["span_serial_s"] == pytest.approx(6.5)
    assert out["span_side_by_side_s"] == pytest.approx(1.5)
    assert out["speedup"] == pytest.approx(6.5 / 1.5)
    assert out["round_serial_s"] == pytest.approx(9.5)
    assert out["round_side_by_side_s"] == pytest.approx(4.5)
    # 5 s saved a round x 3 cut rounds x 750 = 11,250 s
    assert out["saved_hours"] == pytest.approx(5.0 * 3 * 750 / 3600)
    assert out["full_hours"] == pytest.approx(10.0 - 5.0 * 3 * 750 / 3600)
    # a slower side-by-side run saves nothing rather than adding time
    worse = cost.side_by_side(side, serial, 4, "x", full_hours=10.0, factor=750, rounds=3)
    assert worse["saved_hours"] == 0 and worse["full_hours"] == 10.0


def test_side_by_side_places_k_clients_per_gpu_or_k_cpu_workers(cost) -> None:
    assert cost.side_by_side_overrides(4, cuda=True) == (
        ["resources.client_gpus=0.25"],
        "4 per GPU",
    )
    assert cost.side_by_side_overrides(3, cuda=False)[0] == ["resources.client_gpus=0"]


def test_main_runs_the_simulation_with_k_clients_at_once(cost, tmp_path: Path, monkeypatch):
    (tmp_path / "data" / "train").mkdir(parents=True)
    fake = {"local_training": profiling.PhaseCount(seconds=4.8, images=1000, calls=16, batch=64)}
    serial = [_row(1, 30, 2, 1), _row(2, 20, 2, 1)]
    monkeypatch.setattr(cost, "profile_run", lambda cfg: (fake, 50.0, serial))
    seen = {}

    def fake_flower(cfg, supernodes=0, init_args=None):
        seen.update(cfg=cfg, init_args=init_args)
        return [_row(1, 40, 2, 1), _row(2, 8, 2, 1)]

    monkeypatch.setattr(cost, "run_flower", fake_flower)
    monkeypatch.setattr(cost.torch.cuda, "is_available", lambda: False)
    cost.main(["--data", str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--tag", "t",
               "--side-by-side", "2"])  # fmt: skip
    assert seen["init_args"] == {"num_cpus": 2 * seen["cfg"].resources.client_cpus}
    assert seen["cfg"].resources.client_gpus == 0
    assert seen["cfg"].rounds == 2  # the cut run's
    side = json.loads((tmp_path / "out" / "t" / "cost.json").read_text())["side_by_side"]
    assert side["span_serial_s"] == 17 and side["span_side_by_side_s"] == 5
    assert side["saved_hours"] == pytest.approx(12 * 2 * 750 / 3600)
    assert "side by side" in (tmp_path / "out" / "t" / "table.md").read_text()
    with pytest.raises(SystemExit):
        cost.main(["--data", str(tmp_path / "data"), "--side-by-side", "1"])
