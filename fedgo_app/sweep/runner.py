"""Running a sweep: every variant x seed as a child process, side by side, resumable.

Each run is ``python -m fedgo_app.inprocess CONFIG [common k=v] [variant's k=v] seed=N
output_dir=<out>/<variant>/seed<N> resume=true`` (the ServerApp and ClientApp code of
``./run.sh --local``), its output in ``run.log`` in its folder. A run whose folder holds a
``summary.json`` is not run again; one that stopped half-way continues from its checkpoint
(``resume=true``). A finished run whose ``config.yaml`` differs from what the sweep would run
now (:func:`fedgo_flwr.records.checkpoint.config_differences`, and more rounds than asked) is
**stale**: it is left out of the table and named, never silently reused nor replaced (delete
its folder to run it again); one with fewer rounds than asked is extended (``resume=true``).
A run that fails is recorded (exit code, the log's tail) and the others go on; the runs start
through the child-run engine that the benchmarks share too (:mod:`fedgo_app.sweep.engine`).
A symbolic link at a run's folder or at one of its files below ``out`` (``<out>/<variant> ->
/elsewhere``) is refused before anything runs: the sweep never writes or reads through a link it
did not make (:func:`fedgo_flwr.runtime.fileio.path_inside`).

Every variant is loaded and checked (:func:`strategies.load_experiment`,
:func:`fedgo_app.cli.preflight`) before any run starts, so a bad key stops the sweep at once.

Side by side: ``jobs`` runs at a time; by default as many as the CPUs hold runs of the
variants' widest thread count (a run's server uses ``resources.server_cpus`` torch threads,
all cores when unset, its clients ``resources.client_cpus``), so with the defaults one run at
a time. Threads change the last float bits of a run, so the sweep never changes them itself:
set ``resources.server_cpus`` to run several at once.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import yaml

from fedgo_app.sweep.engine import ChildFailed, Task, run_child, run_tasks
from fedgo_app.sweep.table import SUMMARY, run_dir
from fedgo_app.sweep.variants import Variant
from fedgo_flwr.runtime.fileio import path_inside

__all__ = ["InvalidVariant", "Job", "Outcome", "default_jobs", "execute", "plan"]

LOG = "run.log"
CHECKED = (LOG, SUMMARY, "config.yaml", "metrics.jsonl", "env.json")
"""A run's files that the sweep itself writes or reads: none may be a link (nor their folders)."""


class InvalidVariant(ValueError):
    """A variant's configuration does not load or does not pass the checks of ``run.sh``."""


@dataclass
class Job:
    variant: Variant
    seed: int
    folder: Path
    args: list[str]  # config and overrides, as python -m fedgo_app.inprocess takes them
    threads: int

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", "fedgo_app.inprocess", *self.args]


@dataclass
class Outcome:
    variant: str
    seed: int
    status: str  # "done" | "skipped" | "failed" | "stale" | "unstarted"
    detail: str = ""


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def run_args(variant: Variant, common: Sequence[str], seed: int, folder: Path) -> list[str]:
    return [
        variant.config,
        *common,
        *variant.overrides,
        f"seed={seed}",
        f"output_dir={folder.resolve()}",
        "resume=true",
    ]


def plan(
    variants: Sequence[Variant],
    common: Sequence[str],
    seeds: Sequence[int],
    out: Path,
    check_machine: bool = True,
) -> tuple[list[Job], list[Outcome]]:
    """Check every variant's configuration (raises :class:`InvalidVariant`) and sort the
    runs into those to run and those already finished (``skipped``) or finished under another
    configuration (``stale``). Without ``check_machine`` the pre-flight checks of the machine
    (data paths, devices) are left out: for a table of runs made elsewhere. A link at a run's
    folder or files below ``out`` raises :class:`~fedgo_flwr.runtime.fileio.UnsafePathError`."""
    from fedgo_app.cli import preflight
    from fedgo_flwr.config.experiment import ConfigError
    from fedgo_flwr.records.checkpoint import config_differences
    from strategies import load_experiment

    jobs, settled = [], []
    for v in variants:
        for seed in seeds:
            folder = run_dir(out, v.name, seed)
            for name in CHECKED:
                path_inside(out, folder.relative_to(out).joinpath(name).as_posix())
            args = run_args(v, common, seed, folder)
            try:
                cfg = load_experiment(args[0], args[1:])
                if check_machine:
                    preflight(cfg)
            except ConfigError as exc:
                raise InvalidVariant(f"variant {v.name}: {exc}") from exc
            threads = max(cfg.resources.server_cpus or cpu_count(), cfg.resources.client_cpus)
            if (folder / SUMMARY).is_file():
                saved_yaml = folder / "config.yaml"
                saved = yaml.safe_load(saved_yaml.read_text()) if saved_yaml.is_file() else {}
                saved = saved if isinstance(saved, dict) else {}
                changed = config_differences(saved, cfg)
                if saved.get("rounds", cfg.rounds) > cfg.rounds:
                    changed.append(f"rounds ({saved['rounds']!r} -> {cfg.rounds!r})")
                if changed:
                    why = f"{folder} finished under another configuration: " + "; ".join(changed)
                    settled.append(Outcome(v.name, seed, "stale", why))
                    continue
                if saved.get("rounds", cfg.rounds) == cfg.rounds:
                    settled.append(Outcome(v.name, seed, "skipped"))
                    continue
            jobs.append(Job(v, seed, folder, args, threads))
    return jobs, settled


def default_jobs(jobs: Sequence[Job]) -> int:
    """As many runs at once as the CPUs hold runs of the widest thread count (at least 1)."""
    widest = max((j.threads for j in jobs), default=1)
    return max(1, cpu_count() // widest)


def _run(job: Job) -> float:
    """One run through :func:`~fedgo_app.sweep.engine.run_child`; its wall time. A run
    that exits 0 without a ``summary.json`` written after it started failed too."""
    log = job.folder / LOG
    started = time.time()
    wall = run_child(job.command, log, label=f"{job.variant.name} seed {job.seed}")
    summary = job.folder / SUMMARY
    if not (summary.is_file() and summary.stat().st_mtime >= started - 1):
        reason = "exit 0 without a new summary.json"
        raise ChildFailed.of(f"{job.variant.name} seed {job.seed}", reason, log)
    return wall


def execute(
    jobs: Sequence[Job],
    parallel: int,
    say=print,
    on_done=None,
    stop_at: float | None = None,
) -> list[Outcome]:
    """Run ``jobs``, ``parallel`` at a time (:func:`~fedgo_app.sweep.engine.run_tasks`);
    return each run's outcome. A run succeeded when it exited 0 and left a ``summary.json``
    written after it started; ``on_done(job)`` is then called (the sweep's archive keeps it).
    ``stop_at`` (a :func:`time.monotonic` time): no run starts after it, the runs under way
    finish, and the others are ``unstarted`` (a lease or batch job that ends at a fixed time
    loses no finished run; the next sweep goes on). Ctrl-C stops the runs this started (each
    by its own process) and re-raises."""
    tasks = [
        Task(f"{j.variant.name} seed {j.seed}", partial(_run, j), folder=j.folder, payload=j)
        for j in jobs
    ]
    done = None if on_done is None else (lambda result: on_done(result.task.payload))
    results = run_tasks(
        tasks, parallel, say=say, on_done=done, stop_at=stop_at, stopped="--stop-after reached"
    )
    outcomes = []
    for r in results:
        job = r.task.payload
        if r.status == "done":
            detail = f"{r.seconds:.0f} s"
        elif r.status == "failed":
            why = r.error.reason or r.error.headline
            detail = f"{why}; log {job.folder / LOG}"
        else:
            detail = "not started: --stop-after reached (run the sweep again to go on)"
        outcomes.append(Outcome(job.variant.name, job.seed, r.status, detail))
    return outcomes
