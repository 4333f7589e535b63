"""Training and evaluating FedGO's GANs: WGAN-GP at the server, discriminators at the clients.

FedGO (Jang, Park & Lee, ICML 2025, Sec. 3.2, App. D) trains its networks
(:mod:`fedgo_flwr.gan.networks`) once, before the FL rounds:

1. the server's generator ``G`` -- here (G1): trained by WGAN-GP on the server's unlabeled data
   (App. E.2: "we trained the WGAN-GP model following the training method proposed in Gulrajani et
   al. (2017) ... Adam optimizer with a learning rate of 0.0002 and (β1, β2) = (0, 0.9) ... batch
   size of 64 until the generator completed 100,000 gradient steps. The generator was updated every
   5 steps of the discriminator, and a gradient penalty coefficient λ of 10 was used"):
   :func:`train_wgan_gp`, with the penalty of :func:`gradient_penalty`;
2. one discriminator per client, trained once against the frozen ``G`` with the vanilla GAN loss
   (Alg. 2 line "D_k <- DiscriminatorUpdate(G, S_k)", Alg. 3): :func:`train_discriminator`;
3. the server then evaluates every discriminator on the distillation set once per run
   (:func:`discriminator_logits`), which is either the server data (D1) or ``G``'s samples (D2,
   :func:`sample`).

All randomness of the training loops (batch order, flips, latent codes, interpolation weights)
comes from one ``torch.Generator`` (``rng=``); runs are reproducible on CPU.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedgo_flwr import profiling
from fedgo_flwr.data import ArrayDataset, batches, ends_in_batch_of_one
from fedgo_flwr.distill import view_batches
from fedgo_flwr.kernels import place

__all__ = [
    "DISCRIMINATOR_LOSSES",
    "discriminator_logits",
    "fedgan_generator_steps",
    "generated_set",
    "gradient_penalty",
    "interpolate_gradient_norms",
    "sample",
    "train_discriminator",
    "train_wgan_gp",
]

log = logging.getLogger(__name__)

DISCRIMINATOR_LOSSES: tuple[str, ...] = ("sigmoid", "double_sigmoid")
"""Squashings :func:`train_discriminator` can train through (``loss=``)."""


# ------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------


def _latent(n: int, latent_dim: int, rng: torch.Generator, device: torch.device) -> Tensor:
    """``n`` standard-normal latent codes drawn on the CPU from ``rng``, then moved."""
    return torch.randn(n, latent_dim, generator=rng).to(device)


def _latent_dim(generator: nn.Module, latent_dim: int | None) -> int:
    value = latent_dim if latent_dim is not None else getattr(generator, "latent_dim", None)
    if value is None or int(value) != value or int(value) < 1:
        raise ValueError(
            "latent_dim must be given (an int >= 1) when the generator has no 'latent_dim' "
            f"attribute, got {value!r}"
        )
    return int(value)


@contextlib.contextmanager
def _frozen(*modules: nn.Module) -> Iterator[None]:
    """Eval mode and no grad for ``modules``; restores each module's train/eval mode afterwards."""
    modes = [m.training for m in modules]
    try:
        for m in modules:
            m.eval()
        with torch.no_grad():
            yield
    finally:
        for m, mode in zip(modules, modes, strict=True):
            m.train(mode)


def _infinite_batches(
    data: ArrayDataset,
    batch_size: int,
    rng: torch.Generator,
    augment: bool,
    device: torch.device,
) -> Iterator[Tensor]:
    """Endless shuffled batches of ``data.x`` (full batches only if the set allows one)."""
    drop_last = len(data) >= batch_size
    while True:
        for x, _ in batches(
            data,
            batch_size,
            shuffle=True,
            rng=rng,
            augment=augment,
            drop_last=drop_last,
            device=device,
        ):
            yield x


def _check_positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or int(value) != value or int(value) < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


# ------------------------------------------------------------------------------------------
# WGAN-GP (server-side generator training, scenario G1)
# ------------------------------------------------------------------------------------------


def interpolate_gradient_norms(
    critic: nn.Module,
    real: Tensor,
    fake: Tensor,
    *,
    rng: torch.Generator,
    create_graph: bool = True,
) -> Tensor:
    """``‖∇_x̂ D(x̂)‖₂`` per sample at ``x̂ = real + α (fake - real)``, ``α ~ U[0, 1]`` per sample.

    The interpolates of Gulrajani et al. (2017), Alg. 1 (one ``α`` per sample, drawn on the CPU
    from ``rng``). With ``create_graph=True`` the norms can be back-propagated to the critic's
    parameters (double back-prop), as the penalty needs.

    Returns:
        ``(N,)`` gradient norms.
    """
    if real.shape != fake.shape:
        raise ValueError(f"real and fake must have the same shape, got {real.shape}, {fake.shape}")
    n = real.shape[0]
    alpha = torch.rand(n, generator=rng).to(device=real.device, dtype=real.dtype)
    alpha = alpha.view(n, *([1] * (real.dim() - 1)))
    x_hat = (real.detach() + alpha * (fake.detach() - real.detach())).requires_grad_(True)
    scores = critic(x_hat)
    (grad,) = torch.autograd.grad(
        outputs=scores.sum(), inputs=x_hat, create_graph=create_graph, retain_graph=create_graph
    )
    return grad.flatten(1).norm(2, dim=1)


def gradient_penalty(
    critic: nn.Module, real: Tensor, fake: Tensor, *, rng: torch.Generator
) -> Tensor:
    """WGAN-GP penalty ``E[(‖∇_x̂ D(x̂)‖₂ - 1)²]`` on interpolates (without the factor ``λ``).

    Zero for a critic whose gradient has unit norm everywhere (e.g. ``D(x) = wᵀx + b`` with
    ``‖w‖ = 1``); always finite and non-negative. Differentiable w.r.t. the critic's parameters.
    """
    return _penalty_and_norms(critic, real, fake, rng)[0]


def _penalty_and_norms(
    critic: nn.Module, real: Tensor, fake: Tensor, rng: torch.Generator
) -> tuple[Tensor, Tensor]:
    """:func:`gradient_penalty` and the per-sample gradient norms it was computed from."""
    norms = interpolate_gradient_norms(critic, real, fake, rng=rng)
    return ((norms - 1.0) ** 2).mean(), norms


def train_wgan_gp(
    generator: nn.Module,
    critic: nn.Module,
    data: ArrayDataset,
    *,
    steps: int,
    batch_size: int = 64,
    lr: float = 2e-4,
    betas: tuple[float, float] = (0.0, 0.9),
    n_critic: int = 5,
    gp_lambda: float = 10.0,
    rng: torch.Generator,
    device: torch.device | str = "cpu",
    augment: bool = False,
    lr_decay: bool = False,
    log_every: int | None = None,
) -> dict[str, float]:
    """Train ``generator`` against ``critic`` with WGAN-GP (Gulrajani et al., 2017, Alg. 1).

    FedGO's (G1) generator (Sec. 3.2; App. E.2: Adam, lr 2e-4, ``(β1, β2) = (0, 0.9)``, batch 64,
    100,000 generator steps, "the generator was updated every 5 steps of the discriminator", ``λ =
    10``; these are the defaults). Each generator step is preceded by ``n_critic`` critic steps on
    ``L_D = E[D(G(z))] - E[D(x)] + λ E[(‖∇D(x̂)‖₂ - 1)²]``; the generator then minimises
    ``L_G = -E[D(G(z))]``. Real batches are shuffled (full batches when the data allow) and
    re-shuffled every pass; both models stay in train mode (BatchNorm in the generator uses batch
    statistics, as in the official code).

    Args:
        generator: Generator with a ``latent_dim`` attribute (see :func:`build_generator`).
        critic: WGAN-GP critic (see :func:`build_critic`); must not use BatchNorm.
        data: Real samples; ``data.x`` is normalised by :func:`fedgo_flwr.data.batches` (images to
            ``[-1, 1]``; feature vectors unchanged). Labels are ignored.
        steps: Number of **generator** steps (``>= 0``).
        batch_size: Real and fake batch size.
        lr: Adam learning rate of both models.
        betas: Adam betas of both models.
        n_critic: Critic steps per generator step.
        gp_lambda: Gradient penalty coefficient ``λ``.
        rng: The only source of randomness (batch order, flips, ``z``, ``α``).
        device: Where to train.
        augment: Random horizontal flips of real images (if ``data.flip``). The paper flips client
            and server data (App. E.2, "Details for Dataset") but does not say so for the GAN.
        lr_decay: Decay both learning rates linearly to 0 over ``steps``, as
            ``gan_cifar_resnet.py`` does (``DECAY=True``); the paper does not mention it.
        log_every: Log progress every this many generator steps (``None``: never).

    Returns:
        ``steps``, ``critic_steps``, ``seconds``, and the values of the last step:
        ``critic_loss`` (``L_D`` including the penalty), ``generator_loss``, ``wasserstein``
        (``E[D(x)] - E[D(G(z))]`` on the last critic batch), ``gradient_penalty`` (without ``λ``)
        and ``grad_norm`` (mean ``‖∇D(x̂)‖``). Loss values are NaN when ``steps == 0``.
    """
    steps = _check_positive_int("steps", steps, minimum=0)
    batch_size = _check_positive_int("batch_size", batch_size)
    n_critic = _check_positive_int("n_critic", n_critic)
    if len(data) == 0:
        raise ValueError("train_wgan_gp needs a non-empty data set")
    latent_dim = _latent_dim(generator, None)
    dev = torch.device(device)
    start = time.perf_counter()
    place(generator, dev).train()
    place(critic, dev).train()
    opt_g = torch.optim.Adam(generator.parameters(), lr=lr, betas=betas)
    opt_d = torch.optim.Adam(critic.parameters(), lr=lr, betas=betas)
    scheds: list[torch.optim.lr_scheduler.LambdaLR] = []
    if lr_decay and steps > 0:
        scheds = [
            torch.optim.lr_scheduler.LambdaLR(opt, lambda i: max(0.0, 1.0 - i / steps))
            for opt in (opt_g, opt_d)
        ]
    real_iter = _infinite_batches(data, batch_size, rng, augment, dev)
    nan = float("nan")
    stats = {
        "critic_loss": nan,
        "generator_loss": nan,
        "wasserstein": nan,
        "gradient_penalty": nan,
        "grad_norm": nan,
    }
    critic_params = list(critic.parameters())
    with profiling.phase("wgan_gp") as tally:
        for step in range(steps):
            for p in critic_params:
                p.requires_grad_(True)
            for _ in range(n_critic):
                real = next(real_iter)
                tally.add(real.shape[0])
                with torch.no_grad():
                    fake = generator(_latent(real.shape[0], latent_dim, rng, dev))
                opt_d.zero_grad(set_to_none=True)
                d_real = critic(real).mean()
                d_fake = critic(fake).mean()
                gp, norms = _penalty_and_norms(critic, real, fake, rng)
                loss_d = d_fake - d_real + gp_lambda * gp
                loss_d.backward()
                opt_d.step()
            for p in critic_params:
                p.requires_grad_(False)
            opt_g.zero_grad(set_to_none=True)
            loss_g = -critic(generator(_latent(batch_size, latent_dim, rng, dev))).mean()
            loss_g.backward()
            opt_g.step()
            for sched in scheds:
                sched.step()
            if log_every and ((step + 1) % log_every == 0 or step + 1 == steps):
                log.info(
                    "wgan-gp step %d/%d: critic %.4f generator %.4f W %.4f gp %.4f",
                    step + 1,
                    steps,
                    loss_d.item(),
                    loss_g.item(),
                    (d_real - d_fake).item(),
                    gp.item(),
                )
            if step + 1 == steps:
                stats = {
                    "critic_loss": loss_d.item(),
                    "generator_loss": loss_g.item(),
                    "wasserstein": (d_real - d_fake).item(),
                    "gradient_penalty": gp.item(),
                    "grad_norm": norms.mean().item(),
                }
    for p in critic_params:
        p.requires_grad_(True)
    return {
        "steps": steps,
        "critic_steps": steps * n_critic,
        "seconds": time.perf_counter() - start,
        **stats,
    }


def fedgan_generator_steps(n: int, batch_size: int, epochs: int, n_critic: int) -> int:
    """Generator steps of one client's FedGAN round (FedGO's G3, App. E.2: "each local
    generator and discriminator trained for 3 epochs per round").

    Neither paper defines a WGAN-GP epoch; here it is one pass of the critic over the client's
    ``n`` samples, ``ceil(n / batch_size)`` critic steps, so ``epochs`` epochs are
    ``epochs * ceil(n / batch_size) / n_critic`` generator steps, rounded, and at least 1.
    """
    n = _check_positive_int("n", n)
    batch_size = _check_positive_int("batch_size", batch_size)
    epochs = _check_positive_int("epochs", epochs)
    n_critic = _check_positive_int("n_critic", n_critic)
    return max(1, round(epochs * math.ceil(n / batch_size) / n_critic))


# ------------------------------------------------------------------------------------------
# Client discriminator (Alg. 3) and server-side helpers
# ------------------------------------------------------------------------------------------


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


def sample(
    generator: nn.Module,
    n: int,
    latent_dim: int | None = None,
    *,
    rng: torch.Generator,
    device: torch.device | str = "cpu",
    batch_size: int = 256,
) -> Tensor:
    """Draw ``n`` samples ``G(z)`` reproducibly, e.g. the distillation set of scenario D2 (Sec 3.2).

    All ``n`` latent codes are drawn up front on the CPU from ``rng`` and ``G`` runs in eval
    mode (BatchNorm running statistics) without gradients, so the result depends only on the
    generator's weights and the seed -- not on ``batch_size`` or ``device``. ``G``'s train/eval mode
    is restored afterwards.

    Returns:
        ``(n, *output_shape)`` float32 CPU tensor (images in ``[-1, 1]``).
    """
    n = _check_positive_int("n", n, minimum=0)
    batch_size = _check_positive_int("batch_size", batch_size)
    zdim = _latent_dim(generator, latent_dim)
    dev = torch.device(device)
    place(generator, dev)
    z_all = torch.randn(n, zdim, generator=rng)
    outs: list[Tensor] = []
    with _frozen(generator):
        for i in range(0, n, batch_size):
            outs.append(generator(z_all[i : i + batch_size].to(dev)).float().cpu())
    if outs:
        return torch.cat(outs)
    shape = getattr(generator, "output_shape", None)
    return torch.empty(0, *shape) if shape is not None else torch.empty(0)


def generated_set(
    generator: nn.Module,
    n: int,
    latent_dim: int | None,
    rng: torch.Generator,
    *,
    like: ArrayDataset,
    device: torch.device | str = "cpu",
) -> ArrayDataset:
    """``n`` samples of ``generator`` (:func:`sample`) as an unlabeled data set stored like
    ``like`` (``uint8`` images when it holds ``uint8``, else ``float32``), with its number of
    classes and flip setting: a distillation set of generated data (FedGO D2, DaFKD)."""
    x = sample(generator, n, latent_dim, rng=rng, device=device)
    if like.x.dtype == np.uint8:
        x_np = ((x.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).numpy()
    else:
        x_np = x.numpy().astype(np.float32)
    return ArrayDataset(
        x=x_np, y=np.zeros(len(x_np), dtype=np.int64), num_classes=like.num_classes, flip=like.flip
    )


def discriminator_logits(
    discs: Mapping[int, nn.Module],
    data: ArrayDataset,
    *,
    views: int = 1,
    num_clients: int | None = None,
    device: torch.device | str = "cpu",
    batch_size: int = 512,
) -> Tensor:
    """Raw logits ``z_k(x)`` of every client's discriminator on every view of every sample.

    The server computes this once per run for the distillation set and the test split (the
    discriminators are fixed after pre-FL, Alg. 2) and feeds it to
    :class:`fedgo_flwr.weighting.WeightingInputs` (``disc_logits``). The samples are taken from
    ``data`` in order by :func:`fedgo_flwr.distill.view_batches` (normalised as by
    :func:`batches`; view 1 is the horizontal flip), so the views line up with the teachers'
    logits on the same set. Each discriminator runs in eval mode without gradients, one at a
    time on ``device``; afterwards it is back on the CPU in its previous train/eval mode.

    Args:
        discs: Discriminators (raw-logit output) by client id (the row they fill).
        data: The samples.
        views: Number of views ``V`` (1: the samples as they are; 2: also their flips).
        num_clients: Number of rows ``K``; defaults to the largest client id plus one. Rows of
            clients without a discriminator are 0 (the neutral logit).
        device: Where to evaluate.
        batch_size: Samples per forward pass.

    Returns:
        ``(K, V, N)`` float32 CPU tensor.

    Raises:
        ValueError: A client id outside ``0 .. K-1``, or a bad ``views`` / ``batch_size``.
    """
    views = _check_positive_int("views", views)
    batch_size = _check_positive_int("batch_size", batch_size)
    if num_clients is None:
        num_clients = max(discs, default=-1) + 1
    num_clients = _check_positive_int("num_clients", num_clients, minimum=0)
    bad = sorted(k for k in discs if not 0 <= k < num_clients)
    if bad:
        raise ValueError(f"client ids {bad} outside 0..{num_clients - 1} (num_clients)")
    out = torch.zeros(num_clients, views, len(data))
    if not discs or len(data) == 0:
        return out
    dev = torch.device(device)
    images = len(discs) * views * len(data)
    with profiling.phase("discriminator_logits", images, batch_size):
        _fill_discriminator_logits(out, discs, view_batches(data, views, batch_size, dev), dev)
    return out


def _fill_discriminator_logits(
    out: Tensor, discs: Mapping[int, nn.Module], batched: list[tuple[int, Tensor]], dev
) -> None:
    views = out.shape[1]
    for k, disc in discs.items():
        place(disc, dev)
        parts: list[list[Tensor]] = [[] for _ in range(views)]
        with _frozen(disc):
            for v, x in batched:
                parts[v].append(disc(x).float().cpu().reshape(-1))
        out[k] = torch.stack([torch.cat(p) for p in parts])
        disc.cpu()
