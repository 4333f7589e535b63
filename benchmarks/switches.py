"""The speed switches on a committed benchmark run: what each buys, end to end (issue 18).

Runs one method of a benchmark config (default: FedDF of ``conf/bench/cifar10-cpu-bn.yaml``,
seed 0) through ``./run.sh`` once per variant of the run settings that trade bits for speed or
change only where the threads go:

- ``baseline``: the config as it is;
- ``waiting1``: ``resources.server_cpus_waiting=1`` (the server's teacher pass on one thread
  while clients still train; same kernels, so the accuracies should be identical);
- ``cl``: ``resources.channels_last=true``;
- ``cl_waiting1``: both.

The committed ``switches-cifar10-r3`` results also hold ``cl_compile`` and
``cl_compile_waiting1``: the same with ``resources.compile=true``, a switch that ran the loops
through ``torch.compile``. It bought nothing measurable on this CPU and was removed after
these runs; the commit that measured it is named in ``benchmarks/studies/performance.md``. The
table shows every variant it finds.

Per variant: the whole run's time (``total_time``), round 1 and the median of the later rounds,
the medians of the clients' training (summed), the server's aggregation and its evaluation, the
final accuracy, and whether every round's test accuracy equals the baseline's.

    .venv/bin/python -m benchmarks.switches [k=v ...] [--variants ...] [--method feddf]
        [--seed 0] [--config conf/bench/cifar10-cpu-bn.yaml] [--tag switches-cifar10]

(the ``k=v`` overrides of every run first: ``--variants`` takes the words after it).

Finished runs are kept in ``benchmarks/results/<tag>/`` (resumable); ``--table-only`` rebuilds
``table.md``. Run it alone on the machine: its figures are wall times.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from benchmarks.fedgo_table3 import METHODS
from benchmarks.sweep import (
    Kept,
    add_data_arguments,
    ensure_data,
    load_runs,
    run_command,
    sweep,
    write_table,
)

ROOT = Path(__file__).resolve().parent.parent
VARIANTS: dict[str, list[str]] = {
    "baseline": [],
    "waiting1": ["resources.server_cpus_waiting=1"],
    "cl": ["resources.channels_last=true"],
    "cl_waiting1": ["resources.channels_last=true", "resources.server_cpus_waiting=1"],
}


def run_one(variant: str, seed: int, args: argparse.Namespace) -> Path:
    """One run of ``args.method`` with ``variant``'s settings; returns its output folder."""
    run_dir = ROOT / "outputs" / "bench" / args.tag / f"{variant}-seed{seed}"
    cmd = [
        str(ROOT / "run.sh"),
        args.config,
        f"data.path={args.data}",
        f"seed={seed}",
        "resume=true",
        *args.overrides,
        *METHODS[args.method],
        *VARIANTS[variant],
        f"output_dir={run_dir}",
    ]
    run_command(cmd, run_dir / "run.log", label=variant)
    return run_dir


def _median(rows: list[dict], key: str) -> float:
    values = [r[key] for r in rows if key in r]
    return statistics.median(values) if values else float("nan")


def table(results: Path, seed: int) -> str:
    """The rows for ``seed`` of every variant that finished: :data:`VARIANTS` first, then any
    other the folder holds (variants of switches since removed)."""
    names = {name.rsplit("-seed", 1)[0] for name in Kept(results).names(pattern="*-seed*")}
    order = [*VARIANTS, *sorted(names - set(VARIANTS))]
    found = load_runs(results, [v for v in order if v in names])
    runs = {
        variant: run
        for variant in order
        for run in found.get(variant, [])
        if run.seed == f"seed{seed}"
    }
    base = runs.get("baseline")
    lines = [
        "| variant | total (s) | vs baseline | round 1 (s) | median round (s) | clients' "
        "training, sum (s) | server aggregation (s) | evaluation (s) | final acc | same "
        "accuracies as baseline |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for variant, run in runs.items():
        rounds = [r for r in run.metrics if r["round"] > 0]
        later = rounds[1:] or rounds
        accs = [r.get("test_accuracy") for r in run.metrics]
        same = "-"
        if base is not None:
            same = "yes" if accs == [r.get("test_accuracy") for r in base.metrics] else "no"
        total = run.summary["total_time"]
        speed = f"{base.summary['total_time'] / total:.2f}x" if base is not None else "-"
        lines.append(
            f"| {variant} | {total:.0f} | {speed} | {rounds[0]['round_time']:.1f} "
            f"| {_median(later, 'round_time'):.1f} | {_median(later, 'client_time_sum'):.1f} "
            f"| {_median(later, 'aggregate_time'):.1f} | {_median(later, 'eval_time'):.1f} "
            f"| {100 * run.summary['final_accuracy']:.2f} | {same} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--method", default="feddf", choices=list(METHODS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", default="conf/bench/cifar10-cpu-bn.yaml")
    parser.add_argument("--tag", default="switches-cifar10")
    parser.add_argument("--table-only", action="store_true")
    add_data_arguments(parser)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    results = ROOT / "benchmarks" / "results" / args.tag
    if not args.table_only:
        args.data = ensure_data(ROOT / args.data, args.archive)
        sweep(args.variants, [args.seed], lambda v, s: run_one(v, s, args), results, root=ROOT)
    write_table(results, table(results, args.seed))


if __name__ == "__main__":
    main()
