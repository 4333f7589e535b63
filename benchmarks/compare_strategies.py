"""Run several strategies on one experiment (same partition and client sampling per seed).

Each (strategy, seed) goes through ``./run.sh`` (a real ``flwr run`` simulation) into
``outputs/bench/<tag>/<strategy>-seed<N>/``; its records are kept in the results folder's
``runs.tar.xz`` (default ``outputs/bench-strategies/``, ``--out``), and a kept run is not run
again (:mod:`benchmarks.spec`), so an interrupted comparison resumes. The table of final/best
test accuracy and mean round time of every seed asked for is written to ``results.md`` there.

    .venv/bin/python -m benchmarks run compare_strategies --config conf/default.yaml \\
        --strategies fedavg fedprox scaffold --seeds 0 1 2 [--out outputs/bench-strategies] \\
        [k=v ...]
"""

from __future__ import annotations

import argparse

from benchmarks.spec import Bench, Spec
from benchmarks.sweep import column, load_runs, seed_note


def table(bench: Bench) -> str:
    """Final and best accuracy, mean round time and each seed's final accuracy, by strategy."""
    args = bench.args
    runs = load_runs(bench.results, args.strategies, args.seeds)
    lines = [
        f"config `{args.config}` {' '.join(args.overrides)}; {seed_note(args.seeds)}",
        "",
        "| strategy | final acc (%) | best acc (%) | mean round time (s) | per-seed final |",
        "|---|---|---|---|---|",
    ]
    for strategy, strategy_runs in runs.items():
        finals = ", ".join(f"{100 * r.summary['final_accuracy']:.1f}" for r in strategy_runs)
        lines.append(
            f"| {strategy} | {column(strategy_runs, lambda r: r.summary['final_accuracy'])} "
            f"| {column(strategy_runs, lambda r: r.summary['best_accuracy'])} "
            f"| {column(strategy_runs, lambda r: r.summary['mean_round_time'], 1.0)} "
            f"| {finals} |"
        )
    return "\n".join(lines)


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strategies", nargs="+", default=["fedavg", "fedprox", "scaffold"])


SPEC = Spec(
    name="compare_strategies",
    summary="Several strategies on one experiment through ./run.sh, the same partition per seed",
    config="conf/default.yaml",
    tag="bench-strategies",
    methods=lambda args: list(args.strategies),
    overrides=lambda strategy: [f"strategy.name={strategy}"],
    table=table,
    runner="run.sh",
    table_file="results.md",
    results="outputs",
    options=options,
)


if __name__ == "__main__":  # the command before the specs: say what replaced it
    raise SystemExit(
        f"{__spec__.name} is a spec: python -m benchmarks run|table compare_strategies"
    )
