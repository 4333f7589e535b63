"""Run several strategies on one experiment (same partition and client sampling per seed).

Each (strategy, seed) goes through ``./run.sh`` (a real ``flwr run`` simulation); the script then
prints a Markdown table of final/best test accuracy and mean round time from the runs'
``summary.json`` files, and writes it to ``OUT/results.md``.

    .venv/bin/python benchmarks/compare_strategies.py --config conf/default.yaml \
        --strategies fedavg fedprox scaffold --seeds 0 1 2 [--out outputs/bench] [k=v ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="conf/default.yaml")
    parser.add_argument("--strategies", nargs="+", default=["fedavg", "fedprox", "scaffold"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", default="outputs/bench-strategies")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    out = (ROOT / args.out).resolve()
    summaries: dict[str, list[dict]] = {}
    for strategy in args.strategies:
        for seed in args.seeds:
            run_dir = out / f"{strategy}-seed{seed}"
            cmd = [
                str(ROOT / "run.sh"),
                args.config,
                *args.overrides,
                f"strategy.name={strategy}",
                f"seed={seed}",
                f"output_dir={run_dir}",
            ]
            print("$", " ".join(cmd[1:]), file=sys.stderr, flush=True)
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"run failed: {' '.join(cmd)}\n{(proc.stdout + proc.stderr)[-3000:]}")
            summaries.setdefault(strategy, []).append(
                json.loads((run_dir / "summary.json").read_text())
            )

    def fmt(values: list[float], scale: float = 100.0) -> str:
        mean = statistics.mean(values) * scale
        sd = statistics.stdev(values) * scale if len(values) > 1 else 0.0
        return f"{mean:.1f} ± {sd:.1f}"

    lines = [
        f"config `{args.config}` {' '.join(args.overrides)}; seeds {args.seeds}",
        "",
        "| strategy | final acc (%) | best acc (%) | mean round time (s) | per-seed final |",
        "|---|---|---|---|---|",
    ]
    for strategy, runs in summaries.items():
        finals = ", ".join(f"{100 * r['final_accuracy']:.1f}" for r in runs)
        lines.append(
            f"| {strategy} | {fmt([r['final_accuracy'] for r in runs])} "
            f"| {fmt([r['best_accuracy'] for r in runs])} "
            f"| {fmt([r['mean_round_time'] for r in runs], 1.0)} "
            f"| {finals} |"
        )
    text = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
