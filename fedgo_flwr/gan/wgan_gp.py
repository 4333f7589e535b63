"""WGAN-GP training of FedGO's server generator (scenario G1), and FedGAN's step count (G3).

FedGO (Jang, Park & Lee, ICML 2025, Sec. 3.2, App. D) trains the server's generator ``G``
(:mod:`fedgo_flwr.gan.generators`) once, before the FL rounds, by WGAN-GP on the server's
unlabeled data against a critic (:mod:`fedgo_flwr.gan.critics`). App. E.2: "we trained the
WGAN-GP model following the training method proposed in Gulrajani et al. (2017) ... Adam
optimizer with a learning rate of 0.0002 and (β1, β2) = (0, 0.9) ... batch size of 64 until the
generator completed 100,000 gradient steps. The generator was updated every 5 steps of the
discriminator, and a gradient penalty coefficient λ of 10 was used": :func:`train_wgan_gp`, with
the penalty of :func:`gradient_penalty`. :func:`fedgan_generator_steps` sizes a client's FedGAN
round (G3: no server data, the generator trained at the clients).

All randomness of the training loop (batch order, flips, latent codes, interpolation weights)
comes from one ``torch.Generator`` (``rng=``); runs are reproducible on CPU.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fedgo_flwr.data import ArrayDataset, batches
from fedgo_flwr.gan.sampling import _check_positive_int, _latent, _latent_dim
from fedgo_flwr.runtime import profiling
from fedgo_flwr.runtime.fileio import atomic_torch_save, safe_torch_load
from fedgo_flwr.runtime.kernels import place
from fedgo_flwr.runtime.progress import Progress

__all__ = [
    "fedgan_generator_steps",
    "gradient_penalty",
    "interpolate_gradient_norms",
    "train_wgan_gp",
]

log = logging.getLogger(__name__)


class _RealBatches:
    """Endless shuffled batches of ``data.x`` (full batches only if the set allows one), pass
    after pass, as :func:`fedgo_flwr.data.batches` makes them: the same draws from ``rng`` (a
    permutation when a pass starts, a flip mask per batch when it is taken), so the stream is
    the one of ``batches`` called pass after pass. Its place in a pass is :meth:`state`, which
    :meth:`restore` puts back (a resumed training: :func:`train_wgan_gp`'s ``resume_file``)."""

    def __init__(
        self,
        data: ArrayDataset,
        batch_size: int,
        rng: torch.Generator,
        augment: bool,
        device: torch.device,
    ) -> None:
        self.data, self.batch_size, self.rng = data, batch_size, rng
        self.augment, self.device = augment, device
        self.drop_last = len(data) >= batch_size
        self.order: np.ndarray | None = None  # this pass's permutation
        self.pos = 0  # where its next batch starts

    def __next__(self) -> Tensor:
        n = len(self.data)
        ended = self.pos >= n or (self.drop_last and n - self.pos < self.batch_size)
        if self.order is None or ended:
            self.order = torch.randperm(n, generator=self.rng).numpy()
            self.pos = 0
        idx = self.order[self.pos : self.pos + self.batch_size]
        self.pos += len(idx)
        one = self.data.subset(idx)
        ((x, _),) = batches(
            one, len(idx), shuffle=False, rng=self.rng, augment=self.augment, device=self.device
        )
        return x

    def state(self) -> dict[str, Tensor | int]:
        """This pass's permutation (empty before the first pass) and the place in it."""
        order = torch.empty(0, dtype=torch.int64) if self.order is None else self.order
        return {"order": torch.as_tensor(order), "pos": self.pos}

    def restore(self, state: dict[str, Tensor | int]) -> None:
        order = torch.as_tensor(state["order"])
        self.order = order.numpy() if order.numel() else None  # the data are never empty
        self.pos = int(state["pos"])


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
    progress: str | None = None,
    on_step: Callable[[int], None] | None = None,
    resume_file: str | Path | None = None,
    save_every: float = 300.0,
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
        log_every: Log the losses every this many generator steps (``None``: never).
        progress: The stage's name in progress lines (steps done, rate, time left;
            :class:`fedgo_flwr.runtime.progress.Progress`); ``None``: no progress lines.
        on_step: Called with the number of generator steps done after each one (e.g. to keep
            snapshots: without ``lr_decay``, the generator after step ``k`` of a longer run is
            the generator of a ``k``-step run, since every step draws the same random numbers).
        resume_file: A snapshot of the training in progress, written (atomically) every
            ``save_every`` seconds and removed when the training ends: a training that was
            stopped (a session's end, a killed run) goes on from its last snapshot when it is
            started again with the same file and ``steps``: both models, both optimisers, the
            learning-rate schedules, ``rng`` and the place in the batch order, so the generator
            it ends with is the uninterrupted training's, bit for bit on a CPU. A snapshot that
            does not load, or that was made for another ``steps``, is left out with a WARNING
            (the training starts from step 0).
        save_every: Seconds between snapshots (with ``resume_file``).

    Returns:
        ``steps``, ``critic_steps``, ``seconds`` (the training's time, the stopped runs' part
        included), ``resumed_at`` (only for a resumed training: the step it went on from), and
        the values of the last step:
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
    real_iter = _RealBatches(data, batch_size, rng, augment, dev)
    snapshot = None if resume_file is None else Path(resume_file)
    parts = (generator, critic, opt_g, opt_d, scheds, rng, real_iter)
    first, before = _resume(snapshot, steps, *parts) if snapshot is not None else (0, 0.0)
    saved = time.perf_counter()
    nan = float("nan")
    stats = {
        "critic_loss": nan,
        "generator_loss": nan,
        "wasserstein": nan,
        "gradient_penalty": nan,
        "grad_norm": nan,
    }
    critic_params = list(critic.parameters())
    what = progress if progress is None or not first else f"{progress}, from step {first}"
    said = Progress(what, steps - first, "steps")
    with profiling.phase("wgan_gp") as tally, said:
        for step in range(first, steps):
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
            said.advance()
            if snapshot is not None and step + 1 < steps:
                now = time.perf_counter()
                if now - saved >= save_every:
                    _snapshot(snapshot, steps, step + 1, before + now - start, *parts)
                    saved = time.perf_counter()
            if on_step is not None:
                on_step(step + 1)
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
    if snapshot is not None:
        snapshot.unlink(missing_ok=True)
    resumed = {"resumed_at": first} if first else {}
    return {
        "steps": steps,
        "critic_steps": steps * n_critic,
        "seconds": before + time.perf_counter() - start,
        **resumed,
        **stats,
    }


def _snapshot(path: Path, steps: int, done: int, seconds: float, *parts: Any) -> None:
    """Write the training's state after ``done`` of ``steps`` generator steps."""
    generator, critic, opt_g, opt_d, scheds, rng, real = parts
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "steps": steps,
        "done": done,
        "seconds": seconds,
        "generator": generator.state_dict(),
        "critic": critic.state_dict(),
        "opt_g": opt_g.state_dict(),
        "opt_d": opt_d.state_dict(),
        "scheds": [s.state_dict() for s in scheds],
        "rng": rng.get_state(),
        "batches": real.state(),
    }
    atomic_torch_save(path, state)


def _resume(path: Path, steps: int, *parts: Any) -> tuple[int, float]:
    """Load ``path``'s snapshot into the training's parts; the steps it had done and the
    seconds it had taken (``0, 0.0``: no usable snapshot, the training starts afresh)."""
    if not path.is_file():
        return 0, 0.0
    generator, critic, opt_g, opt_d, scheds, rng, real = parts
    try:
        state = safe_torch_load(path, "generator training snapshot")
        if state["steps"] != steps or not 0 < state["done"] < steps:
            log.warning(
                "%s was made for a %s-step training, at step %s; this one has %d steps: "
                "starting from step 0",
                path,
                state["steps"],
                state["done"],
                steps,
            )
            return 0, 0.0
        generator.load_state_dict(state["generator"])
        critic.load_state_dict(state["critic"])
        opt_g.load_state_dict(state["opt_g"])
        opt_d.load_state_dict(state["opt_d"])
        for sched, saved in zip(scheds, state["scheds"], strict=True):
            sched.load_state_dict(saved)
        rng.set_state(state["rng"])
        real.restore(state["batches"])
    except (ValueError, KeyError, TypeError, RuntimeError) as exc:
        log.warning("%s does not resume this training (%s): starting from step 0", path, exc)
        return 0, 0.0
    log.info("WGAN-GP: going on from step %d of %d (%s)", state["done"], steps, path)
    return int(state["done"]), float(state["seconds"])


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
