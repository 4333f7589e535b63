"""Plots and tables of finished runs.

    python -m fedgo_flwr.experiment.report RUN_DIR [RUN_DIR ...] [--out DIR] [--target 0.5]
    ./run.sh --report RUN_DIR ...

A run folder is what a run writes (``metrics.jsonl``, ``summary.json``, ``config.yaml``,
``partition.json``; :mod:`fedgo_flwr.experiment.recorder`); a folder that holds run folders (e.g.
``outputs/bench/cifar10-cpu-bn``, or ``outputs/<name>`` with its dated runs) stands for all of
them. Runs are grouped by label: the run folder's name without a trailing ``-seed<N>``, or for
a dated run folder ``outputs/<name>/<date-time>`` (or ``outputs/<name>/latest``) ``<name>``
(``--label strategy``: the strategy's name), so the seeds of one method form one group.
Written to ``--out`` (default ``report/``):

- ``accuracy.png``: four panels titled with the runs' setting, one line per group (n in the
  legend), mean over its runs with a +- one sd band: test accuracy by round (dashed, the client
  ensemble's of distillation methods), test loss by round, test accuracy vs cumulative MB sent
  and vs wall time (:func:`fedgo_flwr.experiment.plots.plot_accuracy`);
- ``metrics.csv``: every row of every run's ``metrics.jsonl`` with its run, label and seed;
- ``table.md`` / ``table.csv``: per group, the mean +- sd over seeds of the final, best and
  last-10-round mean accuracy, rounds to ``--target`` (mean over the seeds that reached it, and
  how many did), wall time and bytes sent down and up (when the run recorded them);
- ``partition-<run>.png``: a heatmap of each distinct partition, clients x classes, from
  ``partition.json`` (one per group's first run), titled with its setting and seed.

A run's files are read as untrusted: a ``metrics.jsonl`` line that is not a JSON object with
an integer ``round``, a ``summary.json`` or ``partition.json`` that is not a JSON object (or
not JSON), a ``config.yaml`` that is not a YAML mapping, stops the report with one error naming
the file (and line), before anything is written. Every output file is written atomically
(:func:`fedgo_flwr.runtime.fileio.atomic_write`): a symbolic link at one of their names in
``--out`` is replaced by the file, never written through.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import re
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedgo_flwr.experiment.plots import plot_accuracy, plot_partitions
from fedgo_flwr.experiment.runfolders import LATEST, is_run_stamp
from fedgo_flwr.runtime.fileio import atomic_write_text

__all__ = ["Run", "find_runs", "group_runs", "load_run", "main", "summary_rows"]

SEED_SUFFIX = re.compile(r"-seed(\d+)$")


@dataclass
class Run:
    """One finished (or interrupted) run, read from its folder."""

    path: Path
    label: str
    strategy: str
    seed: int | None
    rows: list[dict[str, Any]]
    summary: dict[str, Any] = field(default_factory=dict)
    partition: dict[str, Any] | None = None
    config: dict[str, Any] = field(default_factory=dict)
    """The run's ``config.yaml`` (empty if it has none)."""

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """Rounds and finite values of metric ``key``."""
        pts = [(r["round"], r.get(key)) for r in self.rows]
        kept = [(x, float(y)) for x, y in pts if _finite(y)]
        return [x for x, _ in kept], [y for _, y in kept]

    def accuracies(self) -> list[float]:
        return self.series("test_accuracy")[1]


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def load_run(path: Path, label_by: str = "dir") -> Run:
    """The run in folder ``path``; ``ValueError`` naming the file if it has no
    ``metrics.jsonl`` or one of its files is not what a run writes (see the module)."""
    if path.name == LATEST and path.is_symlink():
        path = path.resolve()  # the dated folder it names
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        raise ValueError(f"{path}: no metrics.jsonl (not a run folder)")
    rows = []
    for n, line in enumerate(metrics.read_text().splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{metrics}:{n}: not JSON ({exc.msg})") from exc
            if not isinstance(row, dict):
                raise ValueError(f"{metrics}:{n}: a JSON {_kind(row)}, not an object")
            if not _integer(row.get("round")):
                raise ValueError(f"{metrics}:{n}: no integer 'round'")
            rows.append(row)
    summary = _read_json(path / "summary.json") or {}
    partition = _read_json(path / "partition.json")
    _check_partition(path / "partition.json", partition)
    config = {}
    if (path / "config.yaml").is_file():
        try:
            config = yaml.safe_load((path / "config.yaml").read_text()) or {}
        except yaml.YAMLError as exc:  # one line: the file, the line, the problem
            mark = getattr(exc, "problem_mark", None)
            at = f":{mark.line + 1}" if mark is not None else ""
            why = getattr(exc, "problem", None) or type(exc).__name__
            raise ValueError(f"{path / 'config.yaml'}{at}: not YAML ({why})") from exc
        if not isinstance(config, dict):
            raise ValueError(f"{path / 'config.yaml'}: a YAML {_kind(config)}, not a mapping")
    section = config.get("strategy")
    named = section.get("name") if isinstance(section, dict) else None
    strategy = str(summary.get("strategy") or named or "?")
    seed = config.get("seed")
    if seed is not None and not _integer(seed):
        raise ValueError(f"{path / 'config.yaml'}: seed {seed!r} is not an integer")
    match = SEED_SUFFIX.search(path.name)
    if seed is None and match:
        seed = int(match.group(1))
    label = strategy if label_by == "strategy" else SEED_SUFFIX.sub("", _run_name(path))
    return Run(path, label, strategy, seed, rows, summary, partition, config)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}


def _kind(value: Any) -> str:
    """A JSON or YAML value's kind, for an error: ``array``, ``string``, ``number`` ..."""
    return "null" if value is None else _KINDS.get(type(value), type(value).__name__)


def _check_partition(path: Path, partition: Any) -> None:
    """``partition.json``'s ``class_histogram``, if any, is a table of numbers (clients x
    classes, every row as long); ``ValueError`` naming the file otherwise."""
    hist = (partition or {}).get("class_histogram")
    if not hist:
        return
    rows_ok = isinstance(hist, list) and all(isinstance(r, list) and r for r in hist)
    if (
        not rows_ok
        or len({len(r) for r in hist}) != 1
        or not all(_finite(v) for r in hist for v in r)
    ):
        raise ValueError(
            f"{path}: class_histogram is not a table of numbers (clients x classes, "
            "every row as long)"
        )


def _run_name(path: Path) -> str:
    """The folder's name, or for a dated run folder ``outputs/<name>/<date-time>`` (or its
    ``latest`` link) the experiment's: the runs of one experiment form one group."""
    if path.name == LATEST or is_run_stamp(path.name):
        return path.absolute().parent.name
    return path.name


def _read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path`` (``None``: no such file); ``ValueError`` naming the file if
    it is not JSON or not an object."""
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc.msg})") from exc
    if not isinstance(value, dict):
        raise ValueError(f"{path}: a JSON {_kind(value)}, not an object")
    return value


def find_runs(paths: Iterable[Path]) -> list[Path]:
    """Each path if it is a run folder, else the run folders directly inside it (sorted; an
    experiment's ``latest`` link is not counted again)."""
    found = []
    for path in paths:
        if (path / "metrics.jsonl").is_file():
            found.append(path)
        elif path.is_dir():
            inner = sorted(
                p
                for p in path.iterdir()
                if (p / "metrics.jsonl").is_file() and not (p.name == LATEST and p.is_symlink())
            )
            if not inner:
                raise ValueError(f"{path}: neither a run folder nor a folder of runs")
            found.extend(inner)
        else:
            raise ValueError(f"{path}: no such folder")
    return found


def group_runs(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Runs by label, in the order labels first appear; each group sorted by seed."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.label, []).append(run)
    for members in groups.values():
        members.sort(key=lambda r: (r.seed is None, r.seed or 0))
    return groups


def rounds_to_target(run: Run, target: float) -> int | None:
    """The first round whose test accuracy is at least ``target`` (``None``: never)."""
    for r in run.rows:
        if r["round"] > 0 and _finite(r.get("test_accuracy")) and r["test_accuracy"] >= target:
            return int(r["round"])
    return None


def _total(run: Run, key: str) -> float | None:
    values = [float(r[key]) for r in run.rows if _finite(r.get(key))]
    return sum(values) if values else None


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summary_rows(groups: dict[str, list[Run]], target: float | None) -> list[dict[str, Any]]:
    """One row per group: mean and sd over its runs of each summary figure."""
    out = []
    for label, runs in groups.items():
        accs = [r.accuracies() for r in runs]
        accs = [a for a in accs if a]
        row: dict[str, Any] = {"label": label, "strategy": runs[0].strategy, "runs": len(runs)}
        figures = {
            "final": [a[-1] for a in accs],
            "best": [max(a) for a in accs],
            "last10": [statistics.fmean(a[-10:]) for a in accs],
            "wall_s": [
                float(r.rows[-1]["elapsed"])
                for r in runs
                if r.rows and _finite(r.rows[-1].get("elapsed"))
            ],
        }
        for key in ("bytes_down", "bytes_up"):
            totals = [_total(r, key) for r in runs]
            figures[key] = [t for t in totals if t is not None]
        for key, values in figures.items():
            row[f"{key}_mean"], row[f"{key}_sd"] = _mean_sd(values)
        if target is not None:
            reached = [t for t in (rounds_to_target(r, target) for r in runs) if t is not None]
            row["target"] = target
            row["rounds_to_target_mean"] = statistics.fmean(reached) if reached else math.nan
            row["reached"] = len(reached)
        out.append(row)
    return out


def _fmt(mean: float, sd: float, scale: float = 1.0, digits: int = 1) -> str:
    if math.isnan(mean):
        return "-"
    return f"{mean * scale:.{digits}f} ± {sd * scale:.{digits}f}"


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The summary rows as a Markdown table (accuracies in %, bytes in MB)."""
    target = any("target" in r for r in rows)
    head = ["label", "runs", "final acc", "best acc", "last-10 acc", "wall s", "MB down", "MB up"]
    if target:
        head.append(f"rounds to {rows[0]['target']:.0%}")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            r["label"],
            str(r["runs"]),
            _fmt(r["final_mean"], r["final_sd"], 100),
            _fmt(r["best_mean"], r["best_sd"], 100),
            _fmt(r["last10_mean"], r["last10_sd"], 100),
            _fmt(r["wall_s_mean"], r["wall_s_sd"], 1, 0),
            _fmt(r["bytes_down_mean"], r["bytes_down_sd"], 1e-6),
            _fmt(r["bytes_up_mean"], r["bytes_up_sd"], 1e-6),
        ]
        if target:
            m = r["rounds_to_target_mean"]
            cells.append("-" if math.isnan(m) else f"{m:.1f} ({r['reached']}/{r['runs']})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_metrics_csv(runs: Sequence[Run], path: Path) -> None:
    keys: list[str] = []
    for run in runs:
        for row in run.rows:
            keys.extend(k for k in row if k not in keys)
    fh = io.StringIO(newline="")
    writer = csv.writer(fh)
    writer.writerow(["run", "label", "seed", *keys])
    for run in runs:
        for row in run.rows:
            values = [row.get(k) for k in keys]
            writer.writerow(
                [run.path.name, run.label, run.seed, *["" if v is None else v for v in values]]
            )
    atomic_write_text(path, fh.getvalue())


def write_table_csv(rows: list[dict[str, Any]], path: Path) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    fh = io.StringIO(newline="")
    writer = csv.DictWriter(fh, fieldnames=keys)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, fh.getvalue())


def report(
    paths: Sequence[Path], out: Path, target: float | None = None, label_by: str = "dir"
) -> list[Path]:
    """Write every file of the report for the runs under ``paths``; returns what it wrote."""
    runs = [load_run(p, label_by) for p in find_runs(paths)]
    groups = group_runs(runs)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    plot_accuracy(groups, out / "accuracy.png")
    write_metrics_csv(runs, out / "metrics.csv")
    rows = summary_rows(groups, target)
    atomic_write_text(out / "table.md", markdown_table(rows))
    write_table_csv(rows, out / "table.csv")
    written += [out / n for n in ("accuracy.png", "metrics.csv", "table.md", "table.csv")]
    written += plot_partitions(groups, out)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fedgo_flwr.experiment.report", description=__doc__.split("\n")[0]
    )
    parser.add_argument("runs", nargs="+", type=Path, help="run folders, or folders of runs")
    parser.add_argument("--out", type=Path, default=Path("report"), help="output folder (report/)")
    parser.add_argument(
        "--target", type=float, default=None, help="accuracy in [0, 1] for 'rounds to target'"
    )
    parser.add_argument(
        "--label",
        choices=("dir", "strategy"),
        default="dir",
        help="group runs by folder name (without -seedN) or by strategy",
    )
    args = parser.parse_args(argv)
    if args.target is not None and not 0 < args.target <= 1:
        parser.error(f"--target {args.target}: must be in (0, 1]")
    try:
        written = report(args.runs, args.out, args.target, args.label)
    except ValueError as exc:
        print(f"fedgo-flwr report: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file that cannot be read or written (e.g. a name too long)
        print(f"fedgo-flwr report: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
