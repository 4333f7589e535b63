"""Co-Boosting's budget rule (``benchmarks/coboosting_budget.py``): chosen on the tuning seeds,
reported on the report seeds.

The rule is checked on hand-made accuracies at its edges (exactly the threshold, a missing
seed, one student short on one seed); the driver's order with the table driver stood in by a
function that keeps made-up summaries where the real one keeps its runs' records, so the choice
is read back the way the real runs' are.
"""

from __future__ import annotations

import json

import pytest
from benchmark_scripts import load_benchmark

budget = load_benchmark("coboosting_budget")


def main(argv: list[str]) -> int:
    """``python -m benchmarks run coboosting_budget ARGV``'s exit status."""
    return load_benchmark("__main__").main(["run", "coboosting_budget", *argv])


def accs(dense: list[float | None], cb: list[float | None], seeds=(0, 1)) -> dict:
    return {
        "dense": dict(zip(seeds, dense, strict=True)),
        "coboosting": dict(zip(seeds, cb, strict=True)),
    }


def test_the_smallest_budget_where_both_students_clear_on_every_seed():
    pilot = {
        40: accs([0.25, 0.19], [0.30, 0.30]),  # DENSE short on seed 1
        80: accs([0.21, 0.22], [0.30, 0.31]),
        160: accs([0.40, 0.40], [0.40, 0.40]),
    }
    assert budget.choose_budget(pilot) == (80, True)
    assert budget.choose_budget(pilot, threshold=0.215) == (160, True)


def test_the_threshold_itself_does_not_clear_and_a_missing_seed_does_not_either():
    assert budget.choose_budget({40: accs([0.20, 0.3], [0.3, 0.3])}) == (40, False)
    pilot = {40: accs([0.3, None], [0.3, 0.3]), 80: accs([0.3] * 2, [0.2] * 2)}
    assert budget.choose_budget(pilot) == (80, False)
    assert budget.choose_budget({40: {"dense": {0: 0.5}}}) == (40, False)  # no Co-Boosting run
    with pytest.raises(ValueError, match="no pilot"):
        budget.choose_budget({})


def test_no_budget_clears_then_the_largest_is_taken_and_said_so():
    pilot = {80: accs([0.19, 0.3], [0.3, 0.3]), 40: accs([0.1, 0.1], [0.3, 0.3])}
    assert budget.choose_budget(pilot) == (80, False)


def standin(tmp_path, monkeypatch, accuracy, lefts=None):
    """The table driver replaced: each call records its arguments and keeps, for every method
    and seed it was given, a summary whose ``final_accuracy`` is ``accuracy(method, budget,
    seed)``, as ``benchmarks/results/<tag>/<a0.1-method>-seed<N>/summary.json``."""
    calls = []
    monkeypatch.setattr(budget, "ROOT", tmp_path)

    def table_driver(args, tag, seeds, methods, epochs, left=None):
        calls.append((tag, list(seeds), list(methods), epochs))
        if lefts is not None:
            lefts.append(left)
        for method in methods:
            for seed in seeds:
                run = tmp_path / "benchmarks" / "results" / tag / f"a0.1-{method}-seed{seed}"
                run.mkdir(parents=True)
                summary = {"final_accuracy": accuracy(method, epochs, seed)}
                (run / "summary.json").write_text(json.dumps(summary))
        return 0

    monkeypatch.setattr(budget, "table_driver", table_driver)
    return calls


def test_the_pilot_stops_at_the_first_budget_that_clears_and_the_report_runs_seed_by_seed(
    tmp_path, monkeypatch
):
    calls = standin(tmp_path, monkeypatch, lambda m, e, s: 0.15 if e == 20 else 0.25)
    assert main(["--budgets", "80", "20", "40", "--report-seeds", "100", "101"]) == 0
    pilot = ["dense", "coboosting"]
    report = list(budget.REPORT_METHODS)
    assert calls == [
        ("coboosting-budget-pilot-e20", [0, 1], pilot, 20),
        ("coboosting-budget-pilot-e40", [0, 1], pilot, 40),  # clears: 80 is not run
        ("coboosting-report-e40", [100], report, 40),
        ("coboosting-report-e40", [101], report, 40),
    ]
    choice = json.loads(
        (tmp_path / "benchmarks/results/coboosting-report-e40/choice.json").read_text()
    )
    assert (choice["budget"], choice["cleared"], choice["tuning_seeds"]) == (40, True, [0, 1])
    short = {"0": 0.15, "1": 0.15}
    assert choice["pilot"]["20"] == {"coboosting": short, "dense": short}


def test_none_clears_then_every_budget_runs_and_the_largest_is_reported(tmp_path, monkeypatch):
    # DENSE short on tuning seed 1 at every budget
    calls = standin(tmp_path, monkeypatch, lambda m, e, s: 0.19 if (m, s) == ("dense", 1) else 0.3)
    assert main(["--budgets", "40", "80", "--report-seeds", "102"]) == 0
    assert [c[0] for c in calls] == [
        "coboosting-budget-pilot-e40",
        "coboosting-budget-pilot-e80",
        "coboosting-report-e80",
    ]
    choice = tmp_path / "benchmarks/results/coboosting-report-e80/choice.json"
    choice = json.loads(choice.read_text())
    assert (choice["budget"], choice["cleared"]) == (80, False)


def test_with_jobs_the_report_seeds_go_to_the_table_driver_at_once(tmp_path, monkeypatch):
    calls = standin(tmp_path, monkeypatch, lambda m, e, s: 0.3)
    assert main(["--budgets", "40", "--jobs", "4"]) == 0
    assert [(c[0], c[1]) for c in calls] == [
        ("coboosting-budget-pilot-e40", [0, 1]),
        ("coboosting-report-e40", [100, 101, 102]),
    ]


def test_a_failed_table_run_or_the_time_limit_stops_the_driver(tmp_path, monkeypatch):
    standin(tmp_path, monkeypatch, lambda m, e, s: 0.3)
    monkeypatch.setattr(budget, "table_driver", lambda *a: 1)
    assert main(["--budgets", "40"]) == 1
    calls = standin(tmp_path / "b", monkeypatch, lambda m, e, s: 0.3)
    assert main(["--budgets", "40", "--stop-after", "0"]) == 1
    assert calls == []


def test_the_time_left_goes_to_each_table_driver_call(tmp_path, monkeypatch):
    """``--stop-after``: every table-driver call gets the seconds still left (so it starts no
    run after the limit); without it, none."""
    lefts = []
    standin(tmp_path, monkeypatch, lambda m, e, s: 0.3, lefts)
    assert main(["--budgets", "40", "--jobs", "2", "--stop-after", "500"]) == 0
    assert len(lefts) == 2 and all(400 < left <= 500 for left in lefts)
    assert lefts[1] <= lefts[0]
    lefts.clear()
    standin(tmp_path / "b", monkeypatch, lambda m, e, s: 0.3, lefts)
    assert main(["--budgets", "40"]) == 0
    assert lefts and set(lefts) == {None}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tuning-seeds", "100"], "tuning seeds"),
        (["--report-seeds", "0"], "report seeds"),
        (["--budgets", "0"], "server epochs"),
        (["strategy.epochs=40"], "give --budgets"),
        (["--jobs", "0"], "at least 1"),
    ],
)
def test_seeds_from_the_wrong_set_and_a_budget_given_twice_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        budget.SPEC.bench(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
