"""Progress lines of long stages (fedgo_flwr/runtime/progress.py), driven by a fake clock."""

from __future__ import annotations

import logging

from fedgo_flwr.runtime.progress import Progress, duration


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def stage(total, **kwargs):
    clock, lines = Clock(), []
    return Progress("gen", total, "steps", emit=lines.append, clock=clock, **kwargs), clock, lines


def test_a_short_stage_says_nothing():
    p, clock, lines = stage(100)
    for _ in range(100):
        clock.now += 0.05  # 5 s in all
        p.advance()
    p.close()
    assert lines == []


def test_a_minute_long_stage_speaks_every_ten_seconds_with_rate_and_eta():
    p, clock, lines = stage(60)
    for _ in range(60):  # one step a second
        clock.now += 1.0
        p.advance()
    p.close()
    # at 10, 20, ..., 50 s (5 lines: each 10 s later is also 5 % more), then the closing line
    assert len(lines) == 6
    assert lines[0] == "gen: 10/60 steps (17%), 1 steps/s, 10s so far, ETA 50s"
    assert lines[4].startswith("gen: 50/60 steps (83%)")
    assert lines[-1] == "gen: done, 60/60 steps in 1m00s (1 steps/s)"


def test_a_long_stage_speaks_every_five_percent_but_never_quiet_for_more_than_longest():
    p, clock, lines = stage(1000, longest=30.0)
    for _ in range(1000):  # 1 step = 1 s: 5 % = 50 s, so the 30 s limit sets the pace
        clock.now += 1.0
        p.advance()
    gaps = [int(line.split(" ")[1].split("/")[0]) for line in lines]
    assert gaps[:4] == [30, 50, 80, 100]  # 30 s quiet, 5 %, 30 s quiet, 10 %
    p2, clock2, lines2 = stage(100, longest=1e9)
    for _ in range(100):  # 1 step = 4 s: 5 % = 20 s, above EVERY
        clock2.now += 4.0
        p2.advance()
    steps = [int(line.split(" ")[1].split("/")[0]) for line in lines2]
    assert steps[:4] == [5, 10, 15, 20]  # one line per 5 %, none in between


def test_never_more_than_one_line_per_every_seconds():
    p, clock, lines = stage(10)
    for _ in range(10):  # 10 % per step, but 0.5 s each: 5 s in all
        clock.now += 0.5
        p.advance()
    assert lines == []
    clock.now += 20
    p.advance(0)
    assert lines == []  # all done: only the closing line, and only after a line before
    p.close()
    assert lines == []


def test_tick_speaks_while_waiting_and_an_unknown_total_has_no_eta():
    p, clock, lines = stage(None, longest=10.0)
    clock.now += 12
    p.tick()
    assert lines == ["gen: 0 steps, 12s so far"]
    p.advance(3)
    clock.now += 10
    p.advance()
    assert lines[-1] == "gen: 4 steps, 0.182 steps/s, 22s so far"


def test_detail_is_appended_and_close_is_idempotent():
    p, clock, lines = stage(4, detail=lambda: "running: a")
    clock.now += 11
    p.advance()
    p.close()
    p.close()
    p.advance()
    assert lines[0].endswith("; running: a") and len(lines) == 2


def test_lines_go_to_flowers_logger_by_default(caplog):
    clock = Clock()
    with caplog.at_level(logging.INFO, logger="flwr"):
        with Progress("disc", 2, "clients", clock=clock) as p:
            clock.now += 11
            p.advance()
    assert [r.getMessage() for r in caplog.records if r.name == "flwr"] == [
        "disc: 1/2 clients (50%), 0.0909 clients/s, 11s so far, ETA 11s",
        "disc: done, 1/2 clients in 11s (0.0909 clients/s)",
    ]


def test_duration():
    assert [duration(s) for s in (2.54, 45, 200, 3720)] == ["2.5s", "45s", "3m20s", "1h02m"]


def test_a_stage_without_a_name_prints_nothing():
    clock, lines = Clock(), []
    p = Progress(None, 10, emit=lines.append, clock=clock)
    for _ in range(10):
        clock.now += 30
        p.advance()
    p.close()
    assert lines == [] and p.done == 10
