"""What a paper preset costs: a cut-down run of it, timed per phase and scaled to the full preset.

Issue 15 asks for ``conf/paper/`` presets "for a user with a GPU". This script answers the
first question such a user has, how long one takes, without running it whole: it runs the
preset in one process (:func:`fedgo_flwr.app.inprocess.run_inprocess`: the same ServerApp and
ClientApp code as ``./run.sh``, the clients one after another, no Ray) with every count that
sets its length cut down (``profile_phases.CUT``), counts the seconds of each compute phase with
:mod:`fedgo_flwr.runtime.profiling` (CUDA-synchronised), and scales each phase by how much more of
its work the full preset does:

- ``local_training``: rounds x local epochs (the clients per round are the preset's);
- ``distillation``: rounds x distillation epochs;
- ``teacher_logits``, ``ensemble_eval``, ``server_eval``: rounds;
- ``wgan_gp``: generator steps (G1), or FedGAN rounds x local epochs (G3);
- ``discriminator_training``: discriminator epochs;
- ``discriminator_logits``: once (the distillation set is fixed);
- the rest of the wall time (data, aggregation, weighting, messages): rounds. It includes the
  one-off start (data decode, model set-up), so its scaled figure is an upper bound.

Everything else is the preset's own: model, data split, batch sizes, devices (``auto``: CUDA
when present). The clients run one after another on one device; a Ray simulation with
``resources.client_gpus: 0.25`` runs four at once, so a real run can be shorter.

    .venv/bin/python -m benchmarks.paper_cost [--config conf/paper/fedgo-cifar10-a0.1.yaml]
        [--tag NAME] [--data DIR | --archive TAR.GZ] [k=v ...]

Writes ``cost.json`` and ``table.md`` to ``benchmarks/results/paper-cost/<tag>/``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from benchmarks.profile_phases import cuts, lengths, machine, profile_run
from benchmarks.sweep import add_data_arguments, ensure_data
from fedgo_flwr.experiment.config import ExperimentConfig
from fedgo_flwr.runtime.fileio import strict_json
from strategies import load_experiment

ROOT = Path(__file__).resolve().parent.parent


def work(cfg: ExperimentConfig) -> dict[str, float]:
    """How much of each phase's work ``cfg`` does, in units that scale its seconds."""
    n = lengths(cfg)
    rounds = n["rounds"]
    out = {
        "local_training": rounds * n["train.local_epochs"],
        "teacher_logits": rounds,
        "ensemble_eval": rounds,
        "server_eval": rounds,
        "discriminator_logits": 1,
        "rest": rounds,
    }
    if "strategy.distill.epochs" in n:
        out["distillation"] = rounds * n["strategy.distill.epochs"]
    if "strategy.generator.steps" in n:
        out["wgan_gp"] = n["strategy.generator.steps"]
    elif "strategy.generator.federated_rounds" in n:
        out["wgan_gp"] = (
            n["strategy.generator.federated_rounds"] * n["strategy.generator.local_epochs"]
        )
    if "strategy.discriminator.epochs" in n:
        out["discriminator_training"] = n["strategy.discriminator.epochs"]
    return out


def table(report: dict) -> str:
    lines = [
        f"`{report['config']}` cut to {' '.join(report['cuts'])}, in one process, "
        f"{report['machine']}.",
        "",
        "| phase | images (cut run) | seconds (cut run) | images/s | x (full / cut) "
        "| hours (full preset) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, p in report["phases"].items():
        images = "" if p["images"] is None else f"{p['images']:,}"
        rate = "" if p["images_per_second"] is None else f"{p['images_per_second']:,.0f}"
        lines.append(
            f"| {name} | {images} | {p['seconds']:.1f} | {rate} | {p['factor']:g} "
            f"| {p['full_hours']:.2f} |"
        )
    lines += [
        "",
        f"Cut run: {report['wall_seconds']:.0f} s wall, test accuracy by round "
        f"{report['test_accuracy']}, peak GPU memory "
        f"{'n/a' if report['peak_gpu_gib'] is None else str(report['peak_gpu_gib']) + ' GiB'}.",
        f"Full preset, clients one after another: about **{report['full_hours']:.1f} h** "
        f"({report['full_hours_phases']:.1f} h of the phases; the rest scaled by rounds is an "
        "upper bound).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="conf/paper/fedgo-cifar10-a0.1.yaml")
    parser.add_argument("--tag", default=None, help="results folder (default: the config's name)")
    parser.add_argument("--out", default=None, help="results root (default: benchmarks/results)")
    add_data_arguments(parser)
    parser.add_argument("overrides", nargs="*", help="dotted.key=value, applied to both")
    args = parser.parse_args(argv)
    data = ensure_data(ROOT / args.data, args.archive)  # the CIFAR-10 JPEG tree
    base = ["data.dataset=imagefolder", f"data.path={data}", *args.overrides]
    full = load_experiment(str(ROOT / args.config), base)
    cut_overrides = cuts(full)
    tag = args.tag or Path(args.config).stem
    results = Path(args.out or ROOT / "benchmarks" / "results" / "paper-cost") / tag
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_experiment(
            str(ROOT / args.config),
            [*base, *cut_overrides, "checkpoint=false", f"output_dir={tmp}/run"],
        )
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        counts, wall, rows = profile_run(cfg)
    full_work, cut_work = work(full), work(cfg)
    rest = wall - sum(c.seconds for c in counts.values())
    measured = {n: (c.seconds, c.images, c.images_per_second) for n, c in counts.items()}
    measured["rest"] = (rest, None, None)
    phases = {}
    for name, (seconds, images, rate) in measured.items():
        factor = full_work.get(name, full.rounds) / cut_work.get(name, cfg.rounds)
        phases[name] = {
            "images": images,
            "seconds": seconds,
            "images_per_second": rate,
            "factor": factor,
            "full_hours": seconds * factor / 3600,
        }
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    report = {
        "config": args.config,
        "overrides": args.overrides,
        "cuts": cut_overrides,
        "machine": machine(),
        "wall_seconds": wall,
        "round_times": [r.get("round_time") for r in rows],
        "test_accuracy": [round(r["test_accuracy"], 4) for r in rows if "test_accuracy" in r],
        "peak_gpu_gib": None if peak is None else round(peak, 1),
        "phases": phases,
        "full_hours_phases": sum(p["full_hours"] for k, p in phases.items() if k != "rest"),
        "full_hours": sum(p["full_hours"] for p in phases.values()),
    }
    results.mkdir(parents=True, exist_ok=True)
    (results / "cost.json").write_text(strict_json(report, name="cost.json", indent=2) + "\n")
    text = table(report)
    (results / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
