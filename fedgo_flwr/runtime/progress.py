"""Progress lines of long stages: done/total, rate and time left, through Flower's logger.

Every stage that can run for minutes without a round line (FedGO's WGAN-GP generator, the
server's distillation, data-free synthesis, CPFL's cohort distillation, the discriminator
round, a sweep) reports through one :class:`Progress`. Its caller says how much is done
(:meth:`Progress.advance`) or just that time passed (:meth:`Progress.tick`); the helper decides
whether that is worth a line. A line comes when at least :data:`EVERY` seconds have passed
since the stage began or since its last line, and either another :data:`SHARE` of the work is
done or :data:`LONGEST` seconds have passed: a stage of a minute says where it is every 10 s,
one of hours about every 5 % (at least every 30 s), and one of a few seconds says nothing. A
stage that printed a line ends with a line of its total time (:meth:`Progress.close`). Between
two calls of its caller it cannot speak: a caller advances it at least every few seconds.

Lines look like::

    FedGO generator: 120/300 steps (40%), 1.15 steps/s, 1m44s so far, ETA 2m36s

The rate is the stage's average so far, the time left is what is left at that rate. The clock
and the output are parameters, so tests drive it with a fake clock and collect its lines.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from logging import INFO

from flwr.supercore import log

__all__ = ["EVERY", "LONGEST", "SHARE", "Progress", "duration"]

EVERY = 10.0
"""Seconds between two lines at the least (and from the stage's start to its first line)."""
SHARE = 0.05
"""A line when this share more of the stage is done (and :data:`EVERY` has passed)."""
LONGEST = 30.0
"""A line after this many seconds without one (if the stage was advanced or ticked)."""


def duration(seconds: float) -> str:
    """``1h02m``, ``3m20s``, ``45s`` or ``2.5s`` (under 10 s)."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _say(text: str) -> None:
    log(INFO, "%s", text)


class Progress:
    """The progress of one stage of ``total`` ``unit`` (``None``: of unknown length).

    ``what`` names the stage in its lines (``"FedGO generator"``; ``None``: a stage nobody
    asked lines of, which prints none). ``emit`` takes each line (default: Flower's logger,
    INFO); ``clock`` gives seconds (default :func:`time.monotonic`).
    Usable as a context manager, which closes it. ``detail`` (optional) returns text added to
    every line (e.g. the runs under way of a sweep).
    """

    def __init__(
        self,
        what: str | None,
        total: int | None,
        unit: str = "steps",
        *,
        emit: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        every: float = EVERY,
        share: float = SHARE,
        longest: float = LONGEST,
        detail: Callable[[], str] | None = None,
    ) -> None:
        self.what, self.unit = what or "", unit
        self.total = None if total is None else max(int(total), 0)
        self.done = 0
        self.emit, self.clock, self.detail = emit or _say, clock, detail
        self.every, self.share, self.longest = every, share, longest
        self.started = clock()
        self.last_line = self.started
        self.last_share = 0  # how many SHAREs were done at the last line
        self.lines = 0
        self.closed = what is None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def advance(self, n: int = 1) -> None:
        """``n`` more ``unit`` are done; a line if one is due."""
        self.done += n
        self.tick()

    def tick(self) -> None:
        """Time has passed (nothing more done, e.g. while waiting for replies); a line if due."""
        if self.closed or (self.total and self.done >= self.total):
            return  # all done: the closing line says so
        now = self.clock()
        quiet = now - self.last_line
        if quiet < self.every:
            return
        shares = self._shares()
        if shares > self.last_share or quiet >= self.longest or self.share <= 0:
            self.last_line, self.last_share = now, shares
            self.lines += 1
            self.emit(self.line(now))

    def _shares(self) -> int:
        if not self.total or self.share <= 0:
            return 0
        return int(min(self.done, self.total) / self.total / self.share + 1e-9)

    def rate(self, now: float) -> float:
        """``unit`` per second so far (0 before any time has passed)."""
        spent = now - self.started
        return self.done / spent if spent > 0 else 0.0

    def line(self, now: float | None = None) -> str:
        """``what: done/total unit (p%), rate unit/s, elapsed so far, ETA left``."""
        now = self.clock() if now is None else now
        spent, rate = now - self.started, self.rate(now)
        if self.total:
            head = f"{self.done}/{self.total} {self.unit} ({100 * self.done / self.total:.0f}%)"
        else:
            head = f"{self.done} {self.unit}"
        parts = [head]
        if rate > 0:
            parts.append(f"{rate:.3g} {self.unit}/s")
        parts.append(f"{duration(spent)} so far")
        if self.total and rate > 0 and self.done < self.total:
            parts.append(f"ETA {duration((self.total - self.done) / rate)}")
        text = f"{self.what}: {', '.join(parts)}"
        extra = self.detail() if self.detail is not None else ""
        return f"{text}{'; ' + extra if extra else ''}"

    def close(self) -> None:
        """End the stage: a last line with its total time if it printed any line before."""
        if self.closed:
            return
        self.closed = True
        if self.lines:
            now = self.clock()
            count = f"{self.done}/{self.total}" if self.total else f"{self.done}"
            self.emit(
                f"{self.what}: done, {count} {self.unit} in {duration(now - self.started)}"
                + (f" ({self.rate(now):.3g} {self.unit}/s)" if self.rate(now) > 0 else "")
            )
