"""The lock that keeps ``alone`` tests from running beside others under pytest-xdist."""

from __future__ import annotations

import fcntl
import os
import threading
import time

from side_by_side import SideBySideLock, lock_for_this_run


def holder(lock: SideBySideLock, exclusive: bool, log: list[str], name: str):
    """A thread that takes the lock, logs, and holds it until its ``release`` event is set."""
    release, got = threading.Event(), threading.Event()

    def run() -> None:
        with lock.hold(exclusive):
            log.append(f"{name} in")
            got.set()
            release.wait(10)
            log.append(f"{name} out")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, got, release


def wait_until_gate_held(lock: SideBySideLock, timeout: float = 5.0) -> None:
    """Return once another holder has the gate (a non-blocking try to take it fails)."""
    fd = os.open(lock.gate_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return
            fcntl.flock(fd, fcntl.LOCK_UN)
            time.sleep(0.01)
        raise AssertionError("nobody took the gate")
    finally:
        os.close(fd)


def test_shared_holders_overlap_and_an_exclusive_one_waits_for_them(tmp_path):
    lock, log = SideBySideLock(tmp_path / "l"), []
    a, a_in, a_go = holder(lock, False, log, "a")
    assert a_in.wait(5)  # a is in before b starts: the log's order is then fixed
    b, b_in, b_go = holder(lock, False, log, "b")
    assert b_in.wait(5)  # two shared holders at once
    x, x_in, x_go = holder(lock, True, log, "x")
    assert not x_in.wait(0.3)  # the exclusive one waits for both
    a_go.set()
    a.join(5)
    assert not x_in.wait(0.3)
    b_go.set()
    b.join(5)
    assert x_in.wait(5)
    x_go.set()
    x.join(5)
    assert log == ["a in", "b in", "a out", "b out", "x in", "x out"]


def test_a_waiting_exclusive_holder_goes_before_later_shared_ones(tmp_path):
    lock, log = SideBySideLock(tmp_path / "l"), []
    a, a_in, a_go = holder(lock, False, log, "a")
    assert a_in.wait(5)
    x, x_in, x_go = holder(lock, True, log, "x")
    wait_until_gate_held(lock)  # x holds the gate while it waits for a
    c, c_in, c_go = holder(lock, False, log, "c")
    assert not c_in.wait(0.3)  # a shared holder may not join a while x waits
    a_go.set()
    assert x_in.wait(5) and not c_in.wait(0.3)
    x_go.set()
    assert c_in.wait(5)
    c_go.set()
    for t in (a, x, c):
        t.join(5)
    assert log == ["a in", "a out", "x in", "x out", "c in", "c out"]


def test_only_xdist_workers_take_the_lock(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", "abc")
    assert lock_for_this_run() is None
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    lock = lock_for_this_run()
    assert lock is not None and lock.main_path.name == "fedgo-tests-abc.lock"
