"""Record nothing more once the process has been asked to stop.

A Ctrl-C or TERM reaches every process of a run at about the same time. In a simulation the
ServerApp runs in a thread of ``flwr-simulation`` while the main thread handles the signal,
and the Ray workers die at once: the ServerApp then sees the round's clients *fail*, and it
could finish the round without them and checkpoint it before the process exits. A run
resumed from that checkpoint would carry a round the user never asked for (fewer clients,
another model) and no longer match an uninterrupted run.

:func:`watch` hooks into Flower's exit handling (``flwr.supercore.exit.add_exit_handler``,
called by Flower's signal handler in the main thread before anything is torn down), and
:func:`raise_if_stopping` is called before a round's results are written: once a stop has
begun, it raises :class:`RunStopped` and the round is left unrecorded, so ``resume: true``
repeats it. A deployed ServerApp runs in the main thread, where Flower's handler already
interrupts it; the check costs nothing there.
"""

from __future__ import annotations

import threading

_stopping = threading.Event()
_lock = threading.Lock()
_watching = False


class RunStopped(RuntimeError):
    """The process is exiting; the current round was not recorded."""


def watch() -> None:
    """Start noticing Flower's exit (once per process; safe to call from any thread)."""
    global _watching
    with _lock:
        if _watching:
            return
        from flwr.supercore.exit import add_exit_handler

        add_exit_handler(request_stop, run_before_force_exit=True)
        _watching = True


def request_stop() -> None:
    """Mark the process as stopping (what Flower's exit handler does; also for tests)."""
    _stopping.set()


def raise_if_stopping(what: str) -> None:
    """Raise :class:`RunStopped` if a stop has begun; ``what`` names what is left unrecorded."""
    if _stopping.is_set():
        raise RunStopped(f"the run is stopping: {what} not recorded")


def reset() -> None:
    """Forget a stop request (tests; a process that runs several experiments in turn)."""
    _stopping.clear()
