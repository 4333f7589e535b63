"""Is a run's server model held back by its BatchNorm statistics? Re-estimate them and see.

Loads a finished run's ``model.pt`` (the final server model) and its ``config.yaml``, and
reports its test accuracy as saved and with the running statistics of every BatchNorm layer
re-estimated on ``--images`` real training images (the server's share when the run has one,
else the clients'; a forward pass in train mode, no gradient, nothing else changes). A large
gap means the statistics, not the weights, are what fails: what the first DaFKD run of issue
16 showed (10.1% as saved, 31.8% re-estimated), which led to ``strategy.distill.bn_stats``.
The re-estimate uses real images, so it is a diagnosis, not a method for data-free runs.

    .venv/bin/python -m benchmarks.bn_recalibration outputs/bench/cifar10-cpu-bn/dafkd-seed0
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedgo_flwr.config.experiment import load_config
from fedgo_flwr.learning.task import load_bundle, make_partition, new_model
from fedgo_flwr.learning.training import evaluate
from fedgo_flwr.runtime.fileio import safe_torch_load


@torch.no_grad()
def recalibrated(model: nn.Module, images: torch.Tensor, batch_size: int = 100) -> nn.Module:
    """``model`` with every BatchNorm layer's running statistics replaced by their estimate on
    ``images`` (the mean over batches of each batch's statistics); returned in eval mode."""
    layers = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not layers:
        raise ValueError("the model has no BatchNorm layer")
    for layer in layers:
        layer.reset_running_stats()
        layer.momentum = None  # a cumulative average over the batches
    model.train()
    for start in range(0, len(images), batch_size):
        model(images[start : start + batch_size])
    return model.eval()


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run's output folder (config.yaml, model.pt)")
    parser.add_argument("--images", type=int, default=2000, help="real images for the estimate")
    args = parser.parse_args(argv)
    cfg = load_config(args.run / "config.yaml")
    bundle = load_bundle(cfg.data)
    partition = make_partition(cfg)
    model = new_model(cfg, bundle)
    state = safe_torch_load(args.run / "model.pt", "model file")
    model.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in state.items()})
    device = torch.device("cpu")
    pool = partition.server if len(partition.server) else np.concatenate(partition.clients)
    rng = np.random.default_rng(cfg.seed)
    idx = np.sort(rng.permutation(pool)[: args.images])
    images, _ = bundle.train.to_tensors(idx)
    batch = cfg.eval.batch_size
    as_saved = evaluate(model, bundle.test, batch, device)[1]
    after = evaluate(recalibrated(model, images), bundle.test, batch, device)[1]
    result = {"as_saved": as_saved, "recalibrated": after, "images": len(idx)}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
