"""Would ``torch.compile`` make the loops faster on this CPU? (issue 18, the next lever)

Times a training step (forward, cross-entropy, backward, SGD) and an inference forward pass of
one model on random inputs already in memory, eager against ``torch.compile`` (inductor's C++
kernels), in the default (NCHW) and the channels-last memory format, and reports images per
second and the first two calls' time (compilation). The project does not compile its loops
yet: this measures what a switch would buy before one is built.

    .venv/bin/python -m benchmarks.compile_probe [--model resnet8] [--threads 1]
        [--seconds 8] [--out FILE]

Run it alone on the machine; it needs a C++ compiler (``torch.compile`` on a CPU).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.kernel_variants import emit
from fedgo_flwr.models.classifiers import build_model

SHAPE = (3, 32, 32)


def rate(
    model: nn.Module, train: bool, batch: int, channels_last: bool, compiled: bool, seconds: float
) -> tuple[float, float]:
    """(images per second, seconds of the first two calls) of one configuration."""
    x, y = torch.randn(batch, *SHAPE), torch.randint(0, 10, (batch,))
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    model.train(train)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    forward = torch.compile(model) if compiled else model

    def step() -> None:
        if train:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(forward(x), y).backward()
            opt.step()
        else:
            with torch.inference_mode():
                forward(x)

    start = time.perf_counter()
    step()
    step()
    warm = time.perf_counter() - start
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        calls += 1
    return calls * batch / (time.perf_counter() - start), warm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet8")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--train-batch", type=int, default=32)
    parser.add_argument("--infer-batch", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lines = [
        f"`{args.model}`, torch {torch.__version__}, {args.threads} thread(s) of "
        f"{os.cpu_count()} CPUs; images/s (first two calls, s).",
        "",
        "| pass | batch | memory format | eager | compiled | compiled / eager |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for train, batch in ((True, args.train_batch), (False, args.infer_batch)):
        for channels_last in (False, True):
            found = []
            for compiled in (False, True):
                torch.manual_seed(0)
                model = build_model(args.model, SHAPE, 10)
                found.append(rate(model, train, batch, channels_last, compiled, args.seconds))
            (eager, eager_warm), (comp, comp_warm) = found
            lines.append(
                f"| {'training step' if train else 'forward (inference)'} | {batch} "
                f"| {'channels-last' if channels_last else 'NCHW'} "
                f"| {eager:.0f} ({eager_warm:.1f}) | {comp:.0f} ({comp_warm:.1f}) "
                f"| {comp / eager:.2f} |"
            )
            print(lines[-1], flush=True)
    emit(lines, args.out)


if __name__ == "__main__":
    main()
