"""One epoch's synthesis of data-free distillation (Co-Boosting Alg. 1 lines 5-9).

:func:`synthesize` takes ``steps`` Adam steps on a generator and its latent codes (DENSE,
Co-Boosting) or on the pixels themselves (F-ADI) against the weighted ensemble and the student,
and keeps the lowest-loss iterate as the epoch's labelled batch. The client models and the
student stay frozen meanwhile (:func:`frozen`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from fedgo_flwr.config.schema import Checker
from fedgo_flwr.datafree.ensemble import member_logits, weighted_logits
from fedgo_flwr.datafree.generator import reset_generator, to_model_input
from fedgo_flwr.datafree.losses import (
    BNStatistics,
    adversarial_kl,
    hard_cross_entropy,
    image_prior_losses,
)
from fedgo_flwr.runtime.progress import Progress

__all__ = [
    "SOURCES",
    "SynthesisResult",
    "SynthesisSettings",
    "frozen",
    "synthesize",
]

SOURCES = ("generator", "pixels")
"""What :func:`synthesize` optimises: a generator and its latent codes, or the pixels."""


@contextlib.contextmanager
def frozen(models: Sequence[nn.Module]) -> Iterator[None]:
    """Eval mode and no parameter gradients for ``models`` inside the block; restored after."""
    modes = [m.training for m in models]
    flags = [[p.requires_grad for p in m.parameters()] for m in models]
    for m in models:
        m.eval()
        m.requires_grad_(False)
    try:
        yield
    finally:
        for m, mode, f in zip(models, modes, flags, strict=True):
            m.train(mode)
            for p, flag in zip(m.parameters(), f, strict=True):
                p.requires_grad_(flag)


@dataclass
class SynthesisSettings:
    """One epoch's synthesis (Alg. 1 lines 5-9); see :func:`synthesize`.

    ``source``: ``generator`` (DENSE / Co-Boosting) or ``pixels`` (F-ADI). ``steps``: ``T_G``.
    ``lr``, ``beta1``: Adam (paper 1e-3, (0.5, 0.999); DeepInversion optimises pixels with a
    larger rate, e.g. 0.05). ``grad_clip``: norm clip on the generator (10). ``reset``:
    re-initialise the generator each epoch (the authors' code). ``optimise_z``: train the latent
    codes with it (code). ``ce_weight`` / ``hardness``: the class term, ``hardness`` the
    exponent of ``d(x)`` (1: ``L_H``; 0: plain CE, eq. 3). ``adv_weight`` (beta),
    ``adv_temperature`` (paper 1, code 3), ``adv_mask`` (DENSE). ``bn_weight``, ``tv_weight``,
    ``l2_weight``: DeepInversion's terms (0 for Co-Boosting).
    """

    source: str = "generator"
    batch_size: int = 128
    """Synthetic batch size."""
    steps: int = 30
    lr: float = 1e-3
    beta1: float = 0.5
    grad_clip: float = 10.0
    reset: bool = True
    optimise_z: bool = True
    ce_weight: float = 1.0
    hardness: float = 1.0
    adv_weight: float = 1.0
    adv_temperature: float = 1.0
    adv_mask: bool = False
    bn_weight: float = 0.0
    tv_weight: float = 0.0
    l2_weight: float = 0.0

    def check(self, c: Checker) -> None:
        c.choice("source", SOURCES)
        c.require("batch_size", self.batch_size >= 1, "must be >= 1")
        c.require("steps", self.steps >= 1, "must be >= 1 (T_G: generator steps per epoch)")
        c.require("lr", self.lr > 0, "must be > 0")
        c.require("beta1", 0 <= self.beta1 < 1, "must be in [0, 1)")
        c.require("grad_clip", self.grad_clip >= 0, "must be >= 0 (0: no clipping)")
        c.require("hardness", self.hardness >= 0, "must be >= 0 (0: plain cross-entropy)")
        c.require("adv_temperature", self.adv_temperature > 0, "must be > 0")
        for name in ("ce_weight", "adv_weight", "bn_weight", "tv_weight", "l2_weight"):
            c.require(name, getattr(self, name) >= 0, "must be >= 0")


@dataclass
class SynthesisResult:
    """The epoch's batch (the lowest-loss iterate) and what the loop saw."""

    images: Tensor  # (b, C, H, W) in [0, 1], on the CPU
    labels: Tensor  # (b,)
    best_loss: float
    last_loss: float
    terms: dict[str, float]  # the loss terms of the best iterate


def synthesize(
    models: Sequence[nn.Module],
    weights: Tensor,
    student: nn.Module,
    settings: SynthesisSettings,
    *,
    num_classes: int,
    image_shape: Sequence[int],
    rng: torch.Generator,
    device: torch.device,
    generator: nn.Module | None = None,
    nz: int = 256,
    sample_weights: Callable[[Tensor], Tensor] | None = None,
    teacher_norm: str = "none",
    progress: str | None = None,
) -> SynthesisResult:
    """Synthesise one labelled batch against the weighted ensemble and the student (Alg. 1, 5-9).

    Labels are drawn uniformly over the classes; latent codes ``z ~ N(0, I)`` (or, for
    ``pixels``, the images' logits ``~ N(0, 1)``, squashed by a sigmoid so images stay in
    ``[0, 1]`` as the generator's). Every step computes the loss on the current images, keeps
    them if it is the lowest so far (the authors' ``best_inputs``), then takes the Adam step.
    The client models and the student are frozen and in eval mode during synthesis (the
    generator trains in train mode: its batch norm uses batch statistics); ``bn_weight > 0``
    hooks :class:`BNStatistics` on the client models for the duration of the call.
    ``progress`` names the loop in progress lines (:class:`~fedgo_flwr.runtime.progress.Progress`);
    ``None``: none.
    """
    if settings.source not in SOURCES:
        raise ValueError(f"unknown synthesis source {settings.source!r}; choose one of {SOURCES}")
    b = settings.batch_size
    labels = torch.randint(0, num_classes, (b,), generator=rng).to(device)
    params: list[Tensor]
    if settings.source == "generator":
        if generator is None:
            raise ValueError("source 'generator' needs a generator")
        if settings.reset:
            reset_generator(generator, rng)
        generator.to(device).train()
        z = torch.randn((b, nz), generator=rng).to(device)
        z.requires_grad_(settings.optimise_z)
        params = list(generator.parameters()) + ([z] if settings.optimise_z else [])

        def images() -> Tensor:
            assert generator is not None
            return generator(z)
    else:
        pixels = torch.randn((b, *image_shape), generator=rng).to(device).requires_grad_(True)
        params = [pixels]

        def images() -> Tensor:
            return torch.sigmoid(pixels)

    opt = torch.optim.Adam(params, lr=settings.lr, betas=(settings.beta1, 0.999))
    with frozen([*models, student]):
        bn_stats = BNStatistics(models) if settings.bn_weight else None
        try:
            with Progress(progress, settings.steps, "steps") as said:
                best = _synthesis_steps(
                    models,
                    weights,
                    student,
                    settings,
                    labels,
                    params,
                    opt,
                    images,
                    bn_stats,
                    generator,
                    sample_weights,
                    teacher_norm,
                    said,
                )
        finally:
            if bn_stats is not None:
                bn_stats.remove()
    return best


def _synthesis_steps(
    models: Sequence[nn.Module],
    weights: Tensor,
    student: nn.Module,
    settings: SynthesisSettings,
    labels: Tensor,
    params: list[Tensor],
    opt: torch.optim.Optimizer,
    images: Callable[[], Tensor],
    bn_stats: BNStatistics | None,
    generator: nn.Module | None,
    sample_weights: Callable[[Tensor], Tensor] | None = None,
    teacher_norm: str = "none",
    said: Progress | None = None,
) -> SynthesisResult:
    if settings.steps < 1:
        raise ValueError(f"synthesis needs steps >= 1, got {settings.steps}")
    w = weights.detach().to(labels.device)
    best_loss, last_loss = float("inf"), float("inf")
    best_images: Tensor | None = None
    best_terms: dict[str, float] = {}
    for _ in range(settings.steps):
        x01 = images()
        x = to_model_input(x01)
        if bn_stats is not None:
            bn_stats.reset()
        mixed = w if sample_weights is None else w[:, None] * sample_weights(x)
        t_out = weighted_logits(member_logits(models, x, teacher_norm), mixed)
        terms: dict[str, Tensor] = {}
        if settings.ce_weight:
            terms["ce"] = settings.ce_weight * hard_cross_entropy(t_out, labels, settings.hardness)
        if settings.adv_weight:
            s_out = student(x)
            terms["adv"] = settings.adv_weight * adversarial_kl(
                s_out, t_out, settings.adv_temperature, mask=settings.adv_mask
            )
        if bn_stats is not None:
            terms["bn"] = settings.bn_weight * bn_stats.loss().to(x.device)
        if settings.tv_weight or settings.l2_weight:
            tv, l2 = image_prior_losses(x)
            if settings.tv_weight:
                terms["tv"] = settings.tv_weight * tv
            if settings.l2_weight:
                terms["l2"] = settings.l2_weight * l2
        loss = torch.stack(list(terms.values())).sum() if terms else x.sum() * 0.0
        last_loss = float(loss.item())
        if last_loss < best_loss:
            best_loss = last_loss
            best_images = x01.detach().cpu().clone()
            best_terms = {k: float(v.item()) for k, v in terms.items()}
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if settings.source == "generator" and generator is not None and settings.grad_clip > 0:
            nn.utils.clip_grad_norm_(generator.parameters(), settings.grad_clip)
        opt.step()
        if said is not None:
            said.advance()
    if best_images is None:  # no step's loss was a finite number (NaN < inf is false)
        raise FloatingPointError(
            f"synthesis: the loss was not finite in any of its {settings.steps} steps (last: "
            f"{last_loss}); the ensemble's logits on the synthetic batch are not finite "
            "numbers (a client model that produces them should have been left out: "
            "fedgo_flwr.learning.distill.teacher_logits_problem)"
        )
    return SynthesisResult(
        images=best_images,
        labels=labels.detach().cpu(),
        best_loss=best_loss,
        last_loss=last_loss,
        terms=best_terms,
    )
