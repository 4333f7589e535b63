"""The benchmark drivers' shared sweep: run methods x seeds, keep the records, mean ± sd.

A sweep runs every (seed, method) pair through a driver's ``run_one(method, seed)``, which returns
the run's output folder, and skips a pair whose ``summary.json`` is already in the results folder,
so an interrupted sweep resumes where it stopped. A results folder holds, per finished run:

- ``<method>-seed<N>/summary.json`` (and whatever small per-run reports a driver adds there);
- the run's raw records, ``metrics.jsonl``, ``config.yaml`` and ``prefl.json``: either loose in
  that folder (when the run itself wrote there), or, when the run wrote elsewhere and its
  records were kept (:func:`keep_run`), as ``<method>-seed<N>/<file>`` in one archive per
  results folder, ``runs.tar.gz``. Kept records name paths inside the repository relative to it.

:func:`load_runs` reads every finished run back and :func:`mean_sd` / :func:`column` turn
per-seed values into the ``mean ± sd`` cells of the drivers' tables.

Imported by the drivers next to it (``python benchmarks/<driver>.py`` puts this folder first on
``sys.path``); it uses nothing of the library.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

ARCHIVE = "runs.tar.gz"
RAW_FILES = ("metrics.jsonl", "config.yaml", "prefl.json")
SUMMARY = "summary.json"


@dataclass
class Run:
    """One finished run: ``name`` is ``<method>-seed<N>``, ``seed`` its suffix ``seed<N>``."""

    name: str
    method: str
    seed: str
    summary: dict
    metrics: list[dict]


def run_name(method: str, seed: int) -> str:
    return f"{method}-seed{seed}"


def seed_of(name: str) -> str:
    """``"seed0"`` for a run named ``<method>-seed0``."""
    return name.split("-")[-1]


# -- running -------------------------------------------------------------------------------


def sweep(
    methods: Sequence[str],
    seeds: Iterable[int],
    run_one: Callable[[str, int], Path],
    results: Path,
    *,
    root: Path | None = None,
) -> list[str]:
    """Run each seed's methods in the given order, skipping finished runs; return those run.

    ``run_one(method, seed)`` must leave a finished run (with ``summary.json``) in the folder it
    returns. If that folder is not ``results/<name>``, the run's records are kept there with
    :func:`keep_run` (paths under ``root`` made relative).
    """
    ran = []
    for seed in seeds:
        for method in methods:
            name = run_name(method, seed)
            if (results / name / SUMMARY).exists():
                continue
            run_dir = run_one(method, seed)
            if run_dir.resolve() != (results / name).resolve():
                keep_run(run_dir, results, name, root=root)
            ran.append(name)
    return ran


class RunFailed(RuntimeError):
    """A run's subprocess exited with an error (its log names the cause)."""


def run_child(cmd: Sequence[str], run_dir: Path, name: str, root: Path) -> Path:
    """Run ``cmd`` (a driver's ``--child`` entry) with its output in ``run_dir/run.log``;
    return ``run_dir``, or raise :class:`RunFailed` with the log's tail.

    A ``run_dir`` that holds a finished run whose records were not kept (the driver stopped in
    between) is cleared first: the config may have changed since, so it runs again rather than
    being trusted. ``root`` goes first on the child's ``PYTHONPATH``.
    """
    if (run_dir / SUMMARY).exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    print("$", " ".join(cmd[2:]), file=sys.stderr, flush=True)
    pythonpath = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH", "")]))
    log = run_dir / "run.log"
    with open(log, "a") as out:
        proc = subprocess.run(
            list(cmd),
            cwd=root,
            env={**os.environ, "PYTHONPATH": pythonpath},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    if proc.returncode != 0 or not (run_dir / SUMMARY).exists():
        tail = log.read_text()[-2000:]
        raise RunFailed(f"{name} failed (exit {proc.returncode}; {log}):\n{tail}")
    return run_dir


def relative_paths(text: str, root: Path | None) -> str:
    """``text`` with every ``<root>/...`` path written relative to ``root``."""
    return text if root is None else text.replace(f"{Path(root).resolve()}/", "")


def keep_run(run_dir: Path, results: Path, name: str, *, root: Path | None = None) -> None:
    """Add ``run_dir``'s raw records to ``results``' archive, then its summary to ``results``.

    The summary comes last: it marks the run as finished, so an interruption in between only
    makes the next sweep run it again.
    """
    raw = {
        f"{name}/{file}": relative_paths((run_dir / file).read_text(), root).encode()
        for file in RAW_FILES
        if (run_dir / file).is_file()
    }
    add_to_archive(results / ARCHIVE, raw)
    (results / name).mkdir(parents=True, exist_ok=True)
    (results / name / SUMMARY).write_text((run_dir / SUMMARY).read_text())


# -- the archive ---------------------------------------------------------------------------


def read_archive(path: Path) -> dict[str, bytes]:
    """Every file of a ``runs.tar.gz`` (``{}`` if there is none)."""
    if not path.is_file():
        return {}
    with tarfile.open(path, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def write_archive(path: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` as a gzipped tar, byte for byte the same for the same files (sorted
    names, no dates or owners), so that re-packing unchanged records changes nothing in git."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(files[name]), 0o644, 0
            tar.addfile(info, io.BytesIO(files[name]))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
        gz.write(buffer.getvalue())


def add_to_archive(path: Path, files: dict[str, bytes]) -> None:
    """Add (or replace) ``files`` in the archive at ``path``."""
    write_archive(path, {**read_archive(path), **files})


# -- reading -------------------------------------------------------------------------------


def load_runs(
    results: Path, methods: Iterable[str], seeds: Sequence[int] | None = None
) -> dict[str, list[Run]]:
    """Finished runs by method, in ``methods`` order; each method's runs in ``seeds`` order, or,
    without ``seeds``, every finished run of the method in the order of its folder names.

    A run's ``metrics.jsonl`` is read from its folder if it is there, else from the archive
    (a run without either has no metric rows). A requested seed without a summary is an error.
    """
    archive = read_archive(results / ARCHIVE)
    runs: dict[str, list[Run]] = {}
    for method in methods:
        if seeds is None:
            names = [p.parent.name for p in sorted(results.glob(f"{method}-seed*/{SUMMARY}"))]
        else:
            names = [run_name(method, s) for s in seeds]
        for name in names:
            summary_path = results / name / SUMMARY
            if not summary_path.is_file():
                raise FileNotFoundError(f"{summary_path}: the run has not finished")
            loose = results / name / "metrics.jsonl"
            if loose.is_file():
                text = loose.read_text()
            else:
                text = archive.get(f"{name}/metrics.jsonl", b"").decode()
            run = Run(
                name=name,
                method=method,
                seed=seed_of(name),
                summary=json.loads(summary_path.read_text()),
                metrics=[json.loads(line) for line in text.splitlines()],
            )
            runs.setdefault(method, []).append(run)
    return runs


# -- aggregation ---------------------------------------------------------------------------


def mean_sd(values: Sequence[float], scale: float = 100.0) -> str:
    """``"m ± sd"`` of ``values`` times ``scale``, one decimal (sample sd; 0 for one value;
    ``"-"`` for none)."""
    if not values:
        return "-"
    m = statistics.mean(values) * scale
    sd = statistics.stdev(values) * scale if len(values) > 1 else 0.0
    return f"{m:.1f} ± {sd:.1f}"


def column(runs: Iterable[Run], value: Callable[[Run], float | None], scale: float = 100.0) -> str:
    """:func:`mean_sd` of ``value(run)`` over the runs that have one (``None``: left out)."""
    values = [v for v in (value(run) for run in runs) if v is not None]
    return mean_sd(values, scale)
