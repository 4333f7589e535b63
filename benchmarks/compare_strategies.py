"""Run several strategies on one experiment (same partition and client sampling per seed).

Each (strategy, seed) goes through ``./run.sh`` (a real ``flwr run`` simulation) into
``OUT/<strategy>-seed<N>/``; a run whose ``summary.json`` is already there is not run again
(:mod:`benchmarks.sweep`), so an interrupted comparison resumes. The script then prints a
Markdown table of final/best test accuracy and mean round time from the runs' ``summary.json``
files, and writes it to ``OUT/results.md``.

    .venv/bin/python -m benchmarks.compare_strategies --config conf/default.yaml \
        --strategies fedavg fedprox scaffold --seeds 0 1 2 [--out outputs/bench] [k=v ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.sweep import (
    column,
    load_runs,
    run_command,
    run_name,
    seed_note,
    sweep,
    write_table,
)

ROOT = Path(__file__).resolve().parent.parent


def run_one(strategy: str, seed: int, args: argparse.Namespace, out: Path) -> Path:
    """One run through ``./run.sh``; returns its output folder."""
    run_dir = out / run_name(strategy, seed)
    cmd = [
        str(ROOT / "run.sh"),
        args.config,
        *args.overrides,
        f"strategy.name={strategy}",
        f"seed={seed}",
        f"output_dir={run_dir}",
    ]
    run_command(cmd, run_dir / "run.log")
    return run_dir


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="conf/default.yaml")
    parser.add_argument("--strategies", nargs="+", default=["fedavg", "fedprox", "scaffold"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", default="outputs/bench-strategies")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    out = (ROOT / args.out).resolve()
    sweep(args.strategies, args.seeds, lambda s, seed: run_one(s, seed, args, out), out)
    runs = load_runs(out, args.strategies, args.seeds)

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
    write_table(out, "\n".join(lines), "results.md")


if __name__ == "__main__":
    main()
