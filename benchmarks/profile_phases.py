"""Where a run's compute goes, and how far each phase is from what this machine can do.

Issue 18, "measure first". The script

1. runs an experiment in one process (:func:`fedgo_flwr.app.inprocess.run_inprocess`: the same
   ServerApp and ClientApp code as ``./run.sh``, the clients one after another, no Ray) with
   :mod:`fedgo_flwr.runtime.profiling` on, which counts the seconds and images of every compute
   phase (local training, teacher logits, ensemble evaluation, distillation, server evaluation,
   WGAN-GP, discriminator training, discriminator logits) and the batch size and torch thread
   count each ran with;
2. times a bare PyTorch loop of each phase's work in the same process: the same model built
   from the same config, the same batch size, float32, the same thread count and memory
   format (``resources.channels_last``), random inputs
   already in memory, no data pipeline and no framework (``inference_mode`` for the forward-only
   phases); that is the phase's *limit* on this machine;
3. writes ``phases.json`` and ``table.md`` to ``benchmarks/results/profile-phases/<tag>/``:
   images per second in the run and bare, their ratio, and the run's wall time against the
   sum of its phases (the rest is data loading, aggregation, weighting, checkpoints, messages).

The in-process run gives each phase the thread count it has in a simulation (the server's
``resources.server_cpus``, each client's ``resources.client_cpus``), but runs the clients one
after another; how the clients share the cores in a simulation is measured separately.

    .venv/bin/python benchmarks/profile_phases.py [--config conf/bench/cifar10-cpu-bn.yaml]
        [--method fedgo] [--rounds 2] [--tag NAME] [k=v ...]

Run it alone on the machine: a concurrent job changes every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from fedgo_table3 import METHODS, add_data_arguments, ensure_data
from torch import nn

from fedgo_flwr.app.inprocess import run_inprocess
from fedgo_flwr.experiment.config import ExperimentConfig
from fedgo_flwr.experiment.task import load_bundle
from fedgo_flwr.models.classifiers import build_model
from fedgo_flwr.runtime import kernels, profiling
from fedgo_flwr.runtime.fileio import strict_json
from strategies import load_experiment

ROOT = Path(__file__).resolve().parent.parent


def place(model: nn.Module) -> nn.Module:
    return kernels.place(model, "cpu")


TRAINING = {"local_training", "distillation", "wgan_gp", "discriminator_training"}
BARE_SECONDS = 4.0
"""How long each bare loop is timed (after two warm-up batches)."""


# -- the bare loops ------------------------------------------------------------------------
def timed(step: Callable[[], None], batch: int, seconds: float = BARE_SECONDS) -> float:
    """Images per second of ``step`` (one batch of ``batch``): two warm-up calls, then calls
    until ``seconds`` have passed (at least three)."""
    step()
    step()
    calls, start = 0, time.perf_counter()
    while calls < 3 or time.perf_counter() - start < seconds:
        step()
        calls += 1
    return calls * batch / (time.perf_counter() - start)


def bare_train(model: nn.Module, shape, classes: int, batch: int, opt: torch.optim.Optimizer):
    """Forward, cross-entropy, backward and an optimiser step on one random batch."""
    x, y = torch.randn(batch, *shape), torch.randint(0, classes, (batch,))
    model.train()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def bare_distill(model: nn.Module, shape, classes: int, batch: int):
    """The distillation step: KL to fixed soft targets, Adam."""
    x = torch.randn(batch, *shape)
    targets = torch.softmax(torch.randn(batch, classes), dim=1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()

    def step() -> None:
        loss = F.kl_div(F.log_softmax(model(x), dim=1), targets, reduction="batchmean")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def bare_infer(model: nn.Module, shape, batch: int):
    """A forward pass in eval mode under ``inference_mode``."""
    x = torch.randn(batch, *shape)
    model.eval()

    def step() -> None:
        with torch.inference_mode():
            model(x)

    return step


def bare_wgan(generator: nn.Module, critic: nn.Module, shape, batch: int, n_critic: int):
    """One critic step of WGAN-GP (a real batch, a generated one, the gradient penalty's
    double back-prop, Adam), with the generator step every ``n_critic`` of them."""
    real = torch.randn(batch, *shape)
    latent = generator.latent_dim
    opt_g = torch.optim.Adam(generator.parameters(), lr=2e-4, betas=(0.0, 0.9))
    opt_d = torch.optim.Adam(critic.parameters(), lr=2e-4, betas=(0.0, 0.9))
    generator.train()
    critic.train()
    count = [0]

    def step() -> None:
        with torch.no_grad():
            fake = generator(torch.randn(batch, latent))
        opt_d.zero_grad(set_to_none=True)
        alpha = torch.rand(batch, *([1] * len(shape)))
        x_hat = (real + alpha * (fake - real)).requires_grad_(True)
        (grad,) = torch.autograd.grad(critic(x_hat).sum(), x_hat, create_graph=True)
        gp = ((grad.flatten(1).norm(2, dim=1) - 1) ** 2).mean()
        (critic(fake).mean() - critic(real).mean() + 10 * gp).backward()
        opt_d.step()
        count[0] += 1
        if count[0] % n_critic == 0:
            for p in critic.parameters():
                p.requires_grad_(False)
            opt_g.zero_grad(set_to_none=True)
            (-critic(generator(torch.randn(batch, latent))).mean()).backward()
            opt_g.step()
            for p in critic.parameters():
                p.requires_grad_(True)

    return step


def bare_disc_train(disc: nn.Module, generator: nn.Module | None, shape, batch: int):
    """One discriminator step: a real batch and as many negatives (samples of the frozen
    generator, or images), separate forward passes, the GAN loss, Adam."""
    real = torch.randn(batch, *shape)
    images = torch.randn(batch, *shape)
    opt = torch.optim.Adam(disc.parameters(), lr=2e-4, betas=(0.5, 0.999))
    disc.train()
    if generator is not None:
        generator.eval()

    def step() -> None:
        if generator is None:
            fake = images
        else:
            with torch.no_grad():
                fake = generator(torch.randn(batch, generator.latent_dim))
        opt.zero_grad(set_to_none=True)
        z_real, z_fake = disc(real), disc(fake)
        loss = F.binary_cross_entropy_with_logits(
            z_real, torch.ones_like(z_real)
        ) + F.binary_cross_entropy_with_logits(z_fake, torch.zeros_like(z_fake))
        loss.backward()
        opt.step()

    return step


def bare_step(name: str, cfg: ExperimentConfig, shape, classes: int, batch: int):
    """The bare loop of phase ``name`` for ``cfg``'s models (in the memory format of the run:
    ``resources.channels_last``)."""
    kernels.use_channels_last(cfg.resources.channels_last)
    torch.manual_seed(0)
    model = place(build_model(cfg.model.name, shape, classes))
    if name == "local_training":
        t = cfg.train
        opt = torch.optim.SGD(
            model.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay
        )
        if t.optimizer == "adam":
            opt = torch.optim.Adam(model.parameters(), lr=t.lr, weight_decay=t.weight_decay)
        return bare_train(model, shape, classes, batch, opt)
    if name == "distillation":
        return bare_distill(model, shape, classes, batch)
    if name in ("teacher_logits", "ensemble_eval", "server_eval"):
        return bare_infer(model, shape, batch)
    params = cfg.strategy.params
    gp = params.generator
    if name == "wgan_gp":
        generator, critic = place(gp.build(shape, seed=0)), place(gp.build_critic(shape, seed=0))
        return bare_wgan(generator, critic, shape, batch, gp.n_critic)
    dp = params.discriminator
    disc = place(dp.build(shape, seed=0))
    if name == "discriminator_training":
        gen = place(gp.build(shape, seed=0)) if dp.reference != "server" else None
        return bare_disc_train(disc, gen, shape, batch)
    if name == "discriminator_logits":
        return bare_infer(disc, shape, batch)
    raise ValueError(f"no bare loop for phase {name!r}")


# -- the run -------------------------------------------------------------------------------
def profile_run(cfg: ExperimentConfig) -> tuple[dict[str, profiling.PhaseCount], float, list]:
    """Run ``cfg`` in this process with the counters on; (counts, wall seconds, metrics rows)."""
    profiling.enable()
    start = time.perf_counter()
    try:
        run_inprocess(cfg)
    finally:
        counts = profiling.disable()
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in (Path(cfg.output_dir) / "metrics.jsonl").open()]
    return counts, wall, rows


def measure(cfg: ExperimentConfig, counts: dict[str, profiling.PhaseCount]) -> dict[str, dict]:
    """Each counted phase's figures with its bare limit (same batch and threads) and ratio."""
    bundle = load_bundle(cfg.data)
    shape, classes = tuple(bundle.train.input_shape), bundle.train.num_classes
    before = torch.get_num_threads()
    out = {}
    for name in [p for p in profiling.PHASES if p in counts]:
        count = counts[name]
        torch.set_num_threads(max(count.threads, 1))
        limit = timed(bare_step(name, cfg, shape, classes, count.batch), count.batch)
        out[name] = {
            **count.as_dict(),
            "kind": "forward+backward" if name in TRAINING else "forward",
            "bare_images_per_second": limit,
            "ratio": count.images_per_second / limit if limit else None,
        }
    torch.set_num_threads(before)
    return out


def table(report: dict) -> str:
    lines = [
        f"Profile of `{report['config']}` {' '.join(report['overrides'])} "
        f"({report['method']}, {report['rounds']} rounds, in one process), {report['machine']}.",
        "",
        "| phase | pass | threads | batch | images | seconds | images/s (run) "
        "| images/s (bare) | run / bare |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, p in report["phases"].items():
        lines.append(
            f"| {name} | {p['kind']} | {p['threads']} | {p['batch']} | {p['images']} "
            f"| {p['seconds']:.1f} | {p['images_per_second']:.0f} "
            f"| {p['bare_images_per_second']:.0f} | {p['ratio']:.2f} |"
        )
    compute = sum(p["seconds"] for p in report["phases"].values())
    wall = report["wall_seconds"]
    lines += [
        "",
        f"Wall time {wall:.1f} s; the phases {compute:.1f} s ({compute / wall:.0%}); the rest "
        f"(data, aggregation, weighting, diagnostics, checkpoints, messages) "
        f"{wall - compute:.1f} s.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="conf/bench/cifar10-cpu-bn.yaml")
    parser.add_argument("--method", default="fedgo", choices=list(METHODS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tag", default=None, help="results folder name (default: the config's)")
    parser.add_argument("--out", default=None, help="results root (default: benchmarks/results)")
    add_data_arguments(parser)
    parser.add_argument("overrides", nargs="*", help="dotted.key=value")
    args = parser.parse_args(argv)
    data_overrides = []
    if "cifar10" in Path(args.config).name:
        data_overrides = [f"data.path={ensure_data(ROOT / args.data, args.archive)}"]
    tag = args.tag or f"{Path(args.config).stem}-{args.method}"
    results = Path(args.out or ROOT / "benchmarks" / "results" / "profile-phases") / tag
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_experiment(
            str(ROOT / args.config),
            [
                *data_overrides,
                *METHODS[args.method],
                f"rounds={args.rounds}",
                f"seed={args.seed}",
                "checkpoint=false",
                *args.overrides,
                f"output_dir={tmp}/run",
            ],
        )
        counts, wall, rows = profile_run(cfg)
    report = {
        "config": args.config,
        "method": args.method,
        "rounds": args.rounds,
        "overrides": args.overrides,
        "machine": f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
        f"torch {torch.__version__}",
        "wall_seconds": wall,
        "round_times": [r.get("round_time") for r in rows],
        "test_accuracy": [r.get("test_accuracy") for r in rows],
        "phases": measure(cfg, counts),
    }
    results.mkdir(parents=True, exist_ok=True)
    (results / "phases.json").write_text(strict_json(report, name="phases.json", indent=2) + "\n")
    text = table(report)
    (results / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
