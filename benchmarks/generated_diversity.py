"""How varied is a run's generated distillation set? Its spread, against real images, and the
classes the server model sees in it.

Distillation on generated data (FedGO D2, DaFKD) can only teach what the generator covers. This
script draws ``--samples`` images from a finished run's generator and as many real training
images, and reports for each set the mean per-pixel standard deviation across images and the
mean pairwise L2 distance between images (a collapsed generator has both far below the real
set's), and the server model's predicted classes on them: the histogram, the number of classes
predicted at all, its exponentiated entropy (the effective number of classes) and the mean top
probability.

The generator is the run's ``generator.pt`` (FedGO's pre-FL generator) if there is one, else the
``generator`` of the strategy state in the checkpoint (DaFKD, whose generator is trained with
the models); the server model is that checkpoint's global model (``--checkpoint last``: after
the final round; ``prev``: the round before, whose generator made the final round's set). The
latent codes are the script's own (seeded), not the run's, so the samples come from the same
generator but are not the run's exact set. ``--mode train`` draws them with the generator in train
mode instead (each batch of ``--batch-size`` normalised by its own BatchNorm statistics), the way
the DaFKD authors' code draws its distillation set; ``eval`` (default) is how this project draws it
(:func:`fedgo_flwr.gan.sample`). ``feature_distance`` is the mean pairwise distance of the server
model's features (the input of its output layer, where DaFKD's discriminator heads sit) on each
set, the model in the same mode: how much of the set's spread a discriminator on those features
can see.

    .venv/bin/python -m benchmarks.generated_diversity outputs/bench/cifar10-cpu-bn/dafkd-seed0
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedgo_flwr.config.experiment import load_config
from fedgo_flwr.data.arrays import ArrayDataset
from fedgo_flwr.gan import generated_set, stored_like
from fedgo_flwr.gan.settings import GeneratorConfig
from fedgo_flwr.learning.task import load_bundle, make_partition, new_model
from fedgo_flwr.models.features import FeatureTap
from fedgo_flwr.records.checkpoint import (
    CHECKPOINT_FILE,
    PREVIOUS_FILE,
    read_checkpoint,
)
from fedgo_flwr.runtime.fileio import safe_torch_load
from fedgo_flwr.runtime.rng import make_rng

CHECKPOINTS = {"last": CHECKPOINT_FILE, "prev": PREVIOUS_FILE}


def as_tensors(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A state dict of numpy arrays (or tensors) as tensors."""
    return {k: torch.as_tensor(np.asarray(v)) for k, v in state.items()}


@torch.no_grad()
def spread(images: torch.Tensor) -> dict[str, float]:
    """Mean per-pixel standard deviation across ``images`` and their mean pairwise L2 distance
    (over distinct pairs)."""
    flat = images.flatten(1).double()
    n = len(flat)
    if n < 2:
        raise ValueError("need at least 2 images to measure their spread")
    dist = torch.cdist(flat, flat)
    return {
        "pixel_std": float(flat.std(dim=0).mean()),
        "pairwise_distance": float(dist.sum() / (n * (n - 1))),
    }


@torch.no_grad()
def predicted_classes(
    model: nn.Module, images: torch.Tensor, num_classes: int, batch_size: int = 128
) -> dict[str, Any]:
    """What ``model`` (eval mode) predicts on ``images``: the class histogram, how many classes
    it predicts at all, the exponentiated entropy of the histogram, and the mean top
    probability."""
    model.eval()
    probs = torch.cat(
        [
            model(images[i : i + batch_size]).softmax(dim=1)
            for i in range(0, len(images), batch_size)
        ]
    )
    hist = np.bincount(probs.argmax(dim=1).numpy(), minlength=num_classes)
    share = hist[hist > 0] / hist.sum()
    return {
        "histogram": hist.tolist(),
        "classes_predicted": int((hist > 0).sum()),
        "effective_classes": float(np.exp(-(share * np.log(share)).sum())),
        "mean_top_probability": float(probs.max(dim=1).values.mean()),
    }


@torch.no_grad()
def feature_distance(
    model: nn.Module, images: torch.Tensor, train_mode: bool, batch_size: int = 64
) -> float:
    """Mean pairwise L2 distance between ``model``'s features of ``images`` (the input of its
    output layer, what DaFKD's discriminator heads see), the model in train mode (each batch of
    ``batch_size`` normalised by its own BatchNorm statistics, as in the clients' local
    training) or eval mode. A copy of ``model`` runs, so its running statistics stay as they
    are."""
    net = copy.deepcopy(model).train(train_mode)
    with FeatureTap(net) as tap:
        feats = torch.cat(
            [tap.read(net(images[i : i + batch_size])) for i in range(0, len(images), batch_size)]
        )
    return spread(feats)["pairwise_distance"]


@torch.no_grad()
def train_mode_set(
    generator: nn.Module,
    n: int,
    latent_dim: int,
    rng: torch.Generator,
    batch_size: int,
    like: ArrayDataset,
) -> torch.Tensor:
    """``n`` samples of a copy of ``generator`` in train mode, ``batch_size`` latent codes a batch
    (BatchNorm normalises each batch by its own statistics), stored like ``like``
    (:func:`fedgo_flwr.gan.stored_like`, as for the eval-mode set) and read back as tensors."""
    g = copy.deepcopy(generator).train()
    z = torch.randn(n, latent_dim, generator=rng)
    x = torch.cat([g(z[i : i + batch_size]).float() for i in range(0, n, batch_size)])
    return stored_like(x, like).to_tensors()[0]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run's output folder (config.yaml, checkpoints)")
    parser.add_argument("--samples", type=int, default=1280, help="generated (and real) images")
    parser.add_argument("--checkpoint", choices=list(CHECKPOINTS), default="last")
    parser.add_argument("--mode", choices=["eval", "train"], default="eval")
    parser.add_argument("--batch-size", type=int, default=64, help="train mode's batch")
    args = parser.parse_args(argv)
    cfg = load_config(args.run / "config.yaml")
    bundle = load_bundle(cfg.data)
    ckpt = read_checkpoint(args.run / CHECKPOINTS[args.checkpoint])
    params = cfg.strategy.raw_params
    if "generator" not in params:
        raise SystemExit(f"{args.run}: strategy {cfg.strategy.name} has no generator")
    gen_cfg = GeneratorConfig(**params["generator"])
    shape = bundle.train.input_shape
    generator = gen_cfg.build(shape, seed=cfg.seed)
    saved = args.run / "generator.pt"
    if saved.is_file():
        generator.load_state_dict(as_tensors(safe_torch_load(saved, "generator file")))
        source = saved.name
    elif ckpt.strategy_state.get("generator") is not None:
        generator.load_state_dict(as_tensors(ckpt.strategy_state["generator"]))
        source = f"{CHECKPOINTS[args.checkpoint]} (round {ckpt.round})"
    else:
        raise SystemExit(f"{args.run}: no generator.pt and no generator in the checkpoint")
    rng = make_rng(cfg.seed, "generated-diversity")
    if args.mode == "eval":
        fake_set = generated_set(
            generator, args.samples, gen_cfg.latent_dim, rng, like=bundle.train
        )
        fake, _ = fake_set.to_tensors(np.arange(len(fake_set)))
    else:
        fake = train_mode_set(
            generator, args.samples, gen_cfg.latent_dim, rng, args.batch_size, bundle.train
        )
    partition = make_partition(cfg)
    pool = np.concatenate([partition.server, *partition.clients])
    idx = np.sort(np.random.default_rng(cfg.seed).permutation(pool)[: args.samples])
    real, _ = bundle.train.to_tensors(idx)
    model = new_model(cfg, bundle)
    model.load_state_dict(as_tensors(ckpt.arrays))
    train = args.mode == "train"
    classes = bundle.train.num_classes
    result = {
        "generator": source,
        "mode": args.mode,
        "model_round": ckpt.round,
        "samples": len(fake),
        "generated": {
            **spread(fake),
            **predicted_classes(model, fake, classes),
            "feature_distance": feature_distance(model, fake, train),
        },
        "real": {
            **spread(real),
            **predicted_classes(model, real, classes),
            "feature_distance": feature_distance(model, real, train),
        },
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
