"""The README's main command path: ``./run.sh CONFIG overrides`` through ``flwr run``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def superlinks() -> set[str]:
    out = subprocess.run(["pgrep", "-f", "flower-superlink"], capture_output=True, text=True)
    return set(out.stdout.split())


def run_sh(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(ROOT / "run.sh"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "FEDGO_WORKDIR": str(ROOT)},
    )


def test_bad_config_fails_fast_without_starting_anything(tmp_path):
    before = superlinks()
    proc = run_sh("conf/default.yaml", "data.alpha=-1", f"output_dir={tmp_path}", timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "data.alpha = -1.0: must be > 0" in proc.stderr
    assert "override 'data.alpha=-1'" in proc.stderr
    assert superlinks() <= before
    assert not (tmp_path / "metrics.jsonl").exists()


def test_run_sh_runs_flwr_run_end_to_end_and_stops_its_superlink(tmp_path):
    before = superlinks()
    proc = run_sh(
        "conf/fedprox.yaml",
        "rounds=2",
        "data.num_clients=4",
        "fraction=0.5",
        "train.local_epochs=1",
        f"output_dir={tmp_path}",
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["strategy"] == "fedprox" and summary["rounds"] == 2
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert "done: final accuracy" in proc.stdout + proc.stderr
    assert superlinks() <= before, "run.sh left its SuperLink running"


def test_a_run_that_fails_inside_flower_exits_non_zero(tmp_path):
    # Valid schema, but ResNet-18 cannot take the 2-D points: the ServerApp raises.
    proc = run_sh(
        "conf/default.yaml",
        "data.dataset=four_gaussians",
        "model.name=resnet18",
        f"output_dir={tmp_path}",
    )
    assert proc.returncode == 1
    assert "the run failed" in proc.stderr
    assert "resnet18" in proc.stdout + proc.stderr
