"""benchmarks/profile_phases.py: its bare loops in every setting, and the report's table."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from benchmark_scripts import load_benchmark

from fedgo_flwr.runtime import profiling
from strategies import load_experiment

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pp():
    return load_benchmark("profile_phases")


@pytest.fixture(scope="module")
def cfg():
    return load_experiment(str(ROOT / "conf" / "fedgo.yaml"), ["data.num_clients=4"])


@pytest.mark.parametrize("phase", profiling.PHASES)
def test_every_phase_has_a_bare_loop_in_every_setting(pp, cfg, phase) -> None:
    shape, classes = (1, 8, 8), 10
    for setting in [pp.RUN, *pp.fast_settings("forward")]:
        step = pp.bare_step(phase, cfg, shape, classes, 4, "cpu", setting)
        rate = pp.timed(step, 4, seconds=0.0, device=torch.device("cpu"))
        assert rate > 0


def test_bf16_setting_runs_the_forward_in_bfloat16(pp, cfg) -> None:
    bare = pp.Bare(torch.device("cpu"), pp.fast_settings("forward")[1], False)
    assert bare.channels_last
    with bare.amp():
        out = torch.nn.Linear(4, 2)(torch.randn(3, 4))
    assert out.dtype == torch.bfloat16
    plain = pp.Bare(torch.device("cpu"), pp.RUN, False)
    with plain.amp():
        assert torch.nn.Linear(4, 2)(torch.randn(3, 4)).dtype == torch.float32


def test_cuts_follow_the_preset(pp) -> None:
    full = load_experiment(
        str(ROOT / "conf" / "paper" / "fedgo-cifar10-a0.1.yaml"),
        ["data.dataset=imagefolder", "data.path=/nonexistent"],
    )
    assert pp.cuts(full) == [
        "rounds=2",
        "train.local_epochs=2",
        "strategy.distill.epochs=1",
        "strategy.generator.steps=200",
        "strategy.discriminator.epochs=1",
    ]


def test_table_lists_the_other_settings_against_the_run_limit(pp) -> None:
    phase = {
        **profiling.PhaseCount(seconds=2.0, images=200, calls=1, batch=64, threads=1).as_dict(),
        "kind": "forward+backward",
        "bare_images_per_second": 200.0,
        "ratio": 0.5,
        "bare": {
            pp.RUN.label: {"batch": 64, "images_per_second": 200.0},
            "fp32 b256": {"batch": 256, "images_per_second": 500.0},
        },
    }
    report = {
        "config": "c.yaml",
        "overrides": [],
        "method": "fedgo",
        "rounds": 2,
        "machine": "m",
        "wall_seconds": 4.0,
        "phases": {"local_training": phase},
        "side_by_side": {"processes": 4, "batch": 64, "images_per_second": 300.0},
    }
    text = pp.table(report)
    assert "| local_training | fp32 b256 | 256 | 500 | 2.50 |" in text
    assert "300 images/s in total, 1.50x one process" in text
    assert "the phases 2.0 s (50%)" in text
