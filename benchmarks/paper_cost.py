"""What a paper preset costs: a cut-down run of it, timed per phase and scaled to the full preset.

Issue 15 asks for ``conf/paper/`` presets "for a user with a GPU". This script answers the
first question such a user has, how long one takes, without running it whole: it runs the
preset in one process (:func:`fedgo_app.inprocess.run_inprocess`: the same ServerApp and
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
when present). The clients run one after another on one device.

``--side-by-side K`` then runs the same cut run once more as a Flower simulation
(:func:`benchmarks.overhead.run_flower`: Ray, the preset's ClientApp) with K clients at once:
``resources.client_gpus`` 1/K on a GPU (Ray puts K clients on each card), and Ray given
K x ``client_cpus`` CPUs. Each round's client span is its wall time less the server's
aggregation and evaluation (``round_time - aggregate_time - eval_time``, the split of
``benchmarks.overhead``), compared over rounds 2.. (round 1 starts Ray's workers and loads
their data). The span saved per round, scaled by rounds x local epochs (the local-training
factor), comes off the one-after-another figure: that is the preset's length with its
clients side by side. The span also holds the clients' set-up and messages, which do not
grow with local epochs, so the saving is scaled generously: read the figure as a lower
bound of the side-by-side run's length.

    .venv/bin/python -m benchmarks.paper_cost [--config conf/paper/fedgo-cifar10-a0.1.yaml]
        [--tag NAME] [--data DIR | --archive TAR.GZ] [--side-by-side K] [k=v ...]

Writes ``cost.json`` and ``table.md`` to ``benchmarks/results/paper-cost/<tag>/``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from benchmarks.overhead import later_rounds, run_flower
from benchmarks.profile_phases import cuts, lengths, machine, profile_run
from benchmarks.sweep import add_data_arguments, ensure_data
from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.runtime.fileio import atomic_write_text, strict_json
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
    side = report.get("side_by_side")
    if side:
        lines += [
            "",
            f"Clients side by side ({side['clients_at_once']} at once, Flower simulation, "
            f"{side['placement']}): client span per round {side['span_serial_s']:.1f} s one "
            f"after another, {side['span_side_by_side_s']:.1f} s side by side "
            f"(**{side['speedup']:.2f}x**); round time {side['round_serial_s']:.1f} -> "
            f"{side['round_side_by_side_s']:.1f} s; test accuracy by round "
            f"{side['test_accuracy']}.",
            f"Full preset, clients side by side: about **{side['full_hours']:.1f} h** (the span "
            f"saved, {side['saved_hours']:.1f} h, scaled by the local-training factor "
            f"x{side['factor']:g}: a lower bound).",
        ]
    return "\n".join(lines)


def client_span(rows: list[dict]) -> float:
    """Median over rounds 2.. (:func:`benchmarks.overhead.later_rounds`) of a round's wall time
    less the server's aggregation and evaluation: the time its clients took, as the server
    saw it."""
    return statistics.median(
        r["round_time"] - r.get("aggregate_time", 0.0) - r.get("eval_time", 0.0)
        for r in later_rounds(rows)
    )


def later_round_time(rows: list[dict]) -> float:
    """Median wall time of rounds 2.. (:func:`benchmarks.overhead.later_rounds`)."""
    return statistics.median(r["round_time"] for r in later_rounds(rows))


def side_by_side_overrides(k: int, cuda: bool) -> tuple[list[str], str]:
    """The overrides that run ``k`` clients at once in a simulation, and how they are placed."""
    if cuda:
        return [f"resources.client_gpus={1 / k!r}"], f"{k} per GPU"
    return ["resources.client_gpus=0"], f"{k} CPU workers"


def side_by_side(
    serial_rows: list[dict],
    rows: list[dict],
    k: int,
    placement: str,
    full_hours: float,
    factor: float,
    rounds: int,
) -> dict:
    """The side-by-side figures from the serial run's and the simulation's metrics rows:
    the client span saved per round times the cut run's ``rounds`` and the local-training
    ``factor`` comes off ``full_hours``."""
    serial, side = client_span(serial_rows), client_span(rows)
    saved = max(serial - side, 0.0) * rounds * factor / 3600
    return {
        "clients_at_once": k,
        "placement": placement,
        "span_serial_s": serial,
        "span_side_by_side_s": side,
        "speedup": serial / side if side > 0 else float("inf"),
        "round_serial_s": later_round_time(serial_rows),
        "round_side_by_side_s": later_round_time(rows),
        "test_accuracy": [round(r["test_accuracy"], 4) for r in rows if "test_accuracy" in r],
        "factor": factor,
        "saved_hours": saved,
        "full_hours": full_hours - saved,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="conf/paper/fedgo-cifar10-a0.1.yaml")
    parser.add_argument("--tag", default=None, help="results folder (default: the config's name)")
    parser.add_argument("--out", default=None, help="results root (default: benchmarks/results)")
    add_data_arguments(parser)
    parser.add_argument(
        "--side-by-side",
        type=int,
        default=0,
        metavar="K",
        help="also run the cut run as a Flower simulation with K clients at once (K >= 2)",
    )
    parser.add_argument("overrides", nargs="*", help="dotted.key=value, applied to both")
    args = parser.parse_args(argv)
    if args.side_by_side == 1 or args.side_by_side < 0:
        parser.error("--side-by-side takes K >= 2 (clients at once)")
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
        side_rows, placement = None, ""
        if args.side_by_side:
            k = args.side_by_side
            extra, placement = side_by_side_overrides(k, torch.cuda.is_available())
            sim = load_experiment(
                str(ROOT / args.config),
                [*base, *cut_overrides, "checkpoint=false", f"output_dir={tmp}/sim", *extra],
            )
            side_rows = run_flower(sim, init_args={"num_cpus": k * sim.resources.client_cpus})
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
    if side_rows is not None:
        report["side_by_side"] = side_by_side(
            rows,
            side_rows,
            args.side_by_side,
            placement,
            report["full_hours"],
            full_work["local_training"] / cut_work["local_training"],
            cfg.rounds,
        )
    results.mkdir(parents=True, exist_ok=True)
    (results / "cost.json").write_text(strict_json(report, name="cost.json", indent=2) + "\n")
    text = table(report)
    atomic_write_text(results / "table.md", text + "\n")
    print(text)


if __name__ == "__main__":
    main()
