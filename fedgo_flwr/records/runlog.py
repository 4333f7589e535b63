"""``run.log``: the log lines of a run, kept in its folder.

:func:`run_log` adds a handler to Flower's logger (the one every module of this project logs
to) for the length of a run: Flower's and this project's lines of INFO and above, with their
time, as the terminal showed them (for ``./run.sh``: the ServerApp's side; for ``--local``
and :func:`fedgo_app.inprocess.run_inprocess`, whose clients run in the same process or
in its local workers, which hand their records to it, theirs too). Lines logged before the run
folder is known (the start-up) are held and written when :meth:`RunLog.open` names the folder.
Lines are appended to a ``run.log`` already there (a resumed run's, or one a wrapper such as a
benchmark writes the output of ``./run.sh`` to): nothing in it is lost. A run that fails
writes its error as the last line (one line for a configuration, node-discovery or checkpoint
problem, which the terminal shows as one line too; the traceback for anything else).

When this process's output already goes to that file (a sweep or a benchmark that runs
``python -m fedgo_app.inprocess`` with its output in ``<run>/run.log``), nothing is added:
the file already holds what the terminal would have shown.
"""

from __future__ import annotations

import contextlib
import logging
import os
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from flwr.supercore.logger import LOGGER_NAME

from fedgo_flwr.runtime.fileio import open_append

__all__ = ["RUN_LOG", "RunLog", "run_log"]

RUN_LOG = "run.log"
FORMAT = "%(asctime)s %(levelname)s: %(message)s"
ONE_LINE_ERRORS = ("ConfigError", "NodeDiscoveryError", "CheckpointError", "UnsafePathError")
"""Exceptions whose message is the whole story (the ServerApp logs them as one line)."""


def _same_file(fd: int, path: Path) -> bool:
    try:
        mine, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)


class RunLog(logging.Handler):
    """Holds log records until :meth:`open`, then writes them and every later one to a file."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter(FORMAT))
        self.held: list[logging.LogRecord] | None = []
        self.file: IO[str] | None = None
        self.path: Path | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self.file is not None:
                self.file.write(self.format(record) + "\n")
                self.file.flush()
            elif self.held is not None:
                self.held.append(record)
        except Exception:  # noqa: BLE001 - logging must not end the run (as logging's own)
            self.handleError(record)

    def open(self, out_dir: Path) -> None:
        """Write to ``out_dir/run.log`` from now on (after what is there), the records held so
        far first; nothing when this process's output goes there already."""
        path = Path(out_dir) / RUN_LOG
        self.acquire()
        try:
            if self.file is not None or self.held is None:
                return
            if path.exists() and (_same_file(1, path) or _same_file(2, path)):
                self.held = None  # the file gets the terminal's lines already
                return
            self.file = open_append(path)  # never through a link planted there
            self.path = path
            held, self.held = self.held, None
        finally:
            self.release()
        for record in held:
            self.emit(record)

    def failed(self, exc: BaseException) -> None:
        """Write the error that ends the run (not through the logger: the terminal shows it
        its own way)."""
        if self.file is None:
            return
        if type(exc).__name__ in ONE_LINE_ERRORS:
            text = f"{type(exc).__name__}: {exc}"
        else:
            text = "".join(traceback.format_exception(exc)).rstrip()
        record = logging.LogRecord(
            LOGGER_NAME, logging.ERROR, "", 0, "run failed: %s", (text,), None
        )
        self.emit(record)

    def close(self) -> None:
        self.acquire()
        try:
            if self.file is not None:
                self.file.close()
                self.file = None
            self.held = None
        finally:
            self.release()
        super().close()


@contextlib.contextmanager
def run_log() -> Iterator[RunLog]:
    """A :class:`RunLog` on Flower's logger for the ``with`` block; removed and closed after
    it, the block's exception (if any) written last."""
    handler = RunLog()
    logger = logging.getLogger(LOGGER_NAME)
    logger.addHandler(handler)
    try:
        yield handler
    except BaseException as exc:
        handler.failed(exc)
        raise
    finally:
        logger.removeHandler(handler)
        handler.close()
