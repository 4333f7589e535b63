"""``python -m fedgo_app.sweep``: a real 2-variant x 2-seed sweep of tiny in-process runs.

The folders ``<out>/<variant>/seed<N>/``, a second sweep that runs nothing (the runs' files
untouched), a table whose numbers are those of the runs' own summaries, runs of a changed
variant left out, and the archive that carries the finished runs to another folder. A failed
run is ``tests/unit/test_sweep_runner.py``'s (no real run needed).
"""

from __future__ import annotations

import json
import shlex
import statistics

import pytest
from helpers import ROOT, TINY_RUN

from fedgo_app.sweep.__main__ import main

CONFIG = shlex.quote(str(ROOT / "conf" / "default.yaml"))


def test_a_sweep_runs_resumes_and_tabulates_its_runs(tmp_path, capsys) -> None:
    out = tmp_path / "sweep"
    argv = [
        f"fedavg={CONFIG}",
        f"lr={CONFIG} train.lr=0.1",
        "--seeds",
        "0,1",
        "--out",
        str(out),
        "--archive",
        str(tmp_path / "runs.tar.xz"),
        *TINY_RUN,
    ]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "4 runs to go" in err
    runs = {p.parent.relative_to(out).as_posix() for p in out.glob("*/*/summary.json")}
    assert runs == {"fedavg/seed0", "fedavg/seed1", "lr/seed0", "lr/seed1"}
    assert all((out / r / "run.log").is_file() for r in runs)

    # a second sweep runs nothing and touches no run's file
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*/*/*") if p.is_file()}
    assert main(argv) == 0
    assert "all 4 runs finished already" in capsys.readouterr().err
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/*/*") if p.is_file()} == stamps

    # the archive carries the four runs' records to a fresh folder: nothing runs there
    moved = tmp_path / "elsewhere"
    assert (
        main([*argv[: argv.index("--out") + 1], str(moved), *argv[argv.index("--out") + 2 :]]) == 0
    )
    err = capsys.readouterr().err
    assert "4 finished runs restored" in err and "all 4 runs finished already" in err
    assert not list(moved.glob("*/*/run.log")) and not list(moved.glob("*/*/checkpoint*"))
    assert (moved / "table.md").read_text() == (out / "table.md").read_text()

    table = json.loads((out / "table.json").read_text())
    assert table["seed_set"]["name"] == "tuning" and not table["seed_set"]["for_claims"]
    assert table["seed_set"]["seeds"] == [0, 1] and table["left_out"] == []
    assert "tuning seeds: not for claims" in (out / "table.md").read_text()
    final = {
        (v, s): json.loads((out / v / f"seed{s}" / "summary.json").read_text())["final_accuracy"]
        for v in ("fedavg", "lr")
        for s in (0, 1)
    }
    by = {v["name"]: v for v in table["variants"]}
    for name in ("fedavg", "lr"):
        values = [final[name, 0], final[name, 1]]
        assert by[name]["per_seed"] == {"0": values[0], "1": values[1]}
        assert by[name]["n"] == 2 and by[name]["mean"] == pytest.approx(statistics.mean(values))
        assert by[name]["sd"] == pytest.approx(statistics.stdev(values))
        # provenance: the commit of every run's env.json (carried by the archive too)
        envs = [json.loads((out / name / f"seed{s}" / "env.json").read_text()) for s in (0, 1)]
        commit = envs[0]["git"]["commit"]
        short = commit[:10] + ("+dirty" if envs[0]["git"]["dirty"] else "") if commit else "no git"
        assert by[name]["commits"] == {short: [0, 1]}
    (pair,) = table["paired"]
    assert (pair["variant"], pair["baseline"], pair["seeds"]) == ("lr", "fedavg", [0, 1])
    assert pair["diffs"] == pytest.approx([final["lr", s] - final["fedavg", s] for s in (0, 1)])
    assert table["curves"]["fedavg"]["round"] == [0, 1]
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"

    # a variant changed since its runs finished: they are named and left out, not reused
    changed = [*argv[:1], f"lr={CONFIG} train.lr=0.2", *argv[2:], "--table-only"]
    assert main(changed) == 1
    assert "train.lr (0.1 -> 0.2)" in capsys.readouterr().err
    table = json.loads((out / "table.json").read_text())
    assert [(x["variant"], x["seed"]) for x in table["left_out"]] == [("lr", 0), ("lr", 1)]
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/*/*") if p.is_file()} == stamps


def test_a_sweep_past_its_time_limit_starts_nothing_and_names_the_runs_left(
    tmp_path, capsys
) -> None:
    """``--stop-after 0``: no run starts, the table leaves both out as not started, exit 1 (a
    sweep to run again); a negative limit is a bad command line (exit 2, nothing runs)."""
    out = tmp_path / "sweep"
    argv = [f"fedavg={CONFIG}", "--seeds", "0,1", "--out", str(out), *TINY_RUN]
    assert main([*argv, "--stop-after", "0"]) == 1
    assert "--stop-after reached: 2 runs not started" in capsys.readouterr().err
    assert not list(out.glob("*/*/run.log"))
    left = json.loads((out / "table.json").read_text())["left_out"]
    assert [(x["variant"], x["seed"]) for x in left] == [("fedavg", 0), ("fedavg", 1)]
    assert all("not started: --stop-after" in x["why"] for x in left)
    assert main([*argv, "--stop-after", "-1"]) == 2
    assert "--stop-after must be >= 0" in capsys.readouterr().err
