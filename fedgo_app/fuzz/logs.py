"""The WARNING lines a run logs, caught as text (the reply fuzzer's and the adversary profile's
evidence that a reply was dropped and whom the server named)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


class _Catcher(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.lines.append(record.getMessage())


@contextlib.contextmanager
def warnings_logged() -> Iterator[list[str]]:
    """WARNING and above of Flower's logger (the strategies') and fedgo_flwr's, as text."""
    catcher = _Catcher()
    loggers = [logging.getLogger("flwr"), logging.getLogger("fedgo_flwr")]
    for lg in loggers:
        lg.addHandler(catcher)
    try:
        yield catcher.lines
    finally:
        for lg in loggers:
            lg.removeHandler(catcher)
