"""``python -m benchmarks list | run NAME | table NAME``: the specs (:mod:`benchmarks.spec`).

- ``list``: every spec's name and what it measures;
- ``run NAME [--seeds N ...] [--jobs N] [--stop-after S] [--config F] [--tag T] [options]
  [k=v ...]``: its runs not kept yet, then its table (exit 1 if a run failed or was not
  started: run it again to go on; the kept runs are skipped);
- ``table NAME [--tag T] [options]``: its table from the kept runs only (runs nothing; exit 1
  when the results folder is not there, or its kept runs cannot make the table);
- ``run NAME --help``: the spec's own options.

A spec is the ``SPEC`` of the module its name names (``benchmarks/<name>.py``). ``--child
CONFIG k=v ...`` is one run in this process (:func:`benchmarks.sweep.child`): how a spec's
run starts in a process of its own.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from benchmarks.spec import Spec
from benchmarks.sweep import child

SPECS = (
    "fedgo_table3",
    "coboosting_table1",
    "coboosting_budget",
    "cpfl_cohorts",
    "compare_strategies",
    "switches",
)
"""The registered specs, each the ``SPEC`` of ``benchmarks/<name>.py``."""

USAGE = "usage: python -m benchmarks list | run NAME [options] [k=v ...] | table NAME [options]"


class UnknownSpec(LookupError):
    """A name that is not a registered spec."""


def spec(name: str) -> Spec:
    """The spec ``name`` (:class:`UnknownSpec` naming the known ones)."""
    if name not in SPECS:
        raise UnknownSpec(f"unknown benchmark {name!r}; known: {', '.join(SPECS)}")
    return importlib.import_module(f"benchmarks.{name}").SPEC


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0 when done, 1 when a run failed or was left out, 2 for a bad command line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        child(argv[1:])
        return 0
    if argv[:1] == ["list"] and len(argv) == 1:
        for name in SPECS:
            print(f"{name}: {spec(name).summary}")
        return 0
    if len(argv) < 2 or argv[0] not in ("run", "table"):
        print(USAGE, file=sys.stderr)
        return 2
    command, name, rest = argv[0], argv[1], argv[2:]
    try:
        bench = spec(name).bench(rest)
    except UnknownSpec as exc:
        print(f"python -m benchmarks: {exc}", file=sys.stderr)
        return 2
    if command == "table":
        if bench.spec.run is None and not bench.results.is_dir():
            print(
                f"python -m benchmarks: {name}: no results folder {bench.results}", file=sys.stderr
            )
            return 1
        return table(bench)
    if bench.spec.run is not None:  # a spec that drives others (and writes their tables)
        return bench.spec.run(bench)
    try:
        methods = bench.methods()
    except ValueError as exc:
        print(f"python -m benchmarks: {name}: {exc}", file=sys.stderr)
        return 2
    failed = bench.sweep(methods)
    if table(bench) or failed:
        if failed:
            print("failed runs (run again to retry them):\n" + "\n".join(failed), file=sys.stderr)
        return 1
    return 0


def table(bench) -> int:
    """Write the spec's table(s): 0, or 1 with one line when the kept runs cannot make them (a
    requested run not kept, an archive refused)."""
    try:
        bench.table()
    except (OSError, ValueError) as exc:  # FileNotFoundError, UnsafePathError, a bad JSON
        print(f"python -m benchmarks: {bench.spec.name}: no table: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
