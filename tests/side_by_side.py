"""Which tests may run beside each other when the suite runs in parallel (pytest-xdist).

Most tests do not care what else runs on the machine. A few time their rounds against a
``round_timeout`` (a cut link, a killed SuperNode, a client that hangs): on a loaded machine a
healthy client could miss that timeout too. Those are marked ``alone``; a test marked so holds
an exclusive lock for its whole protocol (set-up, call, tear-down) and every other test a
shared one, so an ``alone`` test never runs beside another and the rest run side by side.

The lock is a readers-writer lock on two files (``flock``), shared by the workers of one run:
a test that wants it exclusively first takes the *gate*, so tests that come after it wait at
the gate instead of keeping the shared lock busy for ever (writer preference).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class SideBySideLock:
    """A readers-writer lock between processes (and between threads: each holds its own
    open file descriptions, and ``flock`` locks belong to those)."""

    def __init__(self, base: Path) -> None:
        self.gate_path = base.with_suffix(".gate")
        self.main_path = base.with_suffix(".lock")

    @contextmanager
    def hold(self, exclusive: bool) -> Iterator[None]:
        """Hold the lock, exclusively or shared, for the ``with`` block."""
        gate = os.open(self.gate_path, os.O_RDWR | os.O_CREAT, 0o600)
        main = os.open(self.main_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(gate, fcntl.LOCK_EX)
            try:
                fcntl.flock(main, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            finally:
                fcntl.flock(gate, fcntl.LOCK_UN)
            try:
                yield
            finally:
                fcntl.flock(main, fcntl.LOCK_UN)
        finally:
            os.close(main)
            os.close(gate)


def lock_for_this_run() -> SideBySideLock | None:
    """The lock shared by the workers of this pytest-xdist run; ``None`` outside xdist."""
    uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not os.environ.get("PYTEST_XDIST_WORKER") or not uid:
        return None
    return SideBySideLock(Path(tempfile.gettempdir()) / f"fedgo-tests-{uid}")
