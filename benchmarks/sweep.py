"""The benchmark drivers' one shared module: child-process runs, the sweep, the kept records
and the table cells. A driver keeps only what is its own (methods, configs, table layout).

Running: :func:`run_command` starts every run's process (``./run.sh``, the in-process runner or
a driver's own ``--child`` entry, :func:`child_command` / :func:`child`), its output in the
run's ``run.log``, and raises :class:`RunFailed` with the log's tail; :func:`run_child` adds the
check that the run finished. :func:`sweep` and :func:`run_grid` (which reports a failed run and
goes on) run methods x seeds; :func:`parse_with_overrides` reads a driver's command line with
``k=v`` config overrides anywhere; :func:`write_table` writes and prints its table.

A sweep runs every (seed, method) pair through a driver's ``run_one(method, seed)``, which returns
the run's output folder, and skips a pair whose ``summary.json`` is already in the results folder,
so an interrupted sweep resumes where it stopped. A results folder holds, per finished run:

- ``<method>-seed<N>/summary.json`` (and whatever small per-run reports a driver adds there);
- the run's raw records, ``metrics.jsonl``, ``config.yaml`` and ``prefl.json``: either loose in
  that folder (when the run itself wrote there), or, when the run wrote elsewhere and its
  records were kept (:func:`keep_run`), as ``<method>-seed<N>/<file>`` in one archive per
  results folder, ``runs.tar.gz``. Kept records name paths inside the repository relative to it.

:func:`load_runs` reads every finished run back and :func:`mean_sd` / :func:`column` turn
per-seed values into the ``mean ± sd`` cells of the drivers' tables, :func:`mean_ci` into
``mean ± 95% CI half-width`` cells, :func:`paired_cell` into a paired difference against a
baseline with its interval and paired t-test, and :func:`seed_note` names the seed set a table
was built on (tuning seeds: not for claims). The statistics are the library's
(:mod:`fedgo_flwr.app.sweep.stats`, the seed sets :mod:`fedgo_flwr.app.sweep.seeds`), so the drivers
and ``python -m fedgo_flwr.app.sweep`` compute them one way.

Imported by the drivers next to it (``from benchmarks.sweep import ...``; they run as
``python -m benchmarks.<driver>`` from the repository's root).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fedgo_flwr.app.sweep.seeds import REPORT_SEEDS, TUNING_SEEDS, classify
from fedgo_flwr.app.sweep.stats import paired, summarize

__all__ = ["REPORT_SEEDS", "TUNING_SEEDS"]  # the named seed sets, for the drivers' defaults

ROOT = Path(__file__).resolve().parent.parent  # the repository
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


def run_command(
    cmd: Sequence[str],
    log: Path,
    *,
    root: Path = ROOT,
    env: dict[str, str] | None = None,
    label: str | None = None,
) -> float:
    """Run ``cmd`` in ``root`` with its output appended to ``log``; its wall time in seconds,
    or :class:`RunFailed` with the log's tail if it exits with an error.

    The one way the drivers start a run's process (``./run.sh``, ``-m fedgo_flwr.app.inprocess``
    or a driver's own ``--child`` entry). ``root`` goes first on its ``PYTHONPATH``; ``env``
    (default: this process's) is its environment otherwise. ``label`` (default: the log's
    folder) names the run in the error.
    """
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH", "")]))
    print("$", " ".join(cmd[1:]), file=sys.stderr, flush=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log, "a") as out:
        proc = subprocess.run(list(cmd), cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = log.read_text()[-3000:]
        label = label or log.parent.name
        raise RunFailed(f"{label} failed (exit {proc.returncode}; {log}):\n{tail}")
    return wall


def run_child(cmd: Sequence[str], run_dir: Path, name: str, root: Path = ROOT) -> Path:
    """Run ``cmd`` (a driver's ``--child`` entry, :func:`child_command`) with its output in
    ``run_dir/run.log``; return ``run_dir``, or raise :class:`RunFailed` with the log's tail.

    A ``run_dir`` that holds a finished run whose records were not kept (the driver stopped in
    between) is cleared first: the config may have changed since, so it runs again rather than
    being trusted.
    """
    if (run_dir / SUMMARY).exists():
        shutil.rmtree(run_dir)
    log = run_dir / "run.log"
    run_command(cmd, log, root=root, label=name)
    if not (run_dir / SUMMARY).exists():
        raise RunFailed(f"{name} failed (exit 0; {log}):\n{log.read_text()[-3000:]}")
    return run_dir


def child_command(module: str, config: str, overrides: Sequence[str]) -> list[str]:
    """The subprocess that runs one experiment in-process: ``python -m <module> --child CONFIG
    k=v ...``, the driver's ``main`` handing it to :func:`child`."""
    return [sys.executable, "-m", module, "--child", config, *overrides]


def load_config(config: str, overrides: Sequence[str]):
    """The checked experiment (``ConfigError`` names a bad key); ``config`` is relative to the
    repository."""
    from strategies import load_experiment

    return load_experiment(ROOT / config, list(overrides))


def child(argv: Sequence[str]) -> None:
    """``--child CONFIG k=v ...``: one run through
    :func:`fedgo_flwr.app.inprocess.run_inprocess`."""
    from fedgo_flwr.app.inprocess import run_inprocess

    run_inprocess(load_config(argv[0], argv[1:]))


def run_grid(
    methods: Sequence[str],
    seeds: Sequence[int],
    run: Callable[[str, int], Path],
    results: Path,
    *,
    root: Path = ROOT,
) -> list[str]:
    """:func:`sweep` one (seed, method) at a time, so that a failed run (:class:`RunFailed`)
    is reported and the others still run; returns the failures' messages."""
    failed = []
    for seed in seeds:
        for method in methods:
            try:
                sweep([method], [seed], run, results, root=root)
            except RunFailed as exc:
                print(exc, file=sys.stderr, flush=True)
                failed.append(str(exc).splitlines()[0])
    return failed


def parse_with_overrides(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None):
    """``parser``'s namespace, with the ``k=v`` words as ``overrides``: those are taken out
    before argparse wherever they stand (after ``--seeds 0 1`` too), as list options would
    swallow them."""
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    args = parser.parse_args([a for a in argv if a not in overrides])
    args.overrides = overrides
    return args


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


MISSING = "–"  # a table cell without a value (an en dash)


def fmt(values: Sequence[float], digits: int = 2, scale: float = 1.0) -> str:
    """``"m ± sd"`` (sample sd; 0 for one value) of ``values`` times ``scale``; ``–`` if none."""
    if not values:
        return MISSING
    m = statistics.mean(values) * scale
    sd = statistics.stdev(values) * scale if len(values) > 1 else 0.0
    return f"{m:.{digits}f} ± {sd:.{digits}f}"


def write_table(results: Path, text: str, name: str = "table.md") -> None:
    """Write a driver's table to ``results/<name>`` (with a final newline) and print it."""
    results.mkdir(parents=True, exist_ok=True)
    (results / name).write_text(text + "\n")
    print(text)


def _nan_note(n_nan: int) -> str:
    return f" ({n_nan} NaN)" if n_nan else ""


def mean_sd(values: Sequence[float], scale: float = 100.0) -> str:
    """``"m ± sd"`` of ``values`` times ``scale``, one decimal (sample sd; 0 for one value;
    ``"-"`` for none; NaN values left out and counted: ``" (1 NaN)"``)."""
    s = summarize(values)
    if s.n == 0:
        return "-" + _nan_note(s.n_nan)
    return f"{s.mean * scale:.1f} ± {(s.sd or 0.0) * scale:.1f}" + _nan_note(s.n_nan)


def mean_ci(values: Sequence[float], scale: float = 100.0) -> str:
    """``"m ± h"``: the mean and the half-width of its 95% t interval, times ``scale``, one
    decimal (``"m (n=1, no CI)"`` for one value, ``"-"`` for none)."""
    s = summarize(values)
    if s.n == 0:
        return "-" + _nan_note(s.n_nan)
    if s.n == 1:
        return f"{s.mean * scale:.1f} (n=1, no CI)" + _nan_note(s.n_nan)
    return f"{s.mean * scale:.1f} ± {s.half_width * scale:.1f}" + _nan_note(s.n_nan)


def paired_cell(
    baseline: Iterable[Run],
    runs: Iterable[Run],
    value: Callable[[Run], float | None],
    scale: float = 100.0,
) -> str:
    """``runs`` minus ``baseline`` seed by seed (runs paired by ``seed``): ``"+d [lo, hi]
    p=P (n=k)"``, the mean difference times ``scale`` with its 95% t interval and the paired
    t-test's p-value; ``"-"`` without a common seed, no interval or test below 2 pairs."""
    result = paired({r.seed: value(r) for r in baseline}, {r.seed: value(r) for r in runs})
    d = result.diff
    if d.n == 0:
        return "-"
    cell = f"{d.mean * scale:+.1f}"
    if d.ci_low is not None:
        cell += f" [{d.ci_low * scale:+.1f}, {d.ci_high * scale:+.1f}]"
    if result.p_value is not None:
        cell += f" p={result.p_value:.2g}"
    return f"{cell} (n={d.n})"


def seed_note(seeds: Iterable[int]) -> str:
    """The sentence a table's header carries about its seeds: ``"tuning seeds: not for
    claims (...)"`` for any of :data:`TUNING_SEEDS`, ``"report seeds (...)"`` for
    :data:`REPORT_SEEDS` only (:mod:`fedgo_flwr.app.sweep.seeds`)."""
    return classify(tuple(seeds)).note


def column(runs: Iterable[Run], value: Callable[[Run], float | None], scale: float = 100.0) -> str:
    """:func:`mean_sd` of ``value(run)`` over the runs that have one (``None``: left out)."""
    values = [v for v in (value(run) for run in runs) if v is not None]
    return mean_sd(values, scale)
