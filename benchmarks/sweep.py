"""The benchmarks' shared module: their runs on the child-run engine, the kept records and the
table cells. A spec (:mod:`benchmarks.spec`) or a driver keeps only what is its own (methods,
configs, table layout).

Running: the process start, its log, the failure with the log's tail, several runs at once and
the time limit are the child-run engine's (:mod:`fedgo_app.sweep.engine`, which
``python -m fedgo_app.sweep`` runs on too). Here: :func:`run_command` starts a run's process
through it (``./run.sh``, the in-process runner or a ``--child`` entry, :func:`child_command` /
:func:`child`) and raises :class:`RunFailed` (the engine's ``ChildFailed``); :func:`run_child`
adds the check that the run finished; :func:`run_grid` runs methods x seeds on the engine,
skipping runs already kept and keeping each finished one (it reports a failed run and goes on,
and runs several at once with ``jobs``). :func:`parse_with_overrides` reads a command line with
``k=v`` config overrides anywhere, :func:`add_data_arguments` / :func:`ensure_data` its
``--data`` / ``--archive`` (the CIFAR-10 JPEG tree); :func:`write_table` writes and prints a
table.

A results folder holds its table(s) and one archive, ``runs.tar.xz``, with every finished run's
files as ``<method>-seed<N>/<file>``: ``summary.json``, the raw records ``metrics.jsonl``,
``config.yaml`` and ``prefl.json``, and whatever small per-run reports a driver adds
(:func:`keep_run`; kept records name paths inside the repository relative to it). A run whose
``summary.json`` is kept is finished, so an interrupted sweep resumes where it stopped. A run
that wrote into ``results/<method>-seed<N>/`` itself is read from there (:class:`Kept`);
:func:`pack` moves such folders into the archive, and :func:`forget` drops runs so that the
next sweep runs them again. An older ``runs.tar.gz`` is read as well, and replaced by
``runs.tar.xz`` at the next write (``python -m benchmarks.sweep pack RESULTS...`` converts it).

:func:`load_runs` reads every finished run back and :func:`mean_sd` / :func:`column` turn
per-seed values into the ``mean ± sd`` cells of the drivers' tables, :func:`mean_ci` into
``mean ± 95% CI half-width`` cells, :func:`paired_cell` into a paired difference against a
baseline with its interval and paired t-test, :func:`ratio_cell` per-seed ratios into their
geometric mean with its log-scale interval, and :func:`seed_note` names the seed set a table
was built on (tuning seeds: not for claims). The statistics are the library's
(:mod:`fedgo_app.sweep.stats`, the seed sets :mod:`fedgo_app.sweep.seeds`), so the drivers
and ``python -m fedgo_app.sweep`` compute them one way.

Imported by the specs and drivers next to it (``from benchmarks.sweep import ...``; they run as
``python -m benchmarks run NAME`` or ``python -m benchmarks.<driver>`` from the repository's
root).
"""

from __future__ import annotations

import argparse
import fnmatch
import gzip
import io
import json
import lzma
import os
import shutil
import statistics
import sys
import tarfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from fedgo_app.sweep import engine
from fedgo_app.sweep.engine import ChildFailed
from fedgo_app.sweep.seeds import REPORT_SEEDS, TUNING_SEEDS, classify
from fedgo_app.sweep.stats import Paired, paired, ratio_summary, summarize
from fedgo_flwr.runtime.fileio import UnsafePathError, atomic_write_text, path_inside

__all__ = ["REPORT_SEEDS", "TUNING_SEEDS"]  # the named seed sets, for the drivers' defaults

ROOT = Path(__file__).resolve().parent.parent  # the repository
DEFAULT_DATA = ".cache/cifar10-jpg"  # the CIFAR-10 JPEG tree, relative to the repository
ARCHIVE = "runs.tar.xz"
OLD_ARCHIVE = "runs.tar.gz"  # read; the next write replaces it with ARCHIVE
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


RunFailed = ChildFailed
"""A run's subprocess exited with an error (its message: the run, the exit code, the log's
tail); the child-run engine's :class:`~fedgo_app.sweep.engine.ChildFailed`."""


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

    The one way the drivers start a run's process (``./run.sh``, ``-m fedgo_app.inprocess``
    or the ``--child`` entry): :func:`fedgo_app.sweep.engine.run_child`, in ``root``, with
    ``root`` first on its ``PYTHONPATH``; ``env`` (default: this process's) is its environment
    otherwise. ``label`` (default: the log's folder) names the run in the error.
    """
    print("$", " ".join(map(str, cmd[1:])), file=sys.stderr, flush=True)
    return engine.run_child(cmd, log, label=label, cwd=root, env=env, root=root)


def run_child(cmd: Sequence[str], run_dir: Path, name: str, root: Path = ROOT) -> Path:
    """Run ``cmd`` (a spec's run, :func:`child_command` or ``./run.sh``) with its output in
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
    k=v ...``, the module's ``main`` handing it to :func:`child` (``python -m benchmarks``
    for the specs)."""
    return [sys.executable, "-m", module, "--child", config, *overrides]


def load_config(config: str, overrides: Sequence[str]):
    """The checked experiment (``ConfigError`` names a bad key); ``config`` is relative to the
    repository."""
    from strategies import load_experiment

    return load_experiment(ROOT / config, list(overrides))


def child(argv: Sequence[str]) -> None:
    """``--child CONFIG k=v ...``: one run through
    :func:`fedgo_app.inprocess.run_inprocess`."""
    from fedgo_app.inprocess import run_inprocess

    run_inprocess(load_config(argv[0], argv[1:]))


def run_grid(
    methods: Sequence[str],
    seeds: Sequence[int],
    run: Callable[[str, int], Path],
    results: Path,
    *,
    root: Path = ROOT,
    jobs: int = 1,
    after: Callable[[str], str | None] | None = None,
    stop_at: float | None = None,
) -> list[str]:
    """Every (seed, method) not kept in ``results`` yet, seed by seed, through the child-run
    engine (:func:`fedgo_app.sweep.engine.run_tasks`): ``run(method, seed)`` makes the run
    and returns its folder; a failed run (:class:`RunFailed`) is reported and the others still
    run; returns the failures' first lines.

    ``jobs`` > 1: up to that many runs at once (each is its own process already; ``run`` is
    called from worker threads). A run waits until the run of its seed that ``after(method)``
    names (the source whose files it reuses) is over, if that one is still to run here. This
    thread keeps the finished runs' records, one at a time, as they end (:func:`keep_run`).

    ``stop_at`` (a :func:`time.monotonic` time): no run starts after it; the runs under way
    finish and are kept, and the runs not started are one failure message (a device lease
    ends at a fixed time, and a run cut short is lost).
    """
    done = set(Kept(results).names())
    tasks = []
    for seed in seeds:
        for method in methods:
            name = run_name(method, seed)
            if name in done:
                continue
            source = after(method) if after is not None else None
            first = None if source is None else run_name(source, seed)
            tasks.append(engine.Task(name, partial(run, method, seed), after=first))

    def keep(result: engine.Result) -> None:
        keep_finished(result.value, results, result.task.name, root)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    ended = engine.run_tasks(tasks, jobs, say=say, on_done=keep, stop_at=stop_at, label="runs")
    failed = [r.error.headline for r in ended if r.status == "failed"]
    return failed + not_started(sum(r.status == "unstarted" for r in ended))


def not_started(count: int) -> list[str]:
    """The failure message for ``count`` runs left out by ``stop_at`` (none for 0)."""
    return [f"{count} run(s) not started: the time limit was reached"] if count else []


def keep_finished(run_dir: Path, results: Path, name: str, root: Path | None) -> None:
    """Keep a finished run's files in ``results``' archive, unless it wrote them there itself."""
    if run_dir.resolve() != (results / name).resolve():
        keep_run(run_dir, results, name, root=root)


def parse_with_overrides(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None):
    """``parser``'s namespace, with the ``k=v`` words as ``overrides``: those are taken out
    before argparse wherever they stand (after ``--seeds 0 1`` too), as list options would
    swallow them."""
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    args = parser.parse_args([a for a in argv if a not in overrides])
    args.overrides = overrides
    return args


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """``--data`` and ``--archive``: where the CIFAR-10 JPEG tree is (or its .tar.gz)."""
    parser.add_argument(
        "--data",
        default=os.environ.get("FEDGO_CIFAR10", DEFAULT_DATA),
        help="unpacked CIFAR-10 JPEG tree; relative paths are taken from the repository root "
        f"(default: $FEDGO_CIFAR10, else {DEFAULT_DATA})",
    )
    parser.add_argument(
        "--archive",
        default=os.environ.get("FEDGO_CIFAR10_ARCHIVE"),
        help=".tar.gz of that tree, unpacked into --data if it is missing "
        "(default: $FEDGO_CIFAR10_ARCHIVE)",
    )


def ensure_data(data: Path, archive: str | None) -> Path:
    """The unpacked JPEG tree at ``data``, unpacked from ``archive`` first if it is missing."""
    if (data / "train").is_dir():
        return data
    if not archive or not Path(archive).is_file():
        sys.exit(
            f"CIFAR-10 JPEGs not found in {data} (no train/ folder). Give the unpacked tree "
            "with --data or $FEDGO_CIFAR10, or its .tar.gz with --archive or "
            "$FEDGO_CIFAR10_ARCHIVE."
        )
    data.mkdir(parents=True, exist_ok=True)
    print(f"unpacking {archive} -> {data}", file=sys.stderr)
    try:
        with tarfile.open(archive) as tar:
            # every member checked first, so a bad archive unpacks nothing (the "data" filter
            # would stop half-way); then extractall's own "data" filter, as a second guard
            for member in tar.getmembers():
                if not (member.isfile() or member.isdir()):
                    raise UnsafePathError(
                        f"{archive}: member {member.name!r} is neither a file nor a folder "
                        "(a link or a device); nothing is unpacked"
                    )
                name = member.name.rstrip("/")
                while name.startswith("./"):  # made by `tar -C tree -czf archive .`
                    name = name[2:]
                if not (name == "." and member.isdir()):
                    path_inside(data, name, f"{archive}: member ")
            tar.extractall(data, filter="data")
    except UnsafePathError as exc:
        sys.exit(str(exc))
    except (tarfile.TarError, OSError) as exc:
        sys.exit(f"cannot unpack {archive}: {exc}")
    inner = [p for p in data.iterdir() if p.is_dir() and (p / "train").is_dir()]
    if not (data / "train").is_dir() and inner:
        for child in inner[0].iterdir():
            child.rename(data / child.name)
    return data


def relative_paths(text: str, root: Path | None) -> str:
    """``text`` with every ``<root>/...`` path written relative to ``root``."""
    return text if root is None else text.replace(f"{Path(root).resolve()}/", "")


def keep_run(
    run_dir: Path,
    results: Path,
    name: str,
    *,
    root: Path | None = None,
    extra: Sequence[str] = (),
) -> None:
    """Keep ``run_dir``'s summary, raw records and ``extra`` files as ``<name>/<file>`` in
    ``results``' archive (paths under ``root`` made relative).

    One write of the archive (a new file moved over the old), so an interruption keeps either
    all of the run or none of it; its ``summary.json`` marks it as finished.
    """
    names = (SUMMARY, *RAW_FILES, *extra)
    files = {
        f"{name}/{file}": relative_paths((run_dir / file).read_text(), root).encode()
        for file in names
        if (run_dir / file).is_file()
    }
    add_to_archive(results, files)


# -- the kept files ------------------------------------------------------------------------


class Kept:
    """The files kept in a results folder: ``<name>/<file>`` in its archive, or loose in
    ``results/<name>/`` (a run that wrote there itself; a loose file wins over the archive's)."""

    def __init__(self, results: Path) -> None:
        self.results = results
        self.archive = read_archive(archive_path(results))

    def names(self, file: str = SUMMARY, pattern: str = "*") -> list[str]:
        """The sorted names (``pattern``: a glob) that have ``file``; by default, the runs that
        finished."""
        loose = {p.parent.name for p in self.results.glob(f"{pattern}/{file}") if p.is_file()}
        packed = {
            member.split("/")[0]
            for member in self.archive
            if member.count("/") == 1
            and member.endswith(f"/{file}")
            and fnmatch.fnmatchcase(member.split("/")[0], pattern)
        }
        return sorted(loose | packed)

    def get(self, name: str, file: str) -> bytes | None:
        """``<name>/<file>``'s bytes (``None``: not kept)."""
        loose = self.results / name / file
        if loose.is_file():
            return loose.read_bytes()
        return self.archive.get(f"{name}/{file}")

    def json(self, name: str, file: str = SUMMARY):
        """``<name>/<file>`` read as JSON (``None``: not kept)."""
        data = self.get(name, file)
        return None if data is None else json.loads(data)


def finished(results: Path, name: str) -> bool:
    """Whether the run ``name``'s summary is kept in ``results``."""
    return Kept(results).get(name, SUMMARY) is not None


def forget(results: Path, names: Iterable[str]) -> None:
    """Drop the runs ``names`` from ``results`` (their folders and archived files), so that the
    next sweep runs them again."""
    names = set(names)
    for name in names:
        shutil.rmtree(results / name, ignore_errors=True)
    path = archive_path(results)
    files = read_archive(path)
    left = {m: data for m, data in files.items() if m.split("/")[0] not in names}
    if left != files:
        _replace_archive(results, left)


def pack(results: Path) -> list[str]:
    """Move every run folder of ``results`` (one with a ``summary.json``, or of a run already
    in the archive: all its files) into the archive, and a ``runs.tar.gz`` into
    ``runs.tar.xz``; return the runs moved."""
    archived = {member.split("/")[0] for member in read_archive(archive_path(results))}
    runs = [
        p
        for p in sorted(results.iterdir() if results.is_dir() else [])
        if p.is_dir() and ((p / SUMMARY).is_file() or p.name in archived)
    ]
    files = {
        f"{run.name}/{path.name}": path.read_bytes()
        for run in runs
        for path in sorted(run.iterdir())
        if path.is_file()
    }
    if files or (results / OLD_ARCHIVE).is_file():
        add_to_archive(results, files)
    for run in runs:
        shutil.rmtree(run)
    return [run.name for run in runs]


# -- the archive ---------------------------------------------------------------------------


def archive_path(results: Path) -> Path:
    """``results``' archive: ``runs.tar.xz``, or an older ``runs.tar.gz`` if only that is
    there (the next write replaces it with ``runs.tar.xz``)."""
    new, old = results / ARCHIVE, results / OLD_ARCHIVE
    return old if old.is_file() and not new.is_file() else new


def read_archive(path: Path) -> dict[str, bytes]:
    """Every file of a ``.tar.xz`` or ``.tar.gz`` (``{}`` if there is none). A member that is
    not a regular file (a link, a device, a folder) or whose name would leave the results
    folder (absolute, a ``..`` or ``.`` component) refuses the whole archive: one
    :class:`ValueError` naming the member and the archive."""
    if not path.is_file():
        return {}
    files = {}
    with tarfile.open(path, "r:*") as tar:
        for member in tar.getmembers():
            if not member.isfile():
                raise UnsafePathError(
                    f"{path}: member {member.name!r} is not a regular file (a link, a device "
                    "or a folder); the archive is not read"
                )
            path_inside(path.parent, member.name, f"{path}: member ")
            files[member.name] = tar.extractfile(member).read()
    return files


def write_archive(path: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` as a tar, xz-compressed (``.xz``; else gzipped), byte for byte the same
    for the same files (sorted names, no dates or owners), so that re-packing unchanged records
    changes nothing in git. The new file is moved over the old one: never half written."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(files[name]), 0o644, 0
            tar.addfile(info, io.BytesIO(files[name]))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    if path.name.endswith(".xz"):
        preset = 9 | lzma.PRESET_EXTREME
        tmp.write_bytes(lzma.compress(buffer.getvalue(), format=lzma.FORMAT_XZ, preset=preset))
    else:
        with (
            open(tmp, "wb") as raw,
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz,
        ):
            gz.write(buffer.getvalue())
    os.replace(tmp, path)


def _replace_archive(results: Path, files: dict[str, bytes]) -> None:
    """``results``' archive is now ``runs.tar.xz`` with ``files`` (an older ``.tar.gz`` goes)."""
    write_archive(results / ARCHIVE, files)
    (results / OLD_ARCHIVE).unlink(missing_ok=True)


def add_to_archive(results: Path, files: dict[str, bytes]) -> None:
    """Add (or replace) ``files`` in ``results``' archive (an older ``.tar.gz`` is read, and
    replaced by ``runs.tar.xz``)."""
    _replace_archive(results, {**read_archive(archive_path(results)), **files})


# -- reading -------------------------------------------------------------------------------


def load_runs(
    results: Path, methods: Iterable[str], seeds: Sequence[int] | None = None
) -> dict[str, list[Run]]:
    """Finished runs by method, in ``methods`` order; each method's runs in ``seeds`` order, or,
    without ``seeds``, every finished run of the method in the order of their names.

    A run's files are read from its folder if they are there, else from the archive
    (:class:`Kept`; a run without ``metrics.jsonl`` has no metric rows). A requested seed
    without a summary is an error.
    """
    kept = Kept(results)
    runs: dict[str, list[Run]] = {}
    for method in methods:
        if seeds is None:
            names = kept.names(pattern=f"{method}-seed*")
        else:
            names = [run_name(method, s) for s in seeds]
        for name in names:
            summary = kept.json(name)
            if summary is None:
                raise FileNotFoundError(f"{results / name / SUMMARY}: the run has not finished")
            text = (kept.get(name, "metrics.jsonl") or b"").decode()
            run = Run(
                name=name,
                method=method,
                seed=seed_of(name),
                summary=summary,
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
    atomic_write_text(results / name, text + "\n")  # a link at that name is replaced, not followed
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


def mean_ci(values: Sequence[float], scale: float = 100.0, digits: int = 1) -> str:
    """``"m ± h"``: the mean and the half-width of its 95% t interval, times ``scale``, with
    ``digits`` decimals (``"m (n=1, no CI)"`` for one value, ``"-"`` for none)."""
    s = summarize(values)
    if s.n == 0:
        return "-" + _nan_note(s.n_nan)
    if s.n == 1:
        return f"{s.mean * scale:.{digits}f} (n=1, no CI)" + _nan_note(s.n_nan)
    return f"{s.mean * scale:.{digits}f} ± {s.half_width * scale:.{digits}f}" + _nan_note(s.n_nan)


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
    return paired_text(result, scale)


def paired_text(result: Paired, scale: float = 100.0) -> str:
    """``"+d [lo, hi] p=P (n=k)"`` of a :func:`paired` result, its difference times ``scale``
    (``"-"`` without a pair)."""
    d = result.diff
    if d.n == 0:
        return "-"
    cell = f"{d.mean * scale:+.1f}"
    if d.ci_low is not None:
        cell += f" [{d.ci_low * scale:+.1f}, {d.ci_high * scale:+.1f}]"
    if result.p_value is not None:
        cell += f" p={result.p_value:.2g}"
    return f"{cell} (n={d.n})"


def ratio_cell(ratios: Iterable[float | None], digits: int = 2) -> str:
    """Per-seed ratios (speed-ups, time or cost ratios) as ``"gx [lo, hi] (n=k)"``: their
    geometric mean and its 95% interval on the log scale (:func:`ratio_summary`), ``"gx (n=1, no
    CI)"`` for one, ``"-"`` for none; ratios that are not finite and positive are left out and
    counted (``" (1 left out)"``). An interval that holds 1 says neither faster nor slower."""
    r = ratio_summary(ratios)
    note = f" ({r.n_left_out} left out)" if r.n_left_out else ""
    if r.n == 0:
        return "-" + note
    if r.ci_low is None:
        return f"{r.gmean:.{digits}f}x (n=1, no CI)" + note
    return f"{r.gmean:.{digits}f}x [{r.ci_low:.{digits}f}, {r.ci_high:.{digits}f}] (n={r.n})" + note


def seeds_of(runs: dict[str, list[Run]]) -> list[int]:
    """Every seed that some run of ``runs`` (by method, :func:`load_runs`) has, in order."""
    return sorted({int(r.seed.removeprefix("seed")) for rs in runs.values() for r in rs})


def final_accuracy(run: Run) -> float | None:
    """The run's summary ``final_accuracy`` (``None`` if it has none)."""
    return run.summary.get("final_accuracy")


def seed_note(seeds: Iterable[int]) -> str:
    """The sentence a table's header carries about its seeds: ``"tuning seeds: not for
    claims (...)"`` for any of :data:`TUNING_SEEDS`, ``"report seeds (...)"`` for
    :data:`REPORT_SEEDS` only (:mod:`fedgo_app.sweep.seeds`)."""
    return classify(tuple(seeds)).note


def column(runs: Iterable[Run], value: Callable[[Run], float | None], scale: float = 100.0) -> str:
    """:func:`mean_sd` of ``value(run)`` over the runs that have one (``None``: left out)."""
    values = [v for v in (value(run) for run in runs) if v is not None]
    return mean_sd(values, scale)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m benchmarks.sweep pack RESULTS...``: move each folder's run folders (and an
    older ``runs.tar.gz``) into its ``runs.tar.xz``."""
    parser = argparse.ArgumentParser(description=main.__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["pack"])
    parser.add_argument("results", nargs="+", type=Path)
    args = parser.parse_args(argv)
    for results in args.results:
        moved = pack(results)
        print(f"{results}: {len(moved)} run folders packed into {archive_path(results).name}")


if __name__ == "__main__":
    main()
