"""Child runs: the one engine that starts a run's process and runs many of them side by side.

``python -m fedgo_app.sweep`` (:mod:`fedgo_app.sweep.runner`) and the benchmark specs
(``python -m benchmarks run NAME``, ``benchmarks/sweep.py``) start their runs through it:

- :func:`run_child` starts one command with its output appended to a log file (opened without
  following a link), waits for it and returns its wall time; an exit other than 0 raises
  :class:`ChildFailed`, whose message names the run, the exit code and the log, followed by the
  log's tail;
- :func:`run_tasks` runs :class:`Task` s, ``jobs`` at a time (each task's ``run`` in a worker
  thread; the process it starts does the work), a task whose ``after`` names another task still
  to run or under way waiting until that one is over; a task that raises :class:`ChildFailed`
  is recorded as failed and the others go on; ``stop_at`` (a :func:`time.monotonic` time)
  starts no task after it (the tasks under way finish and count; the others are
  ``unstarted``: a lease or batch job that ends at a fixed time loses no finished run);
  ``on_done`` is called in the calling thread for each finished task, one at a time (the
  caller keeps its records there). Progress lines (runs done, rate, ETA, the runs under way)
  go to ``say``. Ctrl-C (or any other error) stops the processes the tasks started, each by
  its own process, and re-raises.

Resuming is the callers': they leave out the runs already kept before they make the tasks.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedgo_flwr.runtime.progress import Progress, duration

ROOT = Path(__file__).resolve().parents[2]
"""The repository (its strategies/, clients/ and conf/): first on the children's ``PYTHONPATH``."""

TAIL = 3000
"""Characters of a failed run's log that its error shows."""


class ChildFailed(RuntimeError):
    """A child run failed. ``str(exc)``: a first line that names the run and why (``"<run>
    failed (exit 3; <log>)"``), then the log's tail; :attr:`reason` is the why alone (``"exit
    3"``) when the engine made the error, ``None`` for a message a caller made."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason

    @property
    def headline(self) -> str:
        """The message's first line (a list of failures shows one line per run)."""
        return str(self).splitlines()[0] if str(self) else ""

    @classmethod
    def of(cls, label: str, reason: str, log: Path) -> ChildFailed:
        """``"<label> failed (<reason>; <log>):"`` and the log's tail."""
        return cls(f"{label} failed ({reason}; {log}):\n{tail(log)}", reason)


def tail(path: Path, chars: int = TAIL) -> str:
    """The last ``chars`` characters of a log (``""`` if it cannot be read)."""
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def child_env(env: dict[str, str] | None = None, root: Path = ROOT) -> dict[str, str]:
    """``env`` (default: this process's environment) with ``root`` first on ``PYTHONPATH``."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH", "")]))
    return env


_LIVE: set[subprocess.Popen] = set()
_LIVE_LOCK = threading.Lock()


def stop_children() -> None:
    """Terminate every child process under way (each by its own process), killing one that
    does not end within 30 s."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for proc in live:
        if proc.poll() is None:
            proc.terminate()
    for proc in live:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def run_child(
    cmd: Sequence[str],
    log: Path,
    *,
    label: str | None = None,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    root: Path = ROOT,
) -> float:
    """Run ``cmd`` with its output appended to ``log`` (after a ``$ cmd`` line); its wall
    time in seconds, or :class:`ChildFailed` (``label``, default the log's folder name; the
    exit code; the log's tail) if it exits with an error.

    ``root`` goes first on its ``PYTHONPATH`` (``env``, default this process's environment,
    is the rest); ``cwd`` is where it starts (default: here). The log is appended to, never
    through a link (``O_NOFOLLOW``), its folder made if missing."""
    log.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    start = time.perf_counter()
    with os.fdopen(os.open(log, flags, 0o666), "a") as out:
        out.write(f"$ {' '.join(map(str, cmd))}\n")
        out.flush()
        proc = subprocess.Popen(
            list(cmd), cwd=cwd, env=child_env(env, root), stdout=out, stderr=subprocess.STDOUT
        )
        with _LIVE_LOCK:
            _LIVE.add(proc)
        try:
            code = proc.wait()
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(proc)
    wall = time.perf_counter() - start
    if code != 0:
        raise ChildFailed.of(label or log.parent.name, f"exit {code}", log)
    return wall


@dataclass
class Task:
    """One run for :func:`run_tasks`: ``run()`` does it (it starts the child, waits and
    returns what the caller keeps; :class:`ChildFailed`: the run failed); ``name`` names it in
    the lines and in another task's ``after``; ``folder`` is said where it starts."""

    name: str
    run: Callable[[], Any]
    after: str | None = None
    folder: Path | None = None
    payload: Any = None  # the caller's own record of the run (a sweep's job)


@dataclass
class Result:
    """A task's end: ``status`` ``"done"`` (``value``: what ``run`` returned, ``seconds``),
    ``"failed"`` (``error``) or ``"unstarted"`` (the time limit came first)."""

    task: Task
    status: str
    value: Any = None
    error: ChildFailed | None = None
    seconds: float = 0.0


def run_tasks(
    tasks: Sequence[Task],
    jobs: int = 1,
    *,
    say: Callable[[str], None] = print,
    on_done: Callable[[Result], Any] | None = None,
    stop_at: float | None = None,
    label: str = "sweep",
    stopped: str = "time limit reached",
) -> list[Result]:
    """Run ``tasks`` in their order, up to ``jobs`` at once; every task's :class:`Result`, in
    the order they ended (the unstarted last). A task waits while the task its ``after`` names
    is still to run or under way; when every task left waits and none runs (they wait for each
    other), :class:`ValueError`. Lines start with ``label``; ``stopped`` says why tasks were
    left out at ``stop_at``."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, not {jobs}")
    pending = list(tasks)
    running: dict[Future, tuple[Task, float]] = {}
    results: list[Result] = []
    total = len(pending)

    def under_way() -> str:
        now = time.monotonic()
        return "running " + ", ".join(
            f"{t.name} ({duration(now - started)})" for t, started in running.values()
        )

    def eta() -> str:
        left, rate = total - said.done, said.rate(said.clock())
        return f", ETA {duration(left / rate)}" if left > 0 and rate > 0 else ""

    said = Progress(label, total, "runs", emit=say, longest=60.0, detail=under_way)
    pool = ThreadPoolExecutor(jobs)
    try:
        while pending or running:
            if pending and stop_at is not None and time.monotonic() >= stop_at:
                say(f"{label}: {stopped}: {len(pending)} runs not started")
                results += [Result(t, "unstarted") for t in pending]
                pending = []
                continue
            waiting = {t.name for t in pending} | {t.name for t, _ in running.values()}
            for task in list(pending):
                if len(running) >= jobs:
                    break
                if task.after is not None and task.after in waiting:
                    continue
                pending.remove(task)
                where = f" -> {task.folder}" if task.folder is not None else ""
                say(f"{label}: start {task.name}{where}")
                running[pool.submit(task.run)] = (task, time.monotonic())
            if not running:
                names = ", ".join(t.name for t in pending)
                raise ValueError(f"runs that wait for each other: {names}")
            done, _ = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
            said.tick()
            for future in [f for f in running if f in done]:  # in the order they started
                task, started = running.pop(future)
                seconds = time.monotonic() - started
                said.done += 1  # counted without a line of its own: the line below says it
                count = f"[{len(results) + 1}/{total}]"
                try:
                    value = future.result()
                except ChildFailed as exc:
                    results.append(Result(task, "failed", error=exc, seconds=seconds))
                    say(f"{label}: {count} {task.name} FAILED: {exc}")
                    continue
                result = Result(task, "done", value=value, seconds=seconds)
                results.append(result)
                say(f"{label}: {count} {task.name} done in {duration(seconds)}{eta()}")
                if on_done is not None:
                    on_done(result)
        said.close()
    except BaseException:
        stop_children()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return results
