"""How a run's generator changes round by round: its spread and what the server model sees in
it, after every round, drawn in eval and in train mode.

A run with a generator trained inside federated rounds (DaFKD, the FedGAN of FedGO's G3) keeps
only its last two checkpoints. This driver runs the experiment one round at a time (round ``r``
is the run extended from ``r - 1``, always with ``resume=true``, so an interrupted round goes
on from its checkpoint; a resumed run computes what a straight
one does, ``tests/integration/test_faults_resume.py``), keeps each round's checkpoint in
``<out>/round-<r>/`` and runs :mod:`benchmarks.generated_diversity` on it in both modes
(``eval``: BatchNorm's running statistics, how this project draws a distillation set; ``train``:
each batch's own, how the DaFKD authors' code draws it). Rounds already kept are not run again.
``<out>/diversity.json`` holds every result, ``<out>/table.md`` one row per round and mode with
the round's GAN losses and test accuracy from the run's metrics.

    .venv/bin/python -m benchmarks.generator_rounds conf/bench/cifar10-cpu-bn.yaml \\
        --out outputs/bench/generator-rounds/dafkd --rounds 6 seed=0 strategy.name=dafkd ...
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import generated_diversity
from benchmarks.sweep import (
    ROOT,
    child,
    child_command,
    load_config,
    parse_with_overrides,
    run_command,
    write_table,
)
from fedgo_app.sweep.table import METRICS, read_rows

MODES = ("eval", "train")
RESERVED = ("rounds", "output_dir", "resume", "checkpoint")
"""Keys the driver sets itself."""


def keep_round(run: Path, out: Path, r: int) -> Path:
    """Copy the run's config and its checkpoint after round ``r`` to ``out/round-<r>``."""
    dest = out / f"round-{r}"
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(run / "config.yaml", dest / "config.yaml")
    shutil.copy2(run / generated_diversity.CHECKPOINTS["last"], dest / "checkpoint.pt.part")
    (dest / "checkpoint.pt.part").replace(dest / generated_diversity.CHECKPOINTS["last"])
    return dest


def round_metrics(run: Path) -> dict[int, dict[str, Any]]:
    """The run's per-round rows by round."""
    return {int(row["round"]): row for row in read_rows(run / METRICS)}


def table(results: list[dict[str, Any]], metrics: dict[int, dict[str, Any]]) -> str:
    """One row per round and mode: the generated set's spread (pixels, and the server model's
    features against the real images'), its classes, the round's GAN losses and the server
    model's test accuracy; the real images' pixel spread last."""

    def num(value: Any, digits: int) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    lines = [
        "| round | mode | pixel std | pairwise L2 | features' L2: generated / real "
        "| classes (effective) | mean top prob | GAN d loss | GAN g loss | test acc |",
        "|---:|---|---:|---:|---|---|---:|---:|---:|---:|",
    ]
    for res in results:
        g, row = res["generated"], metrics.get(res["model_round"], {})
        lines.append(
            f"| {res['model_round']} | {res['mode']} | {g['pixel_std']:.3f} "
            f"| {g['pairwise_distance']:.1f} "
            f"| {g['feature_distance']:.2f} / {res['real']['feature_distance']:.2f} "
            f"| {g['classes_predicted']} ({g['effective_classes']:.1f}) "
            f"| {g['mean_top_probability']:.3f} | {num(row.get('gan_d_loss'), 3)} "
            f"| {num(row.get('gan_g_loss'), 3)} | {num(row.get('test_accuracy'), 4)} |"
        )
    if results:
        real = results[0]["real"]
        lines.append(
            f"\nReal training images ({results[0]['samples']}): pixel std "
            f"{real['pixel_std']:.3f}, pairwise L2 {real['pairwise_distance']:.1f}."
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        child(argv[1:])
        return []
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="the experiment's YAML, relative to the repository")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--samples", type=int, default=1280)
    args = parse_with_overrides(parser, argv)
    overrides = args.overrides
    for key in RESERVED:
        if any(o.startswith(f"{key}=") for o in overrides):
            parser.error(f"{key} is set by the driver")
    out = args.out.resolve()
    run = out / "run"
    load_config(args.config, [*overrides, f"rounds={args.rounds}", f"output_dir={run}"])
    results: list[dict[str, Any]] = []
    for r in range(1, args.rounds + 1):
        kept = out / f"round-{r}" / generated_diversity.CHECKPOINTS["last"]
        if not kept.is_file():
            keys = [f"rounds={r}", f"output_dir={run}", "checkpoint=true", "resume=true"]
            cmd = child_command("benchmarks.generator_rounds", args.config, [*overrides, *keys])
            run_command(cmd, run / "run.log", root=ROOT, label=f"round {r}")
            keep_round(run, out, r)
        for mode in MODES:
            results.append(
                generated_diversity.main(
                    [str(out / f"round-{r}"), "--samples", str(args.samples), "--mode", mode]
                )
            )
    (out / "diversity.json").write_text(json.dumps(results, indent=1) + "\n")
    write_table(out, table(results, round_metrics(run)))
    return results


if __name__ == "__main__":
    main()
