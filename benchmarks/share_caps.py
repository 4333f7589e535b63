"""Does the cap on a teacher's mean weight share bind on honest runs, and what does it cost?

For each strategy and seed, the adversary profile's clean tiny run (:func:`benchmarks.adversary.
run_once`: 10 clients, 5 a round, no attacker) twice: with the default caps
(:func:`fedgo_flwr.weighting.mean_share_caps`) and with every cap 1 (off). The first records, for
each per-sample ensemble the strategy caps (:func:`fedgo_flwr.weighting.cap_mean_shares`, on the
distillation set or the test split), the largest mean share of one teacher and that teacher's
cap; the second gives the accuracy without the cap. Strategies whose ensembles take scalar
shares (Co-Boosting's learned weights) or no share cap are not instrumented here: their rows say
"no per-sample ensemble capped"::

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python -m benchmarks.share_caps \\
        --strategies dafkd,feddf,fedgo --seeds 0,1,2 --markdown /tmp/share-caps.md

Accuracy-only runs (deterministic per seed); exit code 0 whatever is found.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

import strategies.coboosting_fedgo as coboosting_fedgo
import strategies.feddf as feddf
from benchmarks import adversary as adv
from fedgo_flwr.runtime.fileio import atomic_write_text

# The strategy modules that cap per-sample ensembles, each holding its own imported names.
_MODULES = (feddf, coboosting_fedgo)


@dataclass
class Capped:
    """One strategy's clean run on one seed, with the caps on and off."""

    strategy: str
    seed: int
    calls: list[tuple[float, float]] = field(default_factory=list)  # (largest share, its cap)
    accuracy_on: float | None = None
    accuracy_off: float | None = None

    @property
    def bound(self) -> int:
        """Ensembles where a share was above its cap (so the cap scaled it down)."""
        return sum(share > cap * (1 + 1e-9) for share, cap in self.calls)


@contextlib.contextmanager
def recorded(calls: list[tuple[float, float]], off: bool) -> Iterator[None]:
    """Every capped ensemble's largest mean share and its cap appended to ``calls``; with
    ``off`` every cap is 1 (nothing is scaled)."""
    saved = [(m, m.cap_mean_shares, m.mean_share_caps) for m in _MODULES]

    def caps(sizes, *args, **kwargs):
        real = saved[0][2](sizes, *args, **kwargs)
        return torch.ones_like(real) if off else real

    def cap(weights, cap_values):
        shares = weights.detach().reshape(weights.shape[0], -1).to(torch.float64).mean(1)
        k = int(shares.argmax())
        calls.append((float(shares[k]), float(cap_values[k])))
        return saved[0][1](weights, cap_values)

    try:
        for module, _, _ in saved:
            module.cap_mean_shares = cap
            module.mean_share_caps = caps
        yield
    finally:
        for module, original_cap, original_caps in saved:
            module.cap_mean_shares = original_cap
            module.mean_share_caps = original_caps


def measure(strategy: str, seed: int) -> Capped:
    row = Capped(strategy, seed)
    for off in (False, True):
        calls: list[tuple[float, float]] = []
        with recorded(calls, off):
            run = adv.run_once(strategy, seed=seed)
        if run.error is not None:
            raise RuntimeError(f"{strategy} seed {seed}: the run failed: {run.error}")
        if off:
            row.accuracy_off = run.accuracy
        else:
            row.calls, row.accuracy_on = calls, run.accuracy
    return row


def markdown(rows: list[Capped]) -> str:
    out = [
        "| strategy | seed | capped ensembles | cap met | largest share (its cap) | "
        "acc., cap on | acc., cap off | on - off |",
        "|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        if not r.calls:
            out.append(
                f"| {r.strategy} | {r.seed} | 0 | - | no per-sample ensemble capped | "
                f"{r.accuracy_on:.3f} | {r.accuracy_off:.3f} | - |"
            )
            continue
        share, cap = max(r.calls)
        out.append(
            f"| {r.strategy} | {r.seed} | {len(r.calls)} | {r.bound} | {share:.3f} ({cap:.3f}) | "
            f"{r.accuracy_on:.3f} | {r.accuracy_off:.3f} | "
            f"{r.accuracy_on - r.accuracy_off:+.3f} |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strategies", default="dafkd,feddf,fedgo")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--markdown", type=Path, help="write the table here")
    args = ap.parse_args(argv)
    rows = []
    for name in args.strategies.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            row = measure(name, seed)
            rows.append(row)
            print(f"[{name} seed {seed}] {row}", flush=True)
    table = markdown(rows)
    print(table)
    if args.markdown is not None:
        atomic_write_text(args.markdown, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
