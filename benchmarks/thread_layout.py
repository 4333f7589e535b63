"""How to spread the clients' training over this machine's cores (issue 18, thread use).

A simulated round trains its clients in ``W`` Ray workers of ``T`` torch threads each
(``resources.client_cpus`` sets both: ``W = cores / client_cpus``, ``T = client_cpus``). This
times the clients' work alone, without Flower: ``W`` processes started together, each running
training steps (forward, cross-entropy, backward, SGD) of the benchmark's model at its batch size
on random inputs already in memory, with ``T`` threads, for the same wall time. It reports the
machine's total images per second for every layout, and how the processes' own rates compare
(a layout whose workers slow each other down shows it there).

    .venv/bin/python -m benchmarks.thread_layout [--models resnet8 cnn] [--batch 32]
        [--layouts 1x1 1x2 2x1 2x2] [--seconds 20] [--out FILE]

A layout ``WxT`` is ``W`` processes of ``T`` threads. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time

from benchmarks.kernel_variants import emit

SHAPE = (3, 32, 32)


def worker(model_name: str, batch: int, threads: int, seconds: float, start, out) -> None:
    """Train ``model_name`` for ``seconds`` after every process is ready; put images/s."""
    import torch
    from profile_phases import bare_train

    from fedgo_flwr.models.classifiers import build_model

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build_model(model_name, SHAPE, 10)
    step = bare_train(model, SHAPE, 10, batch, torch.optim.SGD(model.parameters(), lr=0.01))
    for _ in range(3):
        step()
    start.wait()
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
        steps += 1
    out.put(steps * batch / (time.perf_counter() - t0))


def layout_rate(model: str, batch: int, workers: int, threads: int, seconds: float) -> list[float]:
    """Images per second of each of ``workers`` processes of ``threads`` threads, run at once."""
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(workers), ctx.Queue()
    procs = [
        ctx.Process(target=worker, args=(model, batch, threads, seconds, start, out))
        for _ in range(workers)
    ]
    for p in procs:
        p.start()
    rates = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return sorted(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["resnet8", "cnn"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--layouts", nargs="+", default=["1x1", "1x2", "2x1", "2x2"])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    layouts = []
    for spec in args.layouts:
        w, _, t = spec.partition("x")
        if not (w.isdigit() and t.isdigit() and int(w) > 0 and int(t) > 0):
            parser.error(f"--layouts: {spec!r} is not WxT with positive integers (e.g. 2x1)")
        layouts.append((int(w), int(t)))
    lines = [
        f"Training steps at batch {args.batch}, {args.seconds:g} s per layout, "
        f"{os.cpu_count()} CPUs; images/s.",
        "",
        "| model | processes x threads | total | per process | vs 1x1 |",
        "|---|---|---:|---|---:|",
    ]
    for model in args.models:
        single = None
        for w, t in layouts:
            rates = layout_rate(model, args.batch, w, t, args.seconds)
            total = sum(rates)
            single = single if single is not None or (w, t) != (1, 1) else total
            ratio = f"{total / single:.2f}" if single else ""
            each = ", ".join(f"{r:.0f}" for r in rates)
            lines.append(f"| {model} | {w}x{t} | {total:.0f} | {each} | {ratio} |")
            print(lines[-1], flush=True)
    emit(lines, args.out)


if __name__ == "__main__":
    main()
