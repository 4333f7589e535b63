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

    .venv/bin/python -m benchmarks run switches [--variants ...] [--method feddf] \
        [--seeds 0] [--config conf/bench/cifar10-cpu-bn.yaml] [--tag switches-cifar10] [k=v ...]
    .venv/bin/python -m benchmarks table switches [--tag switches-cifar10] [--seeds 0]

The benchmark is the spec :data:`SPEC` (:mod:`benchmarks.spec`; runs through ``./run.sh``, the
variants are its methods, the table is of the first of ``--seeds``). Finished runs are kept in
``benchmarks/results/<tag>/`` (resumable); ``table`` rebuilds ``table.md``. Run it alone on the
machine: its figures are wall times.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from benchmarks.fedgo_table3 import METHODS
from benchmarks.spec import Spec
from benchmarks.sweep import Kept, load_runs

VARIANTS: dict[str, list[str]] = {
    "baseline": [],
    "waiting1": ["resources.server_cpus_waiting=1"],
    "cl": ["resources.channels_last=true"],
    "cl_waiting1": ["resources.channels_last=true", "resources.server_cpus_waiting=1"],
}


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


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--method", default="feddf", choices=list(METHODS))


SPEC = Spec(
    name="switches",
    summary="The speed switches on one method of a benchmark config, end to end (wall times)",
    config="conf/bench/cifar10-cpu-bn.yaml",
    tag="switches-cifar10",
    methods=lambda args: list(args.variants),
    overrides=lambda variant: VARIANTS[variant],
    table=lambda bench: table(bench.results, bench.args.seeds[0]),
    seeds=(0,),
    runner="run.sh",
    options=options,
    common=lambda args: METHODS[args.method],
)


if __name__ == "__main__":  # the command before the specs: say what replaced it
    raise SystemExit(f"{__spec__.name} is a spec: python -m benchmarks run|table switches")
