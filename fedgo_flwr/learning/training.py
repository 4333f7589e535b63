"""Training and evaluation loops shared by every algorithm (plain PyTorch, no Flower).

Client algorithms customise local training through three hooks of :func:`train_local`:
``regularizer(model) -> Tensor`` adds a term to the loss that needs only the model (FedProx),
``batch_loss(batch) -> Tensor`` one that needs the minibatch, its logits or the features that
enter the classifier (:class:`Batch`; FedGKD's distillation, FedUV's regularisers), and
``grad_correction(model)`` edits gradients after ``backward`` (SCAFFOLD). Everything random is
drawn from one ``torch.Generator`` (an ``rng``) derived from ``(seed, round, client)`` by
:func:`fedgo_flwr.runtime.rng.derive_seed`, so a run is reproducible on CPU.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from fedgo_flwr.config.experiment import TrainConfig
from fedgo_flwr.data import ArrayDataset, batches, ends_in_batch_of_one
from fedgo_flwr.models.features import FeatureTap
from fedgo_flwr.runtime import profiling
from fedgo_flwr.runtime.kernels import autocast, inference_batch, place


def get_device(preference: str = "auto") -> torch.device:
    """CUDA when present (``auto``), else Apple MPS, else CPU; or exactly what is asked."""
    if preference == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if preference.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device '{preference}' requested but CUDA is not available")
    return torch.device(preference)


def make_optimizer(params, cfg: TrainConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    raise ValueError(f"unknown optimizer '{cfg.optimizer}'")


@dataclass
class Batch:
    """One minibatch of local training, as :func:`train_local`'s ``batch_loss`` sees it."""

    x: torch.Tensor  # the (augmented) inputs
    y: torch.Tensor  # the labels
    logits: torch.Tensor  # model(x), in the autograd graph
    features: torch.Tensor | None = None  # the classifier's input (``features=True``), in the graph
    epoch: int = 0  # the local epoch it belongs to (0-based)


BatchLoss = Callable[[Batch], torch.Tensor]
"""A term added to the local objective for one minibatch (its gradient flows into the model)."""


@dataclass
class TrainStats:
    """What one local training run did."""

    loss: float
    steps: int
    num_examples: int
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)  # an algorithm's own, in the reply


def train_local(
    model: nn.Module,
    data: ArrayDataset,
    cfg: TrainConfig,
    *,
    rng: torch.Generator,
    device: torch.device,
    augment: bool = True,
    regularizer: Callable[[nn.Module], torch.Tensor] | None = None,
    grad_correction: Callable[[nn.Module], None] | None = None,
    batch_loss: BatchLoss | None = None,
    features: bool = False,
    optimizer: torch.optim.Optimizer | None = None,
    after_step: Callable[[Batch], None] | None = None,
) -> TrainStats:
    """``cfg.local_epochs`` epochs of minibatch training with cross-entropy (FedAvg Alg. 1).

    The objective of a minibatch is ``CE + regularizer(model) + batch_loss(batch)`` (the terms
    that are given); with ``features=True`` the batch carries the input of the model's output
    layer (:class:`fedgo_flwr.models.features.FeatureTap`). ``TrainStats.loss`` is the mean CE
    alone. A new optimizer (``cfg``'s) is made for the call unless one over ``model``'s parameters
    is given (central training keeps its Adam moments across rounds). ``after_step(batch)`` runs
    after each optimizer step (DaFKD's discriminator-head and generator steps).
    """
    start = time.perf_counter()
    place(model, device).train()
    if optimizer is None:
        optimizer = make_optimizer(model.parameters(), cfg)
    total, count, steps = 0.0, 0, 0
    drop_last = ends_in_batch_of_one(len(data), cfg.batch_size)
    with (
        FeatureTap(model) if features else contextlib.nullcontext() as tap,
        profiling.phase("local_training") as tally,
    ):
        for epoch in range(cfg.local_epochs):
            for x, y in batches(
                data,
                cfg.batch_size,
                shuffle=True,
                rng=rng,
                augment=augment,
                drop_last=drop_last,
                device=device,
            ):
                optimizer.zero_grad(set_to_none=True)
                with autocast(device):
                    logits = model(x)
                    loss = F.cross_entropy(logits, y)
                    objective = loss + regularizer(model) if regularizer is not None else loss
                    batch = None
                    if batch_loss is not None or after_step is not None:
                        feats = tap.read(logits) if tap is not None else None
                        batch = Batch(x, y, logits, feats, epoch)
                    if batch_loss is not None:
                        objective = objective + batch_loss(batch)
                objective.backward()
                if grad_correction is not None:
                    grad_correction(model)
                optimizer.step()
                if after_step is not None:
                    after_step(batch)
                total += loss.item() * len(y)
                count += len(y)
                steps += 1
                tally.add(len(y))
    return TrainStats(
        loss=total / max(count, 1),
        steps=steps,
        num_examples=len(data),
        seconds=time.perf_counter() - start,
    )


@torch.no_grad()
def predict_logits(
    model: nn.Module, data: ArrayDataset, batch_size: int, device: torch.device
) -> torch.Tensor:
    """Logits of ``model`` on every sample of ``data`` in order, on the CPU (at least
    :func:`~fedgo_flwr.runtime.kernels.inference_batch`'s batch on a GPU)."""
    place(model, device).eval()
    batch_size = inference_batch(batch_size, device)
    with autocast(device):
        outs = [
            model(x).float().cpu()
            for x, _ in batches(data, batch_size, shuffle=False, device=device)
        ]
    return torch.cat(outs) if outs else torch.empty(0)


@torch.no_grad()
def evaluate(
    model: nn.Module, data: ArrayDataset, batch_size: int, device: torch.device
) -> tuple[float, float]:
    """Mean cross-entropy and top-1 accuracy of ``model`` on ``data``."""
    logits = predict_logits(model, data, batch_size, device)
    labels = torch.as_tensor(data.y, dtype=torch.long)
    loss = F.cross_entropy(logits, labels).item()
    acc = (logits.argmax(1) == labels).float().mean().item()
    return loss, acc
