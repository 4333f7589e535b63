"""Where a run's compute goes, and how far each phase is from what the machine can do.

The script

1. runs an experiment in one process (:func:`fedgo_app.inprocess.run_inprocess`: the same
   ServerApp and ClientApp code as ``./run.sh``, the clients one after another, no Ray) with
   :mod:`fedgo_flwr.runtime.profiling` on, which counts the seconds and images of every compute
   phase (local training, teacher logits, ensemble evaluation, distillation, server evaluation,
   WGAN-GP, discriminator training, discriminator logits) and the batch size and torch thread
   count each ran with (CUDA-synchronised on a GPU);
2. times bare PyTorch loops of each phase's work in the same process, on the run's device: the
   same model built from the same config, random inputs already on the device, no data
   pipeline and no framework (``inference_mode`` for the forward-only phases). The first
   setting is the run's own (float32, the run's batch, thread count and memory format,
   ``resources.channels_last``): that is the phase's *limit*. ``--fast`` adds what the card
   can do with other settings: float32 at a large batch, and bfloat16 autocast with
   channels-last at that batch (:data:`FAST_BATCH`). ``--side-by-side K`` times the local
   training loop in K processes at once on the same device (what Ray's fractional GPUs give a
   simulation), ``--compile`` a ``torch.compile`` of it (``mode="reduce-overhead"`` on CUDA:
   CUDA graphs, no per-kernel launch);
3. writes ``phases.json`` and ``table.md`` to ``benchmarks/results/profile-phases/<tag>/``:
   images per second in the run and bare, their ratio, and the run's wall time against the
   sum of its phases (the rest is data loading, aggregation, weighting, checkpoints, messages).

``--cut`` shrinks every count that sets a run's length (:data:`CUT`: rounds, local epochs,
distillation epochs, generator steps, discriminator epochs) so a paper preset's phases are
profiled in minutes; ``benchmarks/paper_cost.py`` scales such a cut run back to the full one.

    .venv/bin/python -m benchmarks.profile_phases [--config conf/bench/cifar10-cpu-bn.yaml]
        [--method fedgo] [--rounds 2] [--cut] [--device auto] [--fast] [--side-by-side K]
        [--compile] [--tag NAME] [k=v ...]

Run it alone on the machine: a concurrent job changes every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.fedgo_table3 import METHODS
from benchmarks.sweep import add_data_arguments, ensure_data
from fedgo_app.inprocess import run_inprocess
from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.learning.task import load_bundle
from fedgo_flwr.learning.training import get_device
from fedgo_flwr.models.classifiers import build_model
from fedgo_flwr.runtime import kernels, profiling
from fedgo_flwr.runtime.fileio import atomic_write_text, strict_json
from strategies import load_experiment

ROOT = Path(__file__).resolve().parent.parent

TRAINING = {"local_training", "distillation", "wgan_gp", "discriminator_training"}
BARE_SECONDS = 4.0
"""How long each bare loop is timed (after two warm-up batches)."""

COMPILE_WARMUP = 5
"""Calls of a compiled step before it is timed (compiling, then recording CUDA graphs)."""

FAST_BATCH = {"forward": 512, "forward+backward": 256}
"""The batch of ``--fast``'s settings, by kind of pass."""

CUT = {
    "rounds": 2,
    "train.local_epochs": 2,
    "strategy.distill.epochs": 1,
    "strategy.generator.steps": 200,
    "strategy.generator.federated_rounds": 1,
    "strategy.generator.local_epochs": 1,
    "strategy.discriminator.epochs": 1,
}
"""The counts that set a run's length, and the value ``--cut`` sets each to."""


def lengths(cfg: ExperimentConfig) -> dict[str, int]:
    """``cfg``'s values of the :data:`CUT` counts it has (the generator's steps only for
    G1, its FedGAN rounds and epochs only for G3)."""
    p = cfg.strategy.params
    out = {"rounds": cfg.rounds, "train.local_epochs": cfg.train.local_epochs}
    if hasattr(p, "distill"):
        out["strategy.distill.epochs"] = p.distill.epochs
    gen = getattr(p, "generator", None)
    if gen is not None and gen.steps > 0:
        out["strategy.generator.steps"] = gen.steps
    if gen is not None and gen.federated_rounds > 0:
        out["strategy.generator.federated_rounds"] = gen.federated_rounds
        out["strategy.generator.local_epochs"] = gen.local_epochs
    if getattr(p, "discriminator", None) is not None:
        out["strategy.discriminator.epochs"] = p.discriminator.epochs
    return out


def cuts(full: ExperimentConfig) -> list[str]:
    """The overrides that shrink ``full`` (each count only where the preset has it)."""
    return [f"{key}={CUT[key]}" for key in lengths(full)]


def machine() -> str:
    """The device and processors the figures were taken on."""
    cpu = f"{os.cpu_count()} CPUs ({platform.processor() or platform.machine()})"
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)}, {cpu}, torch {torch.__version__}"
    return f"no GPU, {cpu}, torch {torch.__version__}"


class Setting(NamedTuple):
    """How a bare loop runs: its ``batch`` (None: the run's), bfloat16 autocast, the
    channels-last format (None: the run's), ``torch.compile``."""

    label: str
    batch: int | None = None
    bf16: bool = False
    channels_last: bool | None = None
    compiled: bool = False


RUN = Setting("run's settings")


def fast_settings(kind: str) -> list[Setting]:
    """``--fast``'s settings for a phase of ``kind`` (forward, or forward+backward)."""
    b = FAST_BATCH[kind]
    return [Setting(f"fp32 b{b}", b), Setting(f"bf16+cl b{b}", b, bf16=True, channels_last=True)]


# -- the bare loops ------------------------------------------------------------------------
def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(
    step: Callable[[], None],
    batch: int,
    seconds: float = BARE_SECONDS,
    device: torch.device | None = None,
) -> float:
    """Images per second of ``step`` (one batch of ``batch``): two warm-up calls, then calls
    until ``seconds`` have passed (at least three), the device's queue drained at both ends."""
    sync = (lambda: synchronize(device)) if device is not None else (lambda: None)
    step()
    step()
    sync()
    calls, start = 0, time.perf_counter()
    while calls < 3 or time.perf_counter() - start < seconds:
        step()
        calls += 1
    sync()
    return calls * batch / (time.perf_counter() - start)


class Bare:
    """Inputs and numerics of the bare loops: random tensors on ``device`` in the setting's
    memory format, and ``amp()``, the context the forward passes run in (bfloat16 autocast,
    or nothing)."""

    def __init__(self, device: torch.device, setting: Setting, run_channels_last: bool) -> None:
        self.device = device
        self.bf16 = setting.bf16
        cl = run_channels_last if setting.channels_last is None else setting.channels_last
        self.format = torch.channels_last if cl else torch.contiguous_format
        self.channels_last = cl

    def images(self, batch: int, shape) -> torch.Tensor:
        x = torch.randn(batch, *shape, device=self.device)
        return x.contiguous(memory_format=self.format) if x.dim() == 4 else x

    def amp(self):
        if self.bf16:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def place(self, model: nn.Module) -> nn.Module:
        kernels.use_channels_last(self.channels_last)
        return kernels.place(model, self.device)


def bare_train(bare: Bare, model: nn.Module, shape, classes: int, batch: int, opt, forward=None):
    """Forward, cross-entropy, backward and an optimiser step on one random batch."""
    x = bare.images(batch, shape)
    y = torch.randint(0, classes, (batch,), device=bare.device)
    forward = model if forward is None else forward
    model.train()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with bare.amp():
            loss = F.cross_entropy(forward(x), y)
        loss.backward()
        opt.step()

    return step


def bare_distill(bare: Bare, model: nn.Module, shape, classes: int, batch: int):
    """The distillation step: KL to fixed soft targets, Adam."""
    x = bare.images(batch, shape)
    targets = torch.softmax(torch.randn(batch, classes, device=bare.device), dim=1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()

    def step() -> None:
        with bare.amp():
            out = model(x)
        loss = F.kl_div(F.log_softmax(out.float(), dim=1), targets, reduction="batchmean")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def bare_infer(bare: Bare, model: nn.Module, shape, batch: int):
    """A forward pass in eval mode under ``inference_mode``."""
    x = bare.images(batch, shape)
    model.eval()

    def step() -> None:
        with torch.inference_mode(), bare.amp():
            model(x)

    return step


def bare_wgan(bare: Bare, generator: nn.Module, critic: nn.Module, shape, batch: int, n_critic):
    """One critic step of WGAN-GP (a real batch, a generated one, the gradient penalty's
    double back-prop, Adam), with the generator step every ``n_critic`` of them."""
    real = bare.images(batch, shape)
    latent = generator.latent_dim
    dev = bare.device
    opt_g = torch.optim.Adam(generator.parameters(), lr=2e-4, betas=(0.0, 0.9))
    opt_d = torch.optim.Adam(critic.parameters(), lr=2e-4, betas=(0.0, 0.9))
    generator.train()
    critic.train()
    count = [0]

    def step() -> None:
        with torch.no_grad(), bare.amp():
            fake = generator(torch.randn(batch, latent, device=dev)).float()
        opt_d.zero_grad(set_to_none=True)
        alpha = torch.rand(batch, *([1] * len(shape)), device=dev)
        x_hat = (real + alpha * (fake - real)).requires_grad_(True)
        with bare.amp():
            score = critic(x_hat).float().sum()
        (grad,) = torch.autograd.grad(score, x_hat, create_graph=True)
        gp = ((grad.flatten(1).norm(2, dim=1) - 1) ** 2).mean()
        with bare.amp():
            loss = critic(fake).float().mean() - critic(real).float().mean()
        (loss + 10 * gp).backward()
        opt_d.step()
        count[0] += 1
        if count[0] % n_critic == 0:
            for p in critic.parameters():
                p.requires_grad_(False)
            opt_g.zero_grad(set_to_none=True)
            with bare.amp():
                g_loss = -critic(generator(torch.randn(batch, latent, device=dev))).float().mean()
            g_loss.backward()
            opt_g.step()
            for p in critic.parameters():
                p.requires_grad_(True)

    return step


def bare_disc_train(bare: Bare, disc: nn.Module, generator: nn.Module | None, shape, batch: int):
    """One discriminator step: a real batch and as many negatives (samples of the frozen
    generator, or images), separate forward passes, the GAN loss, Adam."""
    real = bare.images(batch, shape)
    images = bare.images(batch, shape)
    opt = torch.optim.Adam(disc.parameters(), lr=2e-4, betas=(0.5, 0.999))
    disc.train()
    if generator is not None:
        generator.eval()

    def step() -> None:
        if generator is None:
            fake = images
        else:
            with torch.no_grad(), bare.amp():
                fake = generator(torch.randn(batch, generator.latent_dim, device=bare.device))
        opt.zero_grad(set_to_none=True)
        with bare.amp():
            z_real, z_fake = disc(real).float(), disc(fake).float()
        loss = F.binary_cross_entropy_with_logits(
            z_real, torch.ones_like(z_real)
        ) + F.binary_cross_entropy_with_logits(z_fake, torch.zeros_like(z_fake))
        loss.backward()
        opt.step()

    return step


def local_optimizer(cfg: ExperimentConfig, model: nn.Module) -> torch.optim.Optimizer:
    """The clients' optimiser of ``cfg`` (``train.optimizer``) for ``model``."""
    t = cfg.train
    if t.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=t.lr, weight_decay=t.weight_decay)
    return torch.optim.SGD(
        model.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay
    )


def bare_step(
    name: str,
    cfg: ExperimentConfig,
    shape,
    classes: int,
    batch: int,
    device: torch.device | str = "cpu",
    setting: Setting = RUN,
):
    """The bare loop of phase ``name`` for ``cfg``'s models on ``device``, in ``setting``."""
    bare = Bare(torch.device(device), setting, cfg.resources.channels_last)
    torch.manual_seed(0)
    model = bare.place(build_model(cfg.model.name, shape, classes))
    if name == "local_training":
        forward = None
        if setting.compiled:
            mode = "reduce-overhead" if bare.device.type == "cuda" else "default"
            forward = torch.compile(model, mode=mode)
        return bare_train(bare, model, shape, classes, batch, local_optimizer(cfg, model), forward)
    if name == "distillation":
        return bare_distill(bare, model, shape, classes, batch)
    if name in ("teacher_logits", "ensemble_eval", "server_eval"):
        return bare_infer(bare, model, shape, batch)
    params = cfg.strategy.params
    gp = params.generator
    if name == "wgan_gp":
        generator = bare.place(gp.build(shape, seed=0))
        critic = bare.place(gp.build_critic(shape, seed=0))
        return bare_wgan(bare, generator, critic, shape, batch, gp.n_critic)
    dp = params.discriminator
    disc = bare.place(dp.build(shape, seed=0))
    if name == "discriminator_training":
        gen = bare.place(gp.build(shape, seed=0)) if dp.reference != "server" else None
        return bare_disc_train(bare, disc, gen, shape, batch)
    if name == "discriminator_logits":
        return bare_infer(bare, disc, shape, batch)
    raise ValueError(f"no bare loop for phase {name!r}")


# -- clients side by side ------------------------------------------------------------------
def _side_worker(cfg, shape, classes, batch, device, seconds, barrier, results) -> None:
    """One of ``--side-by-side``'s processes: the local-training loop, warmed up, then timed
    from the moment every process is ready."""
    step = bare_step("local_training", cfg, shape, classes, batch, device)
    step()
    step()
    synchronize(torch.device(device))
    barrier.wait()
    results.put(timed(step, batch, seconds, torch.device(device)))


def side_by_side(cfg, shape, classes: int, batch: int, device, k: int, seconds: float) -> dict:
    """Images per second of the local-training loop in ``k`` processes at once on ``device``
    (each its own model and optimiser, as ``k`` simulated clients on one GPU), in total."""
    ctx = torch.multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(k), ctx.Queue()
    procs = [
        ctx.Process(
            target=_side_worker,
            args=(cfg, shape, classes, batch, str(device), seconds, barrier, results),
        )
        for _ in range(k)
    ]
    for p in procs:
        p.start()
    rates = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    return {"processes": k, "batch": batch, "images_per_second": sum(rates), "each": rates}


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


def measure(
    cfg: ExperimentConfig,
    counts: dict[str, profiling.PhaseCount],
    device: torch.device | str = "cpu",
    fast: bool = False,
    seconds: float = BARE_SECONDS,
) -> dict[str, dict]:
    """Each counted phase's figures with its bare limit on ``device`` (the run's batch and
    threads) and their ratio; with ``fast``, also the bare loops at :func:`fast_settings`."""
    bundle = load_bundle(cfg.data)
    shape, classes = tuple(bundle.train.input_shape), bundle.train.num_classes
    before, before_cl = torch.get_num_threads(), kernels.channels_last()
    out = {}
    for name in [p for p in profiling.PHASES if p in counts]:
        count = counts[name]
        kind = "forward+backward" if name in TRAINING else "forward"
        torch.set_num_threads(max(count.threads, 1))
        settings = [RUN, *(fast_settings(kind) if fast else [])]
        bare = {}
        for s in settings:
            batch = s.batch or count.batch
            step = bare_step(name, cfg, shape, classes, batch, device, s)
            bare[s.label] = {
                "batch": batch,
                "images_per_second": timed(step, batch, seconds, torch.device(device)),
            }
        limit = bare[RUN.label]["images_per_second"]
        out[name] = {
            **count.as_dict(),
            "kind": kind,
            "bare_images_per_second": limit,
            "ratio": count.images_per_second / limit if limit else None,
            "bare": bare,
        }
    torch.set_num_threads(before)
    kernels.use_channels_last(before_cl)
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
    extra = [
        (name, label, b)
        for name, p in report["phases"].items()
        for label, b in p.get("bare", {}).items()
        if label != RUN.label
    ]
    if extra:
        lines += [
            "",
            "Bare loops in other settings, same device:",
            "",
            "| phase | setting | batch | images/s (bare) | x the run's bare limit |",
            "|---|---|---:|---:|---:|",
        ]
        for name, label, b in extra:
            base = report["phases"][name]["bare_images_per_second"]
            lines.append(
                f"| {name} | {label} | {b['batch']} | {b['images_per_second']:.0f} "
                f"| {b['images_per_second'] / base:.2f} |"
            )
    side = report.get("side_by_side")
    if side:
        one = report["phases"]["local_training"]["bare_images_per_second"]
        lines += [
            "",
            f"Local training, {side['processes']} processes at once on the device (batch "
            f"{side['batch']}, float32): {side['images_per_second']:.0f} images/s in total, "
            f"{side['images_per_second'] / one:.2f}x one process.",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="conf/bench/cifar10-cpu-bn.yaml")
    parser.add_argument("--method", default="fedgo", choices=list(METHODS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cut", action="store_true", help="shrink every length count (CUT)")
    parser.add_argument("--device", default="auto", help="the bare loops' device (auto: CUDA)")
    parser.add_argument("--fast", action="store_true", help="also bf16 / large-batch loops")
    parser.add_argument("--side-by-side", type=int, default=0, metavar="K")
    parser.add_argument("--compile", action="store_true", help="also a compiled local step")
    parser.add_argument("--seconds", type=float, default=BARE_SECONDS)
    parser.add_argument("--tag", default=None, help="results folder name (default: the config's)")
    parser.add_argument("--out", default=None, help="results root (default: benchmarks/results)")
    add_data_arguments(parser)
    parser.add_argument("overrides", nargs="*", help="dotted.key=value")
    args = parser.parse_args(argv)
    data_overrides = []
    if "cifar10" in Path(args.config).name:
        data = ensure_data(ROOT / args.data, args.archive)
        data_overrides = ["data.dataset=imagefolder", f"data.path={data}"]
    base = [*data_overrides, *METHODS[args.method], f"seed={args.seed}", *args.overrides]
    cut = cuts(load_experiment(str(ROOT / args.config), base)) if args.cut else []
    if not args.cut:
        cut = [f"rounds={args.rounds}"]
    tag = args.tag or f"{Path(args.config).stem}-{args.method}"
    results = Path(args.out or ROOT / "benchmarks" / "results" / "profile-phases") / tag
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_experiment(
            str(ROOT / args.config),
            [*base, *cut, "checkpoint=false", f"output_dir={tmp}/run"],
        )
        device = get_device(args.device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        counts, wall, rows = profile_run(cfg)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    report = {
        "config": args.config,
        "method": args.method,
        "rounds": cfg.rounds,
        "overrides": [*args.overrides, *(cut if args.cut else [])],
        "machine": machine(),
        "device": str(device),
        "peak_gpu_gib": None if peak is None else round(peak, 2),
        "wall_seconds": wall,
        "round_times": [r.get("round_time") for r in rows],
        "test_accuracy": [r.get("test_accuracy") for r in rows],
        "phases": measure(cfg, counts, device, args.fast, args.seconds),
    }
    save(report, results)
    bundle = load_bundle(cfg.data)
    shape, classes = tuple(bundle.train.input_shape), bundle.train.num_classes
    local = report["phases"].get("local_training")
    if args.side_by_side and local:
        report["side_by_side"] = side_by_side(
            cfg, shape, classes, local["batch"], device, args.side_by_side, args.seconds
        )
        save(report, results)
    if args.compile and local:
        setting = Setting("compiled", compiled=True)
        step = bare_step("local_training", cfg, shape, classes, local["batch"], device, setting)
        for _ in range(COMPILE_WARMUP):  # compilation, then CUDA-graph recording
            step()
        local["bare"]["compiled"] = {
            "batch": local["batch"],
            "images_per_second": timed(step, local["batch"], args.seconds, device),
        }
        save(report, results)
    print(table(report))


def save(report: dict, results: Path) -> None:
    """``phases.json`` and ``table.md`` of what is measured so far (each extra measurement
    rewrites them, so a run stopped in a later one keeps the earlier ones)."""
    results.mkdir(parents=True, exist_ok=True)
    (results / "phases.json").write_text(strict_json(report, name="phases.json", indent=2) + "\n")
    atomic_write_text(results / "table.md", table(report) + "\n")


if __name__ == "__main__":
    main()
