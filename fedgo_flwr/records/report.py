"""Plots and tables of finished runs.

    python -m fedgo_flwr.records.report RUN_DIR [RUN_DIR ...] [--out DIR] [--target 0.5]
        [--label dir|strategy]
    ./run.sh --report RUN_DIR ...

A run folder is what a run writes (``metrics.jsonl``, ``summary.json``, ``config.yaml``,
``partition.json``, ``env.json``; :mod:`fedgo_flwr.records.recorder`); a folder that holds run
folders stands for all of them, and a folder of such folders for all of theirs. A report's row
is the runs of one experiment (:mod:`fedgo_flwr.records.report_groups`): runs that share a name,
a strategy and the fingerprint of their ``config.yaml`` (the config less the seed and where the
run writes). Runs of one name whose configs differ are never averaged: each config is a row,
labelled with the keys they differ in, and stderr says so. Written to ``--out`` (default
``report/``): ``accuracy.png`` (accuracy and loss by round, by MB sent and by wall time, mean
+- one sd per group), ``metrics.csv`` (every row of every run), ``table.md`` / ``table.csv``
(per group: n, seeds, mean +- sd of the final, best and last-10-round accuracy, rounds to
``--target``, wall time, bytes, the config fingerprint, commits and package versions) and a
``partition-<run>.png`` heatmap per distinct partition.

A run's files are read as untrusted: a file that is not what a run writes stops the report with
one error naming the file (and line), before anything is written. Every output file is written
atomically (:func:`fedgo_flwr.runtime.fileio.atomic_write`), never through a symbolic link.
``docs/architecture.md`` ("Reports of finished runs") has each output and each rule in full.
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

from fedgo_flwr.records.plots import plot_accuracy, plot_partitions
from fedgo_flwr.records.provenance import ENV_FILE, config_fingerprint
from fedgo_flwr.records.report_groups import (
    Arrangement,
    arrange,
    cell,
    group_commits,
    group_versions,
)
from fedgo_flwr.records.runfolders import LATEST, is_run_stamp
from fedgo_flwr.runtime.fileio import atomic_write_text

__all__ = ["Run", "find_runs", "group_runs", "load_run", "main", "summary_rows"]

SEED_SUFFIX = re.compile(r"-seed(\d+)$")
SWEEP_RUN = re.compile(r"seed(\d+)")
"""A sweep's run folder, ``<out>/<variant>/seed<N>`` (:mod:`fedgo_app.sweep`)."""
LAST_K = 10


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
    env: dict[str, Any] | None = None
    """The run's ``env.json`` (:mod:`fedgo_flwr.records.provenance`; ``None``: none)."""
    fingerprint: str | None = None
    """:func:`~fedgo_flwr.records.provenance.config_fingerprint` of ``config`` (``None``:
    no ``config.yaml``)."""

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """Rounds and finite values of metric ``key``."""
        pts = [(r["round"], r.get(key)) for r in self.rows]
        kept = [(x, float(y)) for x, y in pts if _finite(y)]
        return [x for x, _ in kept], [y for _, y in kept]

    def accuracies(self) -> list[float]:
        return self.series("test_accuracy")[1]

    def trained_accuracies(self) -> list[float]:
        """Test accuracy of the rounds after round 0 (the model before any training)."""
        return [y for x, y in zip(*self.series("test_accuracy"), strict=True) if x > 0]

    def wall_time(self) -> tuple[float | None, str]:
        """The run's whole time in seconds and where it comes from: ``summary.json``'s
        ``total_time``, or for a run without one (unfinished) the last row's ``elapsed``."""
        total = self.summary.get("total_time")
        if _finite(total):
            return float(total), "total_time"
        if self.rows and _finite(self.rows[-1].get("elapsed")):
            return float(self.rows[-1]["elapsed"]), "elapsed"
        return None, ""


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
    env = _read_json(path / ENV_FILE)
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
    match = SEED_SUFFIX.search(path.name) or SWEEP_RUN.fullmatch(path.name)
    if seed is None and match:
        seed = int(match.group(1))
    label = strategy if label_by == "strategy" else SEED_SUFFIX.sub("", _run_name(path))
    fingerprint = config_fingerprint(config) if config else None
    return Run(path, label, strategy, seed, rows, summary, partition, config, env, fingerprint)


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
    ``latest`` link) the experiment's, for a sweep's ``<out>/<variant>/seed<N>`` the
    variant's: the runs of one experiment share a name."""
    if path.name == LATEST or is_run_stamp(path.name) or SWEEP_RUN.fullmatch(path.name):
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


def _runs_in(folder: Path) -> list[Path]:
    """The run folders directly inside ``folder``, sorted (a ``latest`` link is not one)."""
    return sorted(
        p
        for p in folder.iterdir()
        if (p / "metrics.jsonl").is_file() and not (p.name == LATEST and p.is_symlink())
    )


def find_runs(paths: Iterable[Path]) -> list[Path]:
    """Each path if it is a run folder, else the run folders directly inside it, else those
    one level further down (a sweep's ``<out>``, ``outputs/``); sorted, an experiment's
    ``latest`` link not counted again."""
    found = []
    for path in paths:
        if (path / "metrics.jsonl").is_file():
            found.append(path)
        elif path.is_dir():
            inner = _runs_in(path)
            if not inner:
                subs = sorted(p for p in path.iterdir() if p.is_dir() and p.name != LATEST)
                inner = [run for sub in subs for run in _runs_in(sub)]
            if not inner:
                raise ValueError(
                    f"{path}: neither a run folder nor a folder of runs (nor of such folders)"
                )
            found.extend(inner)
        else:
            raise ValueError(f"{path}: no such folder")
    return found


def group_runs(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """The runs of each experiment by label (:func:`fedgo_flwr.records.report_groups.arrange`:
    runs of different configs never share a group, a seed counts once), in the order labels
    first appear; each group sorted by seed."""
    return arrange(runs).groups


def rounds_to_target(run: Run, target: float) -> int | None:
    """The first round whose test accuracy is at least ``target`` (``None``: never)."""
    for r in run.rows:
        if r["round"] > 0 and _finite(r.get("test_accuracy")) and r["test_accuracy"] >= target:
            return int(r["round"])
    return None


def _total(run: Run, key: str) -> float | None:
    values = [float(r[key]) for r in run.rows if _finite(r.get(key))]
    return sum(values) if values else None


def _mean_sd(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample sd (``None`` below two values: one seed has no spread to show)."""
    if not values:
        return math.nan, None
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def _span(values: Sequence[int]) -> str:
    low, high = min(values, default=0), max(values, default=0)
    return str(low) if low == high else f"{low}-{high}"


def summary_rows(groups: dict[str, list[Run]], target: float | None) -> list[dict[str, Any]]:
    """One row per group: the seeds, mean and sd over its runs of each summary figure, where
    its wall times come from, and its provenance (config fingerprint, commits, versions)."""
    out = []
    for label, runs in groups.items():
        accs = [a for a in (r.trained_accuracies() for r in runs) if a]
        seeds = [str(r.seed) for r in runs if r.seed is not None]
        row: dict[str, Any] = {
            "label": label,
            "strategy": runs[0].strategy,
            "n": len(runs),
            "seeds": " ".join(seeds) + " ?" * (len(runs) - len(seeds)),
        }
        walls = [w for w in (r.wall_time() for r in runs) if w[0] is not None]
        figures = {
            "final": [a[-1] for a in accs],
            "best": [max(a) for a in accs],
            "last10": [statistics.fmean(a[-LAST_K:]) for a in accs],
            "wall_s": [w for w, _ in walls],
        }
        for key in ("bytes_down", "bytes_up"):
            totals = [_total(r, key) for r in runs]
            figures[key] = [t for t in totals if t is not None]
        for key, values in figures.items():
            row[f"{key}_mean"], row[f"{key}_sd"] = _mean_sd(values)
        row["last_k"] = _span([min(LAST_K, len(a)) for a in accs])
        unfinished = sum(source == "elapsed" for _, source in walls)
        row["wall_s_from"] = (
            "total_time"
            if not unfinished
            else f"last round's elapsed ({unfinished} unfinished of {len(walls)})"
        )
        if target is not None:
            reached = [t for t in (rounds_to_target(r, target) for r in runs) if t is not None]
            row["target"] = target
            row["rounds_to_target_mean"] = statistics.fmean(reached) if reached else math.nan
            row["reached"] = len(reached)
        prints = list(dict.fromkeys(r.fingerprint or "unknown (no config.yaml)" for r in runs))
        row["config_fingerprint"] = (
            prints[0]
            if len(prints) == 1
            else ", ".join(prints) + " (alike but for own-seed paths and keys added since)"
        )
        row["commits"] = group_commits(runs)
        row["versions"] = group_versions(runs)
        out.append(row)
    return out


def _fmt(mean: float, sd: float | None, scale: float = 1.0, digits: int = 1) -> str:
    """``mean ± sd``; the mean alone when there is no sd (one value)."""
    if math.isnan(mean):
        return "-"
    if sd is None:
        return f"{mean * scale:.{digits}f}"
    return f"{mean * scale:.{digits}f} ± {sd * scale:.{digits}f}"


TABLE_NOTE = (
    "Test accuracy in %: mean ± sample sd over a row's seeds (n); a row of one seed shows its "
    "value and no interval. A row is the runs of one configuration (its fingerprint under "
    "Provenance): runs whose configs differ are never averaged. final, best and last-10 (the "
    "mean of the last 10 evaluated rounds; last k where a run has fewer) count the rounds after "
    "round 0, the model before training. wall s: each run's whole time, summary.json's "
    "total_time{star}.\n"
)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The summary rows as a Markdown table (accuracies in %, bytes in MB)."""
    target = any("target" in r for r in rows)
    head = ["label", "n", "seeds", "final acc", "best acc", "last-10 acc", "wall s"]
    head += ["MB down", "MB up"]
    if target:
        head.append(f"rounds to {rows[0]['target']:.0%}")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        last = _fmt(r["last10_mean"], r["last10_sd"], 100)
        if r["last_k"] not in ("0", str(LAST_K)):
            last += f" (last {r['last_k']})"
        wall = _fmt(r["wall_s_mean"], r["wall_s_sd"], 1, 0)
        if r["wall_s_from"] != "total_time" and wall != "-":
            wall += " *"
        cells = [
            cell(r["label"]),
            str(r["n"]),
            cell(", ".join(r["seeds"].split())) or "-",
            _fmt(r["final_mean"], r["final_sd"], 100),
            _fmt(r["best_mean"], r["best_sd"], 100),
            last,
            wall,
            _fmt(r["bytes_down_mean"], r["bytes_down_sd"], 1e-6),
            _fmt(r["bytes_up_mean"], r["bytes_up_sd"], 1e-6),
        ]
        if target:
            m = r["rounds_to_target_mean"]
            cells.append("-" if math.isnan(m) else f"{m:.1f} ({r['reached']}/{r['n']})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def markdown_report(rows: list[dict[str, Any]], arranged: Arrangement) -> str:
    """``table.md``: what the figures are, the table, the names split into several rows, the
    runs left out, and each row's provenance."""
    unfinished = any(r["wall_s_from"] != "total_time" for r in rows)
    star = "; * a run without it (unfinished): its last round's elapsed" if unfinished else ""
    parts = [TABLE_NOTE.format(star=star), markdown_table(rows)]
    if arranged.splits:
        lines = ["## Not averaged together", ""]
        for name, labels, keys in arranged.splits:
            differ = ", ".join(f"`{k}`" for k in keys) or "strategy or config.yaml"
            shown = ", ".join(f"'{cell(lb)}'" for lb in labels)
            lines.append(
                f"- '{cell(name)}': {len(labels)} configurations ({shown}); they "
                f"differ in {cell(differ)}"
            )
        parts.append("\n".join(lines) + "\n")
    if arranged.left_out:
        lines = ["## Left out", ""]
        lines += [f"- {cell(run.path)}: {cell(why)}" for run, why in arranged.left_out]
        parts.append("\n".join(lines) + "\n")
    lines = [
        "## Provenance",
        "",
        "From each run's config.yaml and env.json (unknown: a run without one).",
        "",
        "| label | config fingerprint | commit | versions |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {cell(r['label'])} | {r['config_fingerprint']} | {cell(r['commits'])} "
        f"| {cell(r['versions'])} |"
        for r in rows
    ]
    parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


def write_metrics_csv(runs: Sequence[Run], path: Path, left_out: Sequence[tuple] = ()) -> None:
    """Every row of every run, with its run, label and seed; ``left_out`` runs (a seed run
    twice) too, with why in ``left_out``."""
    why_of = {id(run): why for run, why in left_out}
    every = [*runs, *(run for run, _ in left_out)]
    keys: list[str] = []
    for run in every:
        for row in run.rows:
            keys.extend(k for k in row if k not in keys)
    fh = io.StringIO(newline="")
    writer = csv.writer(fh)
    writer.writerow(["run", "label", "seed", "left_out", *keys])
    for run in every:
        for row in run.rows:
            values = [row.get(k) for k in keys]
            writer.writerow(
                [
                    run.path.name,
                    run.label,
                    run.seed,
                    why_of.get(id(run), ""),
                    *["" if v is None else v for v in values],
                ]
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
    arranged = arrange(runs)
    groups = arranged.groups
    for note in arranged.notes:
        print(f"fedgo-flwr report: {note}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    plot_accuracy(groups, out / "accuracy.png")
    kept = [r for g in groups.values() for r in g]
    write_metrics_csv(kept, out / "metrics.csv", arranged.left_out)
    rows = summary_rows(groups, target)
    atomic_write_text(out / "table.md", markdown_report(rows, arranged))
    write_table_csv(rows, out / "table.csv")
    written += [out / n for n in ("accuracy.png", "metrics.csv", "table.md", "table.csv")]
    written += plot_partitions(groups, out, _partition_name)
    return written


def _partition_name(path: Path, written: Sequence[Path]) -> str:
    """The run folder's name, with its experiment's or variant's in front when the folder is
    named by a time or a seed (``default-2026-12-01_10-00-00``, ``fedavg-seed0``), and ``-2``,
    ``-3`` ... when a partition file of that name is already written."""
    name = path.name
    if is_run_stamp(name) or SWEEP_RUN.fullmatch(name):
        name = f"{path.absolute().parent.name}-{name}"
    taken = {p.name for p in written}
    unique, n = name, 1
    while f"partition-{unique}.png" in taken:
        n += 1
        unique = f"{name}-{n}"
    return unique


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fedgo_flwr.records.report", description=__doc__.split("\n")[0]
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
        help="name groups by folder (without -seedN; a sweep's variant) or by strategy; "
        "runs of different configs are never averaged either way",
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
