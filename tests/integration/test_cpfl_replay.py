"""CPFL's stage-2 replay (benchmarks/cpfl_replay.py) on a tiny run's kept teachers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.cpfl_replay import ReplayError, main, parse_budget, replay
from fedgo_app.inprocess import run_inprocess
from strategies import load_experiment
from strategies._cpfl_distill import TEACHERS_FILE

ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "data.num_clients=8",
    "rounds=4",
    "strategy.cohorts=2",
    "strategy.window=2",
    "strategy.patience=3",
    "strategy.cohort_eval_every=0",
    "strategy.distill.epochs=2",
    "strategy.distill.batch_size=32",
    "checkpoint=false",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cpfl") / "run"
    run_inprocess(load_experiment(ROOT / "conf/cpfl.yaml", [*TINY, f"output_dir={out}"]))
    return out


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_the_run_keeps_its_teachers(run: Path) -> None:
    saved = torch.load(run / TEACHERS_FILE, weights_only=True)
    s = summary(run)
    assert saved["cohorts"] == s["cohorts_distilled"] == [0, 1]
    assert saved["counts"].shape == (2, 10) and int(saved["counts"].sum()) > 0
    assert len(saved["teachers"]) == 2 and saved["distill_at_h"] == s["distill_at_h"]


def test_the_runs_own_budget_gives_the_runs_student(run: Path) -> None:
    """Same teachers, seed, public set and budget: the same student and ensemble, and the same
    losses up to float rounding (pytest's process may lay out the kernels' threads otherwise
    than the run did; a plain process replays them bit for bit)."""
    s = summary(run)
    r = replay(run)
    assert r["student_accuracy"] == s["final_accuracy"]
    assert r["ensemble_accuracy"] == s["ensemble_accuracy"]
    assert r["teacher_accuracies"] == s["teacher_accuracies"]
    assert r["epoch_losses"] == pytest.approx(s["distill_epoch_losses"], rel=1e-6)
    assert r["steps"] == s["distill_steps"] and r["public_size"] == s["public_size"]


def test_a_budget_in_steps_and_a_smaller_public_set(run: Path) -> None:
    """``steps`` counts mini-batch steps across passes (the last pass cut short);
    ``public_size`` distils on that many public images; the ensemble does not change."""
    s = summary(run)
    n = s["public_size"]
    per_pass = -(-n // 32) - (1 if n % 32 == 1 else 0)
    r = replay(run, parse_budget(f"steps={per_pass + 1},batch_size=32"))
    assert r["steps"] == per_pass + 1 and len(r["epoch_losses"]) == 2
    assert r["ensemble_accuracy"] == s["ensemble_accuracy"]
    small = replay(run, parse_budget("public_size=10,epochs=3,batch_size=4"))
    assert small["public_size"] == 10 and small["steps"] == 3 * 3  # 4 + 4 + 2 a pass
    assert np.isfinite(small["distill_loss"])


def test_bad_budgets_and_folders_are_one_clear_error(run: Path, tmp_path: Path) -> None:
    with pytest.raises(ReplayError, match="'epochs' is not key=value"):
        parse_budget("steps=5,epochs")
    with pytest.raises(ReplayError, match="steps"):
        replay(run, parse_budget("steps=0"))
    with pytest.raises(ReplayError, match="no teachers file"):
        replay(tmp_path)
    other = tmp_path / "other"
    shutil.copytree(run, other)
    saved = torch.load(other / TEACHERS_FILE, weights_only=True)
    saved["counts"][0, 0] += 1  # another run's teachers
    torch.save(saved, other / TEACHERS_FILE)
    with pytest.raises(ReplayError, match="cohort 0's label counts are not the config's"):
        replay(other)
    (other / TEACHERS_FILE).write_bytes(b"not a checkpoint")
    with pytest.raises(ReplayError, match="not a teachers file"):
        replay(other)
    with pytest.raises(SystemExit, match="no teachers file"):
        main([str(tmp_path)])


def test_the_command_writes_every_result(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    main([str(run), "--budget", "epochs=1,batch_size=64", "--budget", "steps=2", "--out", str(out)])
    results = json.loads(out.read_text())
    assert [r["budget"] for r in results] == [
        ["strategy.distill.epochs=1", "strategy.distill.batch_size=64"],
        ["strategy.distill.steps=2"],
    ]
    assert results[1]["steps"] == 2


def test_the_budget_table_pairs_each_seed_with_its_ensemble_and_baseline() -> None:
    """Two seeds: students 80 and 84, ensembles 90 and 92 (gaps -10, -8: mean -9, interval
    -9 +- t(0.975, 1) 1.414 / sqrt(2) = 12.7, t = -9, p = 1 - 2 atan(9) / pi = 0.070); against
    n = 1's 97 and 96: -17 and -12 (mean -14.5 +- 31.8, t = -5.8, p = 0.11)."""
    from benchmarks.cpfl_replay import budget_table

    def result(seed: int, student: float, ensemble: float) -> dict:
        return {
            "run": f"a0.1-n4-seed{seed}",
            "budget": ["strategy.distill.steps=9800"],
            "steps": 9800,
            "batch_size": 128,
            "public_size": 425,
            "student_accuracy": student,
            "ensemble_accuracy": ensemble,
        }

    text = budget_table(
        [result(100, 0.80, 0.90), result(101, 0.84, 0.92)], {100: 0.97, 101: 0.96, 102: 0.5}
    )
    assert "report seeds" in text.splitlines()[0]
    assert text.splitlines()[-1] == (
        "| a0.1-n4 | steps=9800 | 9800 | 128 | 425 | 2 | 82.0 ± 25.4 | 91.0 ± 12.7 "
        "| -9.0 [-21.7, +3.7] p=0.07 (n=2) | -14.5 [-46.3, +17.3] p=0.11 (n=2) |"
    )


def test_stop_round_replays_the_stopping_rule_on_a_recorded_signal(tmp_path: Path) -> None:
    """By hand: minima in rounds 1-3, then three rounds without one (patience 3) -> round 6;
    a round without a loss counts as one without a minimum; a signal that ends first: None.
    From a run's metrics.jsonl: cohort 0 (1, 1.0 a round after 3 minima) stops in round 5
    under window 1 / patience 2 and is not stopped within its 5 rounds under 2 / 3 (smoothed
    3, 2.5, 1.5, 1, 1: minima through round 4); cohort 1, always improving, under neither."""
    from benchmarks.cpfl_replay import stop_round, stopping_lines

    assert stop_round([3.0, 2.0, 1.0, 1.0, 1.0, 1.0], 1, 3) == 6
    assert stop_round([3.0, 2.0, 1.0, None, 1.0, 1.0], 1, 3) == 6
    assert stop_round([3.0, 2.0, 1.0, 1.0, 1.0], 1, 3) is None
    assert stop_round([3.0, 1.0, 5.0, 5.0], 2, 2) == 4  # smoothed 3, 2, 3, 5
    losses = {0: [3.0, 2.0, 1.0, 1.0, 1.0], 1: [5.0, 4.0, 3.0, 2.0, 1.0]}
    rows = [{"round": 0}] + [
        {"round": r + 1, "cohorts": [{"cohort": c, "val_loss": losses[c][r]} for c in (0, 1)]}
        for r in range(5)
    ]
    run = tmp_path / "a0.1-n2-seed0"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert stopping_lines(run, [(1, 2), (2, 3)]) == [
        "a0.1-n2-seed0 cohort 0: ran 5; 1/2: 5, 2/3: > 5",
        "a0.1-n2-seed0 cohort 1: ran 5; 1/2: > 5, 2/3: > 5",
    ]
