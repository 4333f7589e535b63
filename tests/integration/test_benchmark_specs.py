"""``python -m benchmarks run|table NAME`` end to end: a tiny spec on digits, and the committed
tables made again from their archives.

The tiny spec runs FedAvg on two seeds through the real child processes (``python -m benchmarks
--child``, two at once), keeps both runs in its archive and writes a table whose cell is the
mean and sample sd of the runs' own final accuracies; a second call starts nothing and changes
no file; a time limit already past starts nothing and says so. Every committed table of a spec
listed in :data:`COMMITTED` is rebuilt from a copy of its results folder without the table and
must come out byte for byte the same.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import types
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark
from helpers import TINY_RUN

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def registry(monkeypatch):
    """The registry with one more spec, ``tiny``: FedAvg on ``conf/default.yaml``."""
    registry = load_benchmark("__main__")
    spec, sweep = load_benchmark("spec"), load_benchmark("sweep")

    def table(bench) -> str:
        runs = sweep.load_runs(bench.results, ["fedavg"], bench.args.seeds)
        return f"fedavg {sweep.column(runs['fedavg'], sweep.final_accuracy)}"

    tiny = types.ModuleType("benchmarks.tiny")
    tiny.SPEC = spec.Spec(
        name="tiny",
        summary="FedAvg on digits",
        config="conf/default.yaml",
        tag="tiny",
        methods=lambda args: ["fedavg"],
        overrides=lambda method: [f"strategy.name={method}"],
        table=table,
    )
    monkeypatch.setitem(sys.modules, "benchmarks.tiny", tiny)
    monkeypatch.setattr(registry, "SPECS", (*registry.SPECS, "tiny"))
    return registry


def test_a_tiny_spec_runs_two_seeds_at_once_resumes_and_tabulates(registry, tmp_path, capsys):
    scratch, results = tmp_path / "scratch", tmp_path / "results"
    where = ["--scratch", str(scratch), "--out", str(results)]
    argv = ["run", "tiny", "--seeds", "0", "1", "--jobs", "2", *where, *TINY_RUN]
    assert registry.main(argv) == 0
    err = capsys.readouterr().err
    assert err.count("runs: start fedavg-seed") == 2
    assert sorted(p.name for p in results.iterdir()) == ["runs.tar.xz", "table.md"]
    kept = load_benchmark("sweep").Kept(results)
    assert kept.names() == ["fedavg-seed0", "fedavg-seed1"]
    for seed in (0, 1):
        log = (scratch / f"fedavg-seed{seed}" / "run.log").read_text()
        assert log.startswith("$ ") and "-m benchmarks --child conf/default.yaml" in log
        assert f"seed={seed} resume=true rounds=1" in log.splitlines()[0]
        config = kept.get(f"fedavg-seed{seed}", "config.yaml").decode()
        assert str(ROOT) not in config  # kept relative to the repository
    accs = [kept.json(f"fedavg-seed{s}")["final_accuracy"] for s in (0, 1)]
    mean, sd = 100 * statistics.mean(accs), 100 * statistics.stdev(accs)
    assert (results / "table.md").read_text() == f"fedavg {mean:.1f} ± {sd:.1f}\n"

    # again: nothing starts, no file changes
    files = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    stamps = {p: p.stat().st_mtime_ns for p in files if p.name != "table.md"}
    assert registry.main(argv) == 0
    assert "runs: start" not in capsys.readouterr().err
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == files

    # the table alone, from the archive: the same bytes
    table = (results / "table.md").read_bytes()
    (results / "table.md").unlink()
    assert registry.main(["table", "tiny", "--seeds", "0", "1", *where]) == 0
    assert (results / "table.md").read_bytes() == table

    # a time limit already past: seed 2 is not started, and said so; the kept runs stay
    late = ["run", "tiny", "--seeds", "0", "1", "2", "--stop-after", "0", *where, *TINY_RUN]
    assert registry.main(late) == 1
    err = capsys.readouterr().err
    assert "1 run(s) not started: the time limit was reached" in err
    assert not (scratch / "fedavg-seed2").exists()
    assert load_benchmark("sweep").Kept(results).names() == ["fedavg-seed0", "fedavg-seed1"]


COMMITTED = [
    (
        "cpfl_cohorts",
        "cpfl-digits-budget",
        ["--config", "conf/cpfl.yaml", "--alphas", "0.1", "--cohorts", "1", "2", "4"],
    ),  # fmt: skip
    ("coboosting_table1", "coboosting-digits", ["--config", "conf/bench/coboosting-digits.yaml"]),
    ("coboosting_table1", "coboosting-cifar10-cpu", []),
    ("fedgo_table3", "cifar10-cpu-bn", []),
    ("switches", "switches-cifar10-r3", []),
]
"""(spec, results folder, options): the committed tables that ``table`` makes again. Left out:
``cpfl-cifar10-cpu``, ``cpfl-cifar10-cpu-logprobs`` and ``cpfl-digits-report``, made by an
older table (ratios averaged, not their geometric mean), which no code makes any more."""


@pytest.mark.parametrize(("name", "tag", "argv"), COMMITTED, ids=[c[1] for c in COMMITTED])
def test_a_committed_table_is_made_again_byte_for_byte(registry, tmp_path, name, tag, argv):
    committed = ROOT / "benchmarks" / "results" / tag
    out = tmp_path / tag
    shutil.copytree(committed, out, ignore=shutil.ignore_patterns("table.md"))
    assert registry.main(["table", name, "--tag", tag, "--out", str(out), *argv]) == 0
    assert (out / "table.md").read_bytes() == (committed / "table.md").read_bytes()


def test_the_budget_specs_tables_are_made_again_byte_for_byte(tmp_path, monkeypatch):
    """``table coboosting_budget``: the pilot tables and the report's, each in its folder."""
    budget = load_benchmark("coboosting_budget")
    monkeypatch.setattr(budget, "ROOT", tmp_path)
    tags = [*(budget.pilot_tag(b) for b in (20, 40, 80)), budget.report_tag(80)]
    for tag in tags:
        committed = ROOT / "benchmarks" / "results" / tag
        out = tmp_path / "benchmarks" / "results" / tag
        shutil.copytree(committed, out, ignore=shutil.ignore_patterns("table.md"))
    main = load_benchmark("__main__").main
    assert main(["table", "coboosting_budget", "--budgets", "20", "40", "80"]) == 0
    for tag in tags:
        made = (tmp_path / "benchmarks" / "results" / tag / "table.md").read_bytes()
        assert made == (ROOT / "benchmarks" / "results" / tag / "table.md").read_bytes(), tag
    choice = json.loads((ROOT / "benchmarks/results" / tags[-1] / "choice.json").read_text())
    assert choice["budget"] == 80
