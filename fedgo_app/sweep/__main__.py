"""``python -m fedgo_app.sweep`` (``./run.sh --sweep``): see :mod:`fedgo_app.sweep`."""

from __future__ import annotations

import argparse
import sys
import tarfile
import time
from pathlib import Path

from fedgo_app.sweep.archive import pack, restore
from fedgo_app.sweep.runner import InvalidVariant, default_jobs, execute, plan
from fedgo_app.sweep.seeds import REPORT_SEEDS, TUNING_SEEDS, parse_seeds
from fedgo_app.sweep.table import build_table, markdown, write_table
from fedgo_app.sweep.variants import SweepArgumentError, parse_words

USAGE = """\
python -m fedgo_app.sweep VARIANT [VARIANT ...] --seeds tuning|report|N,N,... \
[--baseline NAME] [--out DIR] [--archive PATH.tar.xz] [--jobs N] [--stop-after S] [--metric KEY] \
[--table-only] [k=v ...]

VARIANT is one word: PATH.yaml, NAME=PATH.yaml, or "NAME=PATH.yaml k=v ..." (quoted);
a k=v word outside a variant applies to every variant (a variant's own win)."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m fedgo_app.sweep",
        allow_abbrev=False,  # --seed must not pass for --seeds
        usage=USAGE,
        description="Run variants x seeds and write table.md, table.json and curves.png.",
    )
    p.add_argument("words", nargs="+", help="variants and common dotted.key=value overrides")
    p.add_argument(
        "--seeds",
        required=True,
        help=f"tuning {TUNING_SEEDS} (choose on these), report {REPORT_SEEDS} (claim on "
        "these), or a comma-separated list",
    )
    p.add_argument("--baseline", help="the variant the others are compared with (default: first)")
    p.add_argument("--out", default="outputs/sweep", help="folder of the runs and the table")
    p.add_argument(
        "--archive",
        help="a .tar.xz of the finished runs' records: restored into --out first, rewritten "
        "after every finished run (a sweep that goes on on another machine)",
    )
    p.add_argument("--jobs", type=int, help="runs at a time (default: CPUs / a run's threads)")
    p.add_argument(
        "--stop-after",
        type=float,
        metavar="S",
        help="start no run after S seconds; the runs under way finish and are kept (a lease "
        "that ends at a fixed time); run the sweep again to go on",
    )
    p.add_argument("--metric", default="test_accuracy", help="a metrics.jsonl key")
    p.add_argument(
        "--table-only", action="store_true", help="run nothing; the table of the runs there"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Exit 0 when every requested run is in the table, 1 when one is not (failed, stale, or
    not run with ``--table-only``) or the archive could not be written, 2 for a bad command
    line or configuration (before anything runs)."""
    start = time.monotonic()
    args, rest = parser().parse_known_args(argv)
    words = [*args.words, *rest]
    unknown = [w for w in words if w.startswith("--")]
    try:
        if unknown:
            raise SweepArgumentError(f"unknown option {unknown[0]}")
        seed_set = parse_seeds(args.seeds)
        variants, common = parse_words(words)
        names = [v.name for v in variants]
        baseline = args.baseline or names[0]
        if baseline not in names:
            raise SweepArgumentError(f"--baseline {baseline}: not a variant ({', '.join(names)})")
        if args.jobs is not None and args.jobs < 1:
            raise SweepArgumentError("--jobs must be >= 1")
        if args.stop_after is not None and not args.stop_after >= 0:
            raise SweepArgumentError("--stop-after must be >= 0 (seconds)")
        out = Path(args.out)
        archive = Path(args.archive) if args.archive else None
        restored = restore(archive, out) if archive else []
        jobs, settled = plan(variants, common, seed_set.seeds, out, not args.table_only)
    except (SweepArgumentError, InvalidVariant, ValueError, OSError, tarfile.TarError) as exc:
        print(f"fedgo-flwr sweep: {exc}", file=sys.stderr)
        return 2

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def keep(_job=None) -> bool:
        """Write the archive; a failure is said and the runs go on (the next write retries)."""
        try:
            say(f"sweep: {len(pack(archive, out))} finished runs kept in {archive}")
        except (OSError, ValueError, tarfile.TarError) as exc:  # e.g. replaced since restore
            say(f"sweep: could not write {archive}: {exc}")
            return False
        return True

    say(f"sweep: {seed_set.note}")
    if restored:
        say(f"sweep: {len(restored)} finished runs restored from {archive}")
    skipped = sum(o.status == "skipped" for o in settled)
    for o in settled:
        if o.status == "stale":
            rerun = "delete it" + (f" and its entry in {archive}" if archive else "")
            say(f"sweep: {o.variant} seed {o.seed} left out: {o.detail} ({rerun} to rerun)")
    outcomes = list(settled)
    if args.table_only:
        say(f"sweep: --table-only: {len(jobs)} runs not run, {skipped} finished")
    elif jobs:
        parallel = args.jobs or default_jobs(jobs)
        say(f"sweep: {len(jobs)} runs to go, {parallel} at a time; {skipped} finished already")
        stop_at = None if args.stop_after is None else start + args.stop_after
        on_done = keep if archive else None
        outcomes += execute(jobs, parallel, say=say, on_done=on_done, stop_at=stop_at)
    else:
        say(f"sweep: all {skipped} runs finished already")
    kept = keep() if archive and not args.table_only else True
    excluded = {(o.variant, o.seed): o.detail for o in outcomes if o.status == "stale"}
    excluded |= {
        (o.variant, o.seed): f"failed: {o.detail}" for o in outcomes if o.status == "failed"
    }
    excluded |= {(o.variant, o.seed): o.detail for o in outcomes if o.status == "unstarted"}
    table = build_table(out, variants, seed_set, baseline, args.metric, excluded, common)
    paths = write_table(table, out)
    print(markdown(table))
    say(f"sweep: wrote {paths['md']}, {paths['json']}, {paths['png']}")
    return 1 if table["left_out"] or not kept else 0


if __name__ == "__main__":
    raise SystemExit(main())
