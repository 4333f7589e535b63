"""Which way of running a model is fastest on this machine (issue 18, closing the gaps).

For a model of the project (``--model``, built for CIFAR-shaped inputs) it times, with random
inputs already in memory:

- forward passes (eval mode) at several batch sizes, under ``no_grad`` and ``inference_mode``,
  in the default (NCHW) and the channels-last memory format;
- ``K`` same-architecture models on one batch: one after another, against stacked into one
  ``torch.func.functional_call`` + ``vmap`` (``--teachers``);
- a training step (forward, backward, SGD) at the given batch sizes, both memory formats;

each with 1 and with all threads. It prints images per second as a table (``--out``: also
writes it there).

    .venv/bin/python -m benchmarks.kernel_variants [--model resnet8] [--teachers 8]
        [--batches 64 128 256 512 1000] [--out FILE]

Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import copy
import os
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from benchmarks.profile_phases import timed
from fedgo_flwr.gan.discriminators import build_discriminator
from fedgo_flwr.models.classifiers import build_model

SHAPE = (3, 32, 32)
SECONDS = 2.0


def rate(step: Callable[[], None], images: int) -> float:
    """Images per second of ``step`` (``images`` per call), timed for :data:`SECONDS`."""
    return timed(step, images, SECONDS)


def build(name: str) -> nn.Module:
    if name.startswith("disc:"):
        return build_discriminator(name[5:], SHAPE, seed=0)
    torch.manual_seed(0)
    return build_model(name, SHAPE, 10)


def forward(model: nn.Module, batch: int, mode: str, channels_last: bool) -> float:
    model = copy.deepcopy(model).eval()
    x = torch.randn(batch, *SHAPE)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    guard = torch.inference_mode if mode == "inference_mode" else torch.no_grad

    def step() -> None:
        with guard():
            model(x)

    return rate(step, batch)


def stacked(model: nn.Module, k: int, batch: int) -> tuple[float, float]:
    """(one after another, vmap over the stacked parameters) images/s for ``k`` models."""
    models = [copy.deepcopy(model).eval() for _ in range(k)]
    x = torch.randn(batch, *SHAPE)

    def one_by_one() -> None:
        with torch.inference_mode():
            for m in models:
                m(x)

    params, buffers = stack_module_state(models)
    base = copy.deepcopy(model).to("meta")

    def call(p, b, x):
        return functional_call(base, (p, b), (x,))

    batched = vmap(call, in_dims=(0, 0, None))

    def together() -> None:
        with torch.inference_mode():
            batched(params, buffers, x)

    return rate(one_by_one, k * batch), rate(together, k * batch)


def train_step(model: nn.Module, batch: int, channels_last: bool) -> float:
    model = copy.deepcopy(model).train()
    x, y = torch.randn(batch, *SHAPE), torch.randint(0, 10, (batch,))
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    classifier = not isinstance(model(x[:2]), torch.Tensor) or model(x[:2]).ndim == 2

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = (
            F.cross_entropy(out, y)
            if classifier
            else F.binary_cross_entropy_with_logits(out, torch.ones_like(out))
        )
        loss.backward()
        opt.step()

    return rate(step, batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet8", help="a model name, or disc:<name>")
    parser.add_argument("--teachers", type=int, default=8)
    parser.add_argument("--batches", nargs="+", type=int, default=[64, 128, 256, 512, 1000])
    parser.add_argument("--train-batches", nargs="+", type=int, default=[32, 64])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, os.cpu_count() or 1])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    model = build(args.model)
    lines = [
        f"`{args.model}`, torch {torch.__version__}, {os.cpu_count()} CPUs; images/s.",
        "",
        "| what | batch | threads | NCHW | channels-last |",
        "|---|---:|---:|---:|---:|",
    ]
    for threads in args.threads:
        torch.set_num_threads(threads)
        for mode in ("no_grad", "inference_mode"):
            for b in args.batches:
                a, c = (forward(model, b, mode, cl) for cl in (False, True))
                lines.append(f"| forward, {mode} | {b} | {threads} | {a:.0f} | {c:.0f} |")
        for b in args.train_batches:
            a, c = (train_step(model, b, cl) for cl in (False, True))
            lines.append(f"| train step (SGD) | {b} | {threads} | {a:.0f} | {c:.0f} |")
    lines += ["", "| K models on one batch | batch | threads | one by one | vmap |"]
    lines.append("|---|---:|---:|---:|---:|")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for b in (128, 512):
            try:
                seq, vm = stacked(model, args.teachers, b)
                lines.append(f"| {args.teachers} models | {b} | {threads} | {seq:.0f} | {vm:.0f} |")
            except Exception as exc:  # noqa: BLE001 - vmap may not support a model's ops
                lines.append(f"| {args.teachers} models | {b} | {threads} | - | {exc!r:.60} |")
    emit(lines, args.out)


def emit(lines: list[str], out: str | None) -> None:
    """Print a table's lines; also write them to ``out`` if given (the scripts' ``--out``)."""
    text = "\n".join(lines)
    print(text)
    if out:
        Path(out).write_text(text + "\n")


if __name__ == "__main__":
    main()
