"""benchmarks/process_timeline.py: the CPU each process used, and the cores busy each second."""

from __future__ import annotations

import sys

import pytest

from benchmarks.process_timeline import format_tables, main, record, short_name, summarise


def _sample(t, *procs):
    return {"t": t, "p": [list(p) for p in procs]}


def test_summarise_counts_each_process_cpu_in_the_window_and_the_cores_each_second():
    t0 = 1000.0
    samples = [
        _sample(t0 - 0.5, (1, 900.0, 50.0, "init")),
        _sample(t0, (1, 900.0, 50.0, "init"), (10, t0, 0.0, "python -m fedgo_app.cli prepare")),
        _sample(
            t0 + 0.5, (1, 900.0, 50.1, "init"), (10, t0, 0.5, "python -m fedgo_app.cli prepare")
        ),
        _sample(
            t0 + 1.0,
            (1, 900.0, 50.1, "init"),
            (10, t0, 0.9, "python -m fedgo_app.cli prepare"),
            (11, t0 + 0.7, 0.2, "/venv/bin/python /venv/bin/flwr-simulation --x"),
        ),
        _sample(t0 + 1.5, (11, t0 + 0.7, 0.7, "/venv/bin/python /venv/bin/flwr-simulation --x")),
    ]
    procs, seconds = summarise(samples, t0, t0 + 1.5)
    by_pid = {p["pid"]: p for p in procs}
    assert set(by_pid) == {10, 11}  # init started long before: not a process of the command
    assert by_pid[10]["cpu_s"] == pytest.approx(0.9)
    assert by_pid[11]["cpu_s"] == pytest.approx(0.7)  # new in its first interval: all of it
    assert by_pid[11]["started"] == pytest.approx(0.7)
    # second 0: intervals ending at 0.5 (0.5 + 0.1 of init) -> 1.2 cores over 0.5 s
    assert seconds[0]["second"] == 0 and seconds[0]["cores"] == pytest.approx(1.2)
    # second 1: (0.4 + 0.2) in the interval ending at 1.0, 0.5 in the one ending at 1.5
    assert seconds[1]["cores"] == pytest.approx((0.6 + 0.5) / 1.0)
    assert seconds[1]["top"][0] == ("flwr-simulation", pytest.approx(0.7))
    table = format_tables(procs, seconds)
    assert "**1.60**" in table and "| 1 | 1.10 |" in table


def test_short_names():
    assert short_name("/v/bin/python -m fedgo_app.cli prepare x") == "fedgo_app.cli"
    assert short_name("/v/bin/python /v/bin/flower-superlink --simulation") == "flower-superlink"
    assert short_name("/v/bin/python -u /v/ray/_private/log_monitor.py --s") == "log_monitor.py"
    assert short_name("ray::ClientAppActor.run") == "ray::ClientAppActor"
    assert short_name("/v/ray/core/src/ray/gcs/gcs_server --log_dir=x") == "gcs_server"


def test_a_real_command_shows_up_with_its_cpu(tmp_path):
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"
    samples, start, end, status = record([sys.executable, "-c", busy], 0.05, tmp_path / "s.jsonl")
    assert status == 0 and (tmp_path / "s.jsonl").is_file()
    procs, seconds = summarise(samples, start, end + 0.1)
    mine = [p for p in procs if busy[:10] in p["name"] or "-c" in p["name"]]
    assert mine and max(p["cpu_s"] for p in mine) >= 0.3
    assert any(s["cores"] >= 0.5 for s in seconds)


def test_main_runs_the_command_and_returns_its_status(capsys):
    assert main(["--every", "0.05", "--", sys.executable, "-c", "raise SystemExit(3)"]) == 3
    assert "| started (s) |" in capsys.readouterr().err
