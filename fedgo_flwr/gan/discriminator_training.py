"""Training of a FedGO client discriminator against the frozen server generator (Alg. 3).

FedGO (Jang, Park & Lee, ICML 2025, Sec. 3.2, App. D) trains one discriminator per client once,
before the FL rounds, against the frozen ``G`` with the vanilla GAN loss (Alg. 2 line "D_k <-
DiscriminatorUpdate(G, S_k)", Alg. 3): :func:`train_discriminator`. The architectures are in
:mod:`fedgo_flwr.gan.discriminators`; their logits on the distillation set are taken by
:func:`fedgo_flwr.gan.sampling.discriminator_logits`.

All randomness of the training loop (batch order, flips, latent codes, held-out split) comes
from one ``torch.Generator`` (``rng=``); runs are reproducible on CPU.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedgo_flwr.data import ArrayDataset, batches, ends_in_batch_of_one
from fedgo_flwr.gan.sampling import _check_positive_int, _frozen, _latent, _latent_dim
from fedgo_flwr.runtime import profiling
from fedgo_flwr.runtime.kernels import place

__all__ = [
    "DISCRIMINATOR_LOSSES",
    "train_discriminator",
]

DISCRIMINATOR_LOSSES: tuple[str, ...] = ("sigmoid", "double_sigmoid")
"""Squashings :func:`train_discriminator` can train through (``loss=``)."""


def train_discriminator(
    disc: nn.Module,
    generator: nn.Module | None,
    data: ArrayDataset,
    *,
    epochs: int,
    batch_size: int = 64,
    lr: float = 2e-4,
    betas: tuple[float, float] = (0.5, 0.999),
    latent_dim: int | None = None,
    rng: torch.Generator,
    device: torch.device | str = "cpu",
    augment: bool = False,
    loss: str = "sigmoid",
    reference: ArrayDataset | None = None,
    mixture: float | None = None,
    label_smoothing: float = 0.0,
    patience: int = 0,
    holdout: float = 0.1,
) -> dict[str, float]:
    """Train a client discriminator against the frozen server generator (FedGO Alg. 3).

    For ``epochs`` passes over the local data (shuffled minibatches), every real batch ``x`` (label
    1) is paired with as many negatives (label 0): generated samples ``G(z)`` (``G`` in eval mode
    and under ``no_grad``, so it is never updated), reference images, or a mix of both, and
    the discriminator takes one Adam step on the vanilla GAN loss
    ``-[log D(x) + log(1 - D(G(z)))]`` (Alg. 3, "Loss_GAN ... Update with gradient for vanilla
    GAN loss"), computed as the sum of two ``BCEWithLogits`` terms with separate forward
    passes for real and fake as in ``gan_mnist.py``. Defaults follow App. E.2: Adam lr 2e-4,
    ``(β1, β2) = (0.5, 0.999)``, batch 64 (30 epochs on CIFAR, 10 on ImageNet100).

    Which sigmoid is trained (``loss``):
        App. E.2 states only: "we employed a composition of two sigmoid activations for the
        discriminator output. This ensures that the odds value Φ_k for client k's discriminator
        D_k is constrained between 1 and e". It does not say whether the training loss sees the
        second sigmoid. The model returns the raw logit ``z`` in both cases; ``loss`` picks the
        probability the GAN loss is computed on:

        * ``"sigmoid"`` (default): ``D = sigmoid(z)``, standard ``BCEWithLogits(z)``. This is the
          discriminator of Thm 2.1 / Thm 3.6, whose optimum satisfies ``z = log(p_k / p_g)``; the
          double sigmoid is then applied only at weighting time by :mod:`fedgo_flwr.weighting`
          (``disc_mode="double_sigmoid"``: ``Φ = exp(sigmoid(z))``, a smooth monotone squashing of
          the density ratio into ``(1, e)``), and the same ``z`` also serves ``disc_mode="sigmoid"``
          and DaFKD's weighting. Chosen as the default for that reason.
        * ``"double_sigmoid"``: ``D = sigmoid(sigmoid(z)) ∈ (0.5, 0.731)`` inside the loss
          (``BCEWithLogits(sigmoid(z))``), the literal reading "the model's output layer is two
          sigmoids". The point-wise optimum is then ``D* = clip(p_k / (p_k + p_g), 0.5, 0.731)``,
          i.e. odds ``clip(p_k / p_g, 1, e)``; pair it with ``disc_mode="double_sigmoid"``.

    Args:
        disc: Discriminator with raw-logit output ``(N,)`` (see :func:`build_discriminator`).
        generator: The server's generator ``G``; frozen (its train/eval mode is restored).
        data: The client's local data (labels ignored), normalised by :func:`batches`.
        epochs: Passes over ``data`` (``E_d`` of Alg. 3; ``>= 0``).
        batch_size: Real batch size (fake batches have the same size).
        lr: Adam learning rate.
        betas: Adam betas.
        latent_dim: Size of ``z``; defaults to ``generator.latent_dim``.
        rng: The only source of randomness (batch order, flips, ``z``).
        device: Where to train.
        augment: Random horizontal flips of real images (if ``data.flip``; App. E.2 flips client
            data, which this function leaves to the caller).
        loss: ``"sigmoid"`` (default) or ``"double_sigmoid"``, see above.
        reference: Images the discriminator also learns to reject (the server's unlabeled
            share; ``strategy.discriminator.reference``), drawn at random (with random flips if
            ``augment``) for every step; ``None``: samples of ``generator`` only.
        mixture: Share of every negative batch taken from ``reference`` (the rest are samples
            of ``generator``); default 1 if ``generator`` is ``None``, else 0 (the paper).
        label_smoothing: One-sided label smoothing ``s``: real targets are ``1 - s``.
        patience: Early stopping (0: off): hold out a ``holdout`` share of ``data`` and of
            ``reference`` (plus a fixed draw of generated samples), measure the loss on them
            after every epoch, stop after ``patience`` epochs without a lower one and keep the
            best epoch's weights.
        holdout: The held-out share for early stopping.

    Returns:
        ``epochs``, ``steps``, ``num_examples``, ``seconds``; over the last epoch: ``loss`` (mean
        per-step loss), ``real_accuracy`` (share of real samples with ``z > 0``),
        ``fake_accuracy`` (share of generated samples with ``z < 0``) and ``accuracy`` (their
        mean), measured on the training batches before each update. NaN when nothing ran.
        With early stopping also ``best_epoch`` (1-based) and ``holdout_loss`` (its held-out
        loss); ``epochs`` is then the number of epochs run.
    """
    epochs = _check_positive_int("epochs", epochs, minimum=0)
    batch_size = _check_positive_int("batch_size", batch_size)
    patience = _check_positive_int("patience", patience, minimum=0)
    if loss not in DISCRIMINATOR_LOSSES:
        raise ValueError(
            f"unknown discriminator loss {loss!r}; expected one of {DISCRIMINATOR_LOSSES}"
        )
    if not 0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must lie in [0, 0.5), got {label_smoothing!r}")
    share = (0.0 if generator is not None else 1.0) if mixture is None else float(mixture)
    if not 0 <= share <= 1:
        raise ValueError(f"mixture must lie in [0, 1], got {mixture!r}")
    if share > 0 and (reference is None or len(reference) == 0):
        raise ValueError("a reference share (mixture > 0) needs a non-empty reference set")
    if share < 1 and generator is None:
        raise ValueError("a generated share (mixture < 1) needs a generator")
    zdim = _latent_dim(generator, latent_dim) if share < 1 else 0
    dev = torch.device(device)
    start = time.perf_counter()
    place(disc, dev).train()
    if generator is not None:
        place(generator, dev)
    negatives = _Negatives(generator, reference, share, zdim, augment, dev)
    held: tuple[Tensor, Tensor] | None = None
    if patience:
        data, held_real, negatives.reference, held_ref = _holdout(data, reference, holdout, rng)
        if held_real is None:
            patience = 0  # too little data to hold any out: train every epoch
        else:
            negatives_held = _Negatives(generator, held_ref, share, zdim, False, dev)
            x_real_held = held_real.to_tensors()[0].to(dev)
            held = x_real_held, negatives_held.draw(len(x_real_held), rng)
    opt = torch.optim.Adam(disc.parameters(), lr=lr, betas=betas)
    drop_last = ends_in_batch_of_one(len(data), batch_size)  # BatchNorm (norm="batch")
    real_target = 1.0 - label_smoothing
    steps = 0
    total = real_ok = fake_ok = 0.0
    count = epoch_steps = 0
    best: tuple[float, int, dict[str, Tensor]] | None = None
    run = 0
    with profiling.phase("discriminator_training") as tally:
        for epoch in range(epochs):
            run = epoch + 1
            total = real_ok = fake_ok = 0.0
            count = epoch_steps = 0
            for x_real, _ in batches(
                data,
                batch_size,
                shuffle=True,
                rng=rng,
                augment=augment,
                drop_last=drop_last,
                device=dev,
            ):
                n = x_real.shape[0]
                tally.add(n)
                x_fake = negatives.draw(n, rng)
                opt.zero_grad(set_to_none=True)
                z_real = disc(x_real)
                z_fake = disc(x_fake)
                step_loss = _gan_loss(z_real, z_fake, loss, real_target)
                step_loss.backward()
                opt.step()
                steps += 1
                epoch_steps += 1
                total += step_loss.item()
                real_ok += (z_real.detach() > 0).sum().item()
                fake_ok += (z_fake.detach() < 0).sum().item()
                count += n
            if held is not None:
                with _frozen(disc):
                    held_loss = _gan_loss(disc(held[0]), disc(held[1]), loss, 1.0).item()
                if best is None or held_loss < best[0]:
                    state = {k: v.detach().clone() for k, v in disc.state_dict().items()}
                    best = (held_loss, run, state)
                elif run - best[1] >= patience:
                    break
    nan = float("nan")
    real_acc = real_ok / count if count else nan
    fake_acc = fake_ok / count if count else nan
    stats = {
        "epochs": run,
        "steps": steps,
        "num_examples": len(data),
        "seconds": 0.0,
        "loss": total / epoch_steps if epoch_steps else nan,
        "real_accuracy": real_acc,
        "fake_accuracy": fake_acc,
        "accuracy": (real_acc + fake_acc) / 2 if count else nan,
    }
    if best is not None:
        disc.load_state_dict(best[2])
        stats["best_epoch"], stats["holdout_loss"] = best[1], best[0]
    stats["seconds"] = time.perf_counter() - start
    return stats


def _gan_loss(z_real: Tensor, z_fake: Tensor, loss: str, real_target: float) -> Tensor:
    """The vanilla GAN loss of Alg. 3 on raw logits, through the sigmoid(s) ``loss`` names."""
    if loss == "double_sigmoid":
        z_real, z_fake = torch.sigmoid(z_real), torch.sigmoid(z_fake)
    return F.binary_cross_entropy_with_logits(
        z_real, torch.full_like(z_real, real_target)
    ) + F.binary_cross_entropy_with_logits(z_fake, torch.zeros_like(z_fake))


class _Negatives:
    """Negative batches of a discriminator: ``share`` of each from ``reference`` (random
    images, random flips if ``augment``), the rest ``G(z)``. With ``share`` 0 it draws exactly
    what the paper's loop draws (``n`` latent codes), so those runs are unchanged."""

    def __init__(
        self,
        generator: nn.Module | None,
        reference: ArrayDataset | None,
        share: float,
        latent_dim: int,
        augment: bool,
        device: torch.device,
    ) -> None:
        self.generator, self.reference, self.share = generator, reference, share
        self.latent_dim, self.device = latent_dim, device
        self.flip = bool(augment and reference is not None and reference.flip)

    def draw(self, n: int, rng: torch.Generator) -> Tensor:
        n_ref = round(self.share * n)
        parts: list[Tensor] = []
        if n - n_ref > 0:
            assert self.generator is not None
            with _frozen(self.generator):
                parts.append(self.generator(_latent(n - n_ref, self.latent_dim, rng, self.device)))
        if n_ref > 0:
            assert self.reference is not None
            idx = torch.randint(len(self.reference), (n_ref,), generator=rng).numpy()
            x = self.reference.to_tensors(idx)[0].to(self.device)
            if self.flip and x.ndim == 4:
                mask = (torch.rand(n_ref, generator=rng) < 0.5).to(self.device)
                x = torch.where(mask[:, None, None, None], x.flip(-1), x)
            parts.append(x)
        return parts[0] if len(parts) == 1 else torch.cat(parts)


def _holdout(
    data: ArrayDataset,
    reference: ArrayDataset | None,
    share: float,
    rng: torch.Generator,
) -> tuple[ArrayDataset, ArrayDataset | None, ArrayDataset | None, ArrayDataset | None]:
    """``(data kept, data held out, reference kept, reference held out)``: a random ``share``
    of each set held out for early stopping; ``None`` where a set is too small to split (then
    the set is kept whole)."""
    if not 0 < share < 1:
        raise ValueError(f"holdout must lie in (0, 1), got {share!r}")

    def split(ds: ArrayDataset | None) -> tuple[ArrayDataset | None, ArrayDataset | None]:
        if ds is None:
            return None, None
        n_held = round(share * len(ds))
        if n_held < 1 or n_held >= len(ds):
            return ds, None
        order = torch.randperm(len(ds), generator=rng).numpy()
        return ds.subset(np.sort(order[n_held:])), ds.subset(np.sort(order[:n_held]))

    kept, held = split(data)
    ref_kept, ref_held = split(reference)
    if ref_held is None:
        ref_held = ref_kept
    assert kept is not None
    return kept, held, ref_kept, ref_held
