"""The sweep's runner with stand-in runs: a failed run is recorded and the others go on."""

from __future__ import annotations

import sys
from pathlib import Path

from fedgo_app.sweep.runner import Job, default_jobs, execute
from fedgo_app.sweep.variants import Variant


class FakeJob(Job):
    """A run that is a short Python snippet instead of ``fedgo_app.inprocess``."""

    def __init__(self, name: str, seed: int, folder: Path, code: str, threads: int = 1) -> None:
        super().__init__(Variant(name, "x.yaml"), seed, folder, [], threads)
        self.code = code

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-c", self.code]


def test_a_failed_run_is_recorded_and_the_others_finish(tmp_path) -> None:
    ok = "open('{}', 'w').write('{{}}')"
    jobs = [
        FakeJob("a", 0, tmp_path / "a/seed0", ok.format(tmp_path / "a/seed0/summary.json")),
        FakeJob("a", 1, tmp_path / "a/seed1", "import sys; print('boom'); sys.exit(3)"),
        FakeJob("b", 0, tmp_path / "b/seed0", "print('exits 0, writes no summary')"),
        FakeJob("b", 1, tmp_path / "b/seed1", ok.format(tmp_path / "b/seed1/summary.json")),
    ]
    said: list[str] = []
    kept: list[tuple[str, int]] = []
    outcomes = execute(
        jobs, 2, say=said.append, on_done=lambda j: kept.append((j.variant.name, j.seed))
    )
    status = {(o.variant, o.seed): o.status for o in outcomes}
    assert status == {("a", 0): "done", ("a", 1): "failed", ("b", 0): "failed", ("b", 1): "done"}
    detail = {(o.variant, o.seed): o.detail for o in outcomes}
    assert detail["a", 1].startswith("exit 3;") and "exit 0 without a new summary" in detail["b", 0]
    assert any("a seed 1 FAILED" in line and "boom" in line for line in said)
    # a finished run says how long it took and, with runs left, when the sweep should end
    done = [line for line in said if " done in " in line]
    assert len(done) == 2
    assert all("ETA" in line for line in done if not line.startswith("sweep: [4/4]"))
    assert "boom" in (tmp_path / "a/seed1/run.log").read_text()
    assert sorted(kept) == [("a", 0), ("b", 1)]  # the archive keeps the finished runs only


def test_runs_side_by_side_as_the_cpus_hold_their_threads(monkeypatch) -> None:
    monkeypatch.setattr("fedgo_app.sweep.runner.cpu_count", lambda: 8)
    job = FakeJob("a", 0, Path("x"), "", threads=3)
    assert default_jobs([job]) == 2
    assert default_jobs([FakeJob("a", 0, Path("x"), "", threads=8), job]) == 1
    assert default_jobs([FakeJob("a", 0, Path("x"), "", threads=16)]) == 1


def test_no_run_starts_after_the_time_limit_and_those_under_way_finish(tmp_path) -> None:
    """``stop_at``: the run started before it (one at a time, each 0.6 s, the limit at 0.3 s)
    finishes and is kept; the others are ``unstarted``, named, and never started (no folder).
    A limit already past starts nothing."""
    import time

    slow = "import time; time.sleep(0.6); open('{}', 'w').write('{{}}')"
    jobs = [
        FakeJob("a", s, tmp_path / f"a/seed{s}", slow.format(tmp_path / f"a/seed{s}/summary.json"))
        for s in range(3)
    ]
    said: list[str] = []
    kept: list[int] = []
    outcomes = execute(
        jobs,
        1,
        say=said.append,
        on_done=lambda j: kept.append(j.seed),
        stop_at=time.monotonic() + 0.3 + 0.3,
    )
    assert sorted((o.seed, o.status) for o in outcomes) == [
        (0, "done"),
        (1, "unstarted"),
        (2, "unstarted"),
    ]
    assert all("--stop-after" in o.detail for o in outcomes if o.status == "unstarted")
    assert kept == [0] and not (tmp_path / "a/seed1").exists()
    assert "sweep: --stop-after reached: 2 runs not started" in said
    outcomes = execute(jobs[1:], 1, say=said.append, stop_at=time.monotonic() - 1)
    assert [o.status for o in outcomes] == ["unstarted", "unstarted"]
