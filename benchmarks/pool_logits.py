"""What does caching the client models' logits on the synthetic pool save? (issue 51)

DENSE's server (Co-Boosting's Table 1 baseline; :mod:`fedgo_flwr.datafree`) distils the
ensemble of the ``n`` frozen client models on its whole synthetic pool every epoch; the pool
grows by one synthesis batch an epoch, so this pass is most of a run's time. With
``strategy.boost.cache_logits`` (the default) the client models' logits on a pool image are
computed when it joins the pool (both orientations) and read back by every pass
(:class:`fedgo_flwr.datafree.pool.PoolLogits`); without it every pass runs the ``n`` models
again. This times one distillation pass over a pool of ``N`` images each way, and the cache's
cost, on the config's model (CIFAR-10's input) with its ``n`` clients' models of random
weights (the cost does not depend on the weights), one thread.

    .venv/bin/python -m benchmarks.pool_logits [--config F] [--pool 512 2048] [--threads 1]
        [--out FILE]

Timing: run it alone on the machine.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import torch

from benchmarks.kernel_variants import emit
from fedgo_flwr.datafree import DataFreeDistillation, PlainBoost, SynthesisSettings
from fedgo_flwr.models.classifiers import build_model
from strategies import load_experiment

CONFIG = "conf/bench/coboosting-cifar10-paper.yaml"
SHAPE, CLASSES = (3, 32, 32), 10


def engine(model: str, clients: int, cache: bool) -> DataFreeDistillation:
    """DENSE's server loop (no re-weighting, no diversification) over ``clients`` models."""
    torch.manual_seed(0)
    models = [build_model(model, SHAPE, CLASSES) for _ in range(clients)]
    rng = torch.Generator().manual_seed(0)
    return DataFreeDistillation(
        models,
        build_model(model, SHAPE, CLASSES),
        SynthesisSettings(),
        PlainBoost(cache_logits=cache),
        num_classes=CLASSES,
        image_shape=SHAPE,
        flip=True,
        rng=rng,
        device=torch.device("cpu"),
        epochs=1,
    )


def measure(model: str, clients: int, pool: int) -> dict:
    """Seconds of one distillation pass over ``pool`` images, cached and recomputed, and of
    caching them."""
    images = torch.rand(pool, *SHAPE, generator=torch.Generator().manual_seed(1))
    labels = torch.randint(0, CLASSES, (pool,), generator=torch.Generator().manual_seed(2))
    row = {"pool": pool, "clients": clients}
    for cache in (True, False):
        run = engine(model, clients, cache)
        run.pool.add(images, labels)
        start = time.perf_counter()
        run._cache_pool(0)
        if cache:
            row["cache_fill_s"] = time.perf_counter() - start
        run.distill_pass()  # warm-up
        start = time.perf_counter()
        run.distill_pass()
        row["cached_s" if cache else "recomputed_s"] = time.perf_counter() - start
    row["speedup"] = row["recomputed_s"] / row["cached_s"]
    return row


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--pool", nargs="+", type=int, default=[512, 2048])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = load_experiment(args.config, [])
    rows = [measure(cfg.model.name, cfg.data.num_clients, n) for n in args.pool]
    lines = [
        "| pool images | client models | pass, recomputed (s) | pass, cached (s) | speed-up "
        "| caching the pool (s) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['pool']} | {r['clients']} | {r['recomputed_s']:.2f} | {r['cached_s']:.2f} | "
        f"{r['speedup']:.2f}x | {r['cache_fill_s']:.2f} |"
        for r in rows
    ]
    emit(lines, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
