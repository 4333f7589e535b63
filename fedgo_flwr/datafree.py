"""Data-free ensemble distillation: synthesis, ensemble re-weighting, diversification, pool KD.

The server of a one-shot federation holds the clients' models and no data. It distils their
ensemble into its own model on images it synthesises from that ensemble. This module holds the
math of the methods of Co-Boosting's Table 1 (Dai et al., "Enhancing One-Shot Federated
Learning Through Data and Ensemble Co-Boosting", ICLR 2024; paper 004), as plain PyTorch that
knows nothing of Flower:

- **Weighted ensemble** (eq. 2): ``A_w(x) = sum_k w_k f_k(x) / sum_k w_k`` over the clients'
  logits (:func:`weighted_logits`). Eq. 2 as printed has no division; the authors' ``WEnsemble``
  divides by ``sum_k w_k``, and so do we (the issue's contract): without it the size of ``w``
  would act as an inverse temperature on the ensemble.
- **Synthesis** (Alg. 1 lines 5-9, :func:`synthesize`): a generator (:class:`Generator`, the
  DENSE / Co-Boosting network) takes ``steps`` (``T_G``) Adam steps on
  ``L = ce_weight * L_H + adv_weight * L_A (+ bn_weight * L_BN + priors)``; the iterate with the
  lowest loss is the epoch's batch. ``L_H`` is the hardness-weighted cross-entropy of eqs. 5-6
  (:func:`hard_cross_entropy`; plain CE of eq. 3 when ``hard_weighting`` is off), ``L_A`` minus
  the KL between ensemble and student (eq. 7, :func:`adversarial_kl`). DENSE (Zhang et al.,
  NeurIPS 2022) is the same loop with plain CE, the adversarial term masked to samples where
  student and ensemble disagree (``adv_mask``), no re-weighting and no diversification. F-ADI
  (DeepInversion, Yin et al., CVPR 2020, as a one-shot FL baseline) optimises the pixels
  themselves (``source: pixels``) with the batch-norm statistics loss (:class:`BNStatistics`)
  and image priors (:func:`image_prior_losses`).
- **Ensemble weights** (eqs. 11-12, :func:`weight_step`): one signed-gradient step of the
  cross-entropy of ``A_w`` on a labelled synthetic batch, then each ``w_k`` clipped to
  ``[0, 1]`` ("Normalize").
- **Diversification** (eq. 10, :func:`diversify`): ``x + eps * g / ||g||_2`` with
  ``g = grad_x u^T A_w(x)``, ``u ~ U[-1, 1]^C`` drawn per sample (paper). The authors' code
  takes ``x + eps * sign(grad_x u^T softmax(A_w(x) / 4))`` instead (``variant="code"``).
  ``eps`` is in the units of the models' inputs (images normalised to ``[-1, 1]``), where the
  code applies it too.
- **Pool** (:class:`SyntheticPool`): every epoch's batch is kept (all history), as ``uint8``
  images in ``[0, 255]``: the authors save PNGs and read them back, so pool images are
  quantised exactly as theirs are, and the pool reads through :func:`fedgo_flwr.data.batches`
  (normalisation to ``[-1, 1]``, random horizontal flips when the data set allows them; the
  authors' CIFAR transform also random-crops, which this project's augmentation has not).
- **Distillation** (eq. 4, :func:`kd_loss`): ``T^2 KL(softmax(A_w/T) || softmax(f_S/T))``,
  batch mean, ``T = 4``.

All randomness (latent codes, labels, the generator's re-initialisation, ``u``, batch order,
flips) comes from explicit ``torch.Generator`` objects, so a run repeats exactly on CPU.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedgo_flwr.data import ArrayDataset, batches
from fedgo_flwr.distill import normalise_teachers
from fedgo_flwr.schema import Checker
from fedgo_flwr.weighting import log_discriminator_odds

__all__ = [
    "DIVERSIFY_VARIANTS",
    "SOURCES",
    "ORDERS",
    "BNStatistics",
    "BoostSettings",
    "DataFreeDistillation",
    "Generator",
    "SynthesisResult",
    "SynthesisSettings",
    "SyntheticPool",
    "adversarial_kl",
    "diversify",
    "fedgo_multipliers",
    "frozen",
    "hard_cross_entropy",
    "image_prior_losses",
    "kd_loss",
    "member_logits",
    "reset_generator",
    "synthesize",
    "to_model_input",
    "weight_step",
    "weighted_logits",
]

SOURCES = ("generator", "pixels")
"""What :func:`synthesize` optimises: a generator and its latent codes, or the pixels."""
DIVERSIFY_VARIANTS = ("paper", "code")
"""Eq. 10 as printed, or the authors' sign step on softmax at temperature 4."""
MIN_WEIGHT_SUM = 1e-12
"""Floor of ``sum_k w_k`` in :func:`weighted_logits`: if every weight was clipped to 0 the
ensemble outputs zero logits (uniform predictions) instead of dividing by zero."""


# ---------------------------------------------------------------------------------------------
# Generator
# ---------------------------------------------------------------------------------------------


class Generator(nn.Module):
    """The DENSE / Co-Boosting generator (the authors' ``datafree.models.generator.Generator``).

    ``Linear(nz -> 2 ngf (H/4) (W/4))``, BN, upsample x2, ``Conv3x3(2 ngf -> 2 ngf)`` (no bias),
    BN, LeakyReLU(0.2), upsample x2, ``Conv3x3(2 ngf -> ngf)`` (no bias), BN, LeakyReLU(0.2),
    ``Conv3x3(ngf -> C)``, sigmoid: images in ``[0, 1]`` (:func:`to_model_input` maps them to the
    models' ``[-1, 1]``). Paper defaults ``nz = 256``, ``ngf = 64`` (App. B.1: "the same as
    DENSE"). ``H`` and ``W`` must be multiples of 4 (32x32 CIFAR, 8x8 digits).
    """

    def __init__(self, image_shape: Sequence[int], nz: int = 256, ngf: int = 64) -> None:
        super().__init__()
        if len(image_shape) != 3:
            raise ValueError(
                f"the generator makes images (C, H, W), got shape {tuple(image_shape)}"
            )
        c, h, w = (int(s) for s in image_shape)
        if h % 4 or w % 4 or h < 4 or w < 4:
            raise ValueError(f"the generator needs H and W multiples of 4, got {h}x{w}")
        self.image_shape = (c, h, w)
        self.nz = int(nz)
        self.grid = (h // 4, w // 4)
        self.project = nn.Linear(self.nz, 2 * ngf * self.grid[0] * self.grid[1])
        self.body = nn.Sequential(
            nn.BatchNorm2d(2 * ngf),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(2 * ngf, 2 * ngf, 3, padding=1, bias=False),
            nn.BatchNorm2d(2 * ngf),
            nn.LeakyReLU(0.2),
            nn.Upsample(scale_factor=2),
            nn.Conv2d(2 * ngf, ngf, 3, padding=1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.LeakyReLU(0.2),
            nn.Conv2d(ngf, c, 3, padding=1),
            nn.Sigmoid(),
        )

    def forward(self, z: Tensor) -> Tensor:
        out = self.project(z).view(z.shape[0], -1, *self.grid)
        return self.body(out)


def reset_generator(model: nn.Module, rng: torch.Generator) -> None:
    """Re-initialise ``model`` as the authors do every epoch (``reset_model``).

    Convolution and linear weights ~ N(0, 0.02), their biases 0; BatchNorm weights ~ N(1, 0.02),
    biases 0; running statistics reset. Drawn from ``rng`` (CPU), so the reset is seeded.
    """
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)):
                m.weight.copy_(_normal(m.weight.shape, 0.0, 0.02, rng))
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.copy_(_normal(m.weight.shape, 1.0, 0.02, rng))
                m.bias.zero_()
                m.reset_running_stats()


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


def _normal(shape: torch.Size, mean: float, std: float, rng: torch.Generator) -> Tensor:
    return torch.randn(shape, generator=rng) * std + mean


def to_model_input(images: Tensor) -> Tensor:
    """Images in ``[0, 1]`` to the models' inputs in ``[-1, 1]`` (this project's normalisation,
    mean = std = 0.5 as the authors' normaliser)."""
    return images * 2.0 - 1.0


# ---------------------------------------------------------------------------------------------
# Ensemble
# ---------------------------------------------------------------------------------------------


def member_logits(models: Sequence[nn.Module], x: Tensor, teacher_norm: str = "none") -> Tensor:
    """Every client model's logits on ``x``: ``(n, N, C)``, float32, under ``teacher_norm``
    (:func:`fedgo_flwr.distill.normalise_teachers` over the batch ``x``; ``none``: as they are).

    Gradients flow to ``x`` when it requires them; the models' parameters are not trained here
    (callers keep them frozen with ``requires_grad_(False)``).
    """
    return normalise_teachers(torch.stack([m(x).float() for m in models]), teacher_norm)


def weighted_logits(logits: Tensor, weights: Tensor) -> Tensor:
    """Eq. 2 as the authors compute it: ``sum_k w_k z_k / sum_k w_k`` for ``logits (n, N, C)``
    and ``weights (n,)``, or per-sample ``weights (n, N)`` (FedGO's ``w_k(x)``)."""
    if weights.ndim == 1:
        w = weights.to(logits.dtype).view(-1, 1, 1)
        total = weights.sum().to(logits.dtype).clamp_min(MIN_WEIGHT_SUM)
        return (w * logits).sum(0) / total
    if weights.shape != logits.shape[:2]:
        raise ValueError(
            f"per-sample weights must be (n, N) = {tuple(logits.shape[:2])}, "
            f"got {tuple(weights.shape)}"
        )
    w = weights.to(logits.dtype).unsqueeze(-1)
    return (w * logits).sum(0) / w.sum(0).clamp_min(MIN_WEIGHT_SUM)


def weight_step(
    weights: Tensor,
    logits: Tensor,
    labels: Tensor,
    step: float,
    multipliers: Tensor | None = None,
) -> Tensor:
    """One update of the ensemble weights, eq. 12: ``clip(w - step * sign(grad_w L_w), 0, 1)``.

    ``L_w`` is eq. 11's cross-entropy of the weighted ensemble (:func:`weighted_logits`) on a
    labelled synthetic batch; ``logits`` are the members' logits on it ``(n, N, C)`` (computed
    once, without gradients: only ``w`` is differentiated). With per-sample ``multipliers``
    ``(n, N)`` (FedGO's odds weights, :func:`fedgo_multipliers`) member ``k`` weighs
    ``w_k m_k(x)`` on sample ``x``. Returns new weights; the input is not modified. ``step`` is
    ``mu`` (paper 0.1 / n) times the per-epoch decay.
    """
    w = weights.detach().clone().requires_grad_(True)
    mixed = w if multipliers is None else w[:, None] * multipliers.detach()
    loss = F.cross_entropy(weighted_logits(logits.detach(), mixed), labels)
    (grad,) = torch.autograd.grad(loss, w)
    return (weights.detach() - step * grad.sign()).clamp(0.0, 1.0)


def fedgo_multipliers(disc_logits: Tensor, sizes: Tensor, mode: str = "double_sigmoid") -> Tensor:
    """FedGO's per-sample weights ``n_k Phi_k(x) / sum_i n_i Phi_i(x)`` ``(n, N)`` (FedGO,
    Jang et al. ICML 2025, Thm 3.6 Eq. (9)) from discriminator logits ``(n, N)``.

    Computed as a softmax over clients of ``log n_k + log Phi_k(x)``
    (:func:`fedgo_flwr.weighting.log_discriminator_odds`): stable for any logit and
    differentiable in ``x``, so the generator and the diversification step see the weights
    change with the sample. Equal to :func:`fedgo_flwr.weighting.compute_weights` ``("fedgo")``.
    """
    log_phi = log_discriminator_odds(disc_logits.float(), mode)
    log_n = sizes.to(log_phi).log().view(-1, 1)
    return torch.softmax(log_n + log_phi, dim=0)


# ---------------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------------


def hard_cross_entropy(logits: Tensor, labels: Tensor, exponent: float = 1.0) -> Tensor:
    """``L_H`` of eq. 6: mean over the batch of ``d(x)^exponent * CE(A_w(x), y)`` with the
    difficulty ``d(x) = 1 - softmax(A_w(x))_y`` of eq. 5 (GHM, Li et al. 2019) detached, as in
    the authors' code (``exponent`` is their ``--hs``, 1 by default). ``exponent = 0`` is the
    plain cross-entropy of eq. 3."""
    ce = F.cross_entropy(logits, labels, reduction="none")
    if exponent == 0:
        return ce.mean()
    p_true = F.softmax(logits, dim=1).gather(1, labels.view(-1, 1)).squeeze(1)
    return ((1.0 - p_true).detach().pow(exponent) * ce).mean()


def adversarial_kl(
    student_logits: Tensor,
    teacher_logits: Tensor,
    temperature: float = 1.0,
    mask: bool = False,
) -> Tensor:
    """``L_A`` of eq. 7: minus the batch mean of ``T^2 KL(softmax(A_w/T) || softmax(f_S/T))``.

    Minimising it pushes the generator towards samples where student and ensemble disagree.
    Paper: ``T = 1``; the authors' code: ``T = 3``. ``mask``: DENSE's variant, counting only
    the samples whose arg-max differs between student and ensemble (the mean stays over the
    whole batch, as in the DENSE code).
    """
    t = float(temperature)
    log_q = F.log_softmax(student_logits / t, dim=1)
    p = F.softmax(teacher_logits / t, dim=1)
    per_sample = F.kl_div(log_q, p, reduction="none").sum(1) * (t * t)
    if mask:
        per_sample = per_sample * (student_logits.argmax(1) != teacher_logits.argmax(1)).float()
    return -per_sample.mean()


def kd_loss(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 4.0) -> Tensor:
    """Eq. 4 as the authors' ``KLDiv(T)``: ``T^2 KL(softmax(t/T) || softmax(s/T))``, batch mean."""
    t = float(temperature)
    log_q = F.log_softmax(student_logits / t, dim=1)
    p = F.softmax(teacher_logits.detach() / t, dim=1)
    return F.kl_div(log_q, p, reduction="batchmean") * (t * t)


class BNStatistics:
    """DeepInversion's batch-norm statistics loss (Yin et al., CVPR 2020, eq. 4) over models.

    Forward hooks on every ``BatchNorm2d`` of ``models`` record, for the current forward pass,
    ``||mean(x) - running_mean||_2 + ||var(x) - running_var||_2`` of the layer's input;
    :meth:`loss` is their sum over the layers of a model, averaged over the models (the authors'
    ``sum(h.r_feature) / len(models)``). :attr:`layers` is 0 for models without batch norm
    (e.g. ``cnn5``), and the loss is then 0. Call :meth:`remove` when done.
    """

    def __init__(self, models: Sequence[nn.Module]) -> None:
        self.models = len(models)
        self._values: list[Tensor] = []
        self._handles = [
            m.register_forward_hook(self._hook)
            for model in models
            for m in model.modules()
            if isinstance(m, nn.BatchNorm2d)
        ]

    @property
    def layers(self) -> int:
        return len(self._handles)

    def _hook(self, module: nn.Module, inputs: tuple[Tensor, ...], _out: Tensor) -> None:
        x = inputs[0]
        mean = x.mean(dim=(0, 2, 3))
        var = x.permute(1, 0, 2, 3).reshape(x.shape[1], -1).var(dim=1, unbiased=False)
        assert isinstance(module, nn.BatchNorm2d)
        self._values.append(
            torch.norm(module.running_var - var, 2) + torch.norm(module.running_mean - mean, 2)
        )

    def reset(self) -> None:
        self._values = []

    def loss(self) -> Tensor:
        """The loss of the forward passes since the last :meth:`reset`."""
        if not self._values:
            return torch.zeros(())
        return torch.stack(self._values).sum() / max(self.models, 1)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def image_prior_losses(x: Tensor) -> tuple[Tensor, Tensor]:
    """DeepInversion's image priors: total variation (mean squared neighbour differences,
    as ``get_image_prior_losses`` in the authors' code) and the L2 norm of the batch."""
    dh = x[:, :, 1:, :] - x[:, :, :-1, :]
    dw = x[:, :, :, 1:] - x[:, :, :, :-1]
    tv = dh.pow(2).mean() + dw.pow(2).mean() if x.shape[2] > 1 and x.shape[3] > 1 else x.sum() * 0
    return tv, x.pow(2).mean()


# ---------------------------------------------------------------------------------------------
# Diversification
# ---------------------------------------------------------------------------------------------


def diversify(
    x: Tensor,
    ensemble: Callable[[Tensor], Tensor],
    epsilon: float,
    rng: torch.Generator,
    variant: str = "paper",
    temperature: float = 4.0,
) -> Tensor:
    """Eq. 10: one output-diversified step (ODS, Tashiro et al. 2020) on a batch of model inputs.

    ``paper``: ``x + eps * g / ||g||_2`` per sample, ``g = grad_x u^T A_w(x)`` on the logits.
    ``code`` (the authors' ``cb_kd_train``): ``x + eps * sign(grad_x sum u * softmax(A_w(x)/T))``,
    an L-infinity step of ``eps`` on every input value. ``u ~ U[-1, 1]^C`` is drawn per sample
    from ``rng`` at every call, so each use of a pool image is a fresh perturbation. ``eps = 0``
    returns ``x`` unchanged. A sample whose gradient is zero is left unchanged.
    """
    if variant not in DIVERSIFY_VARIANTS:
        raise ValueError(f"unknown diversification {variant!r}; choose one of {DIVERSIFY_VARIANTS}")
    if epsilon == 0:
        return x.detach()
    xg = x.detach().clone().requires_grad_(True)
    out = ensemble(xg)
    u = (torch.rand(out.shape, generator=rng) * 2.0 - 1.0).to(out.device)
    if variant == "code":
        target = (u * F.softmax(out / temperature, dim=1)).sum()
    else:
        target = (u * out).sum()
    (grad,) = torch.autograd.grad(target, xg)
    if variant == "code":
        step = grad.sign()
    else:
        norms = grad.flatten(1).norm(dim=1).view(-1, *([1] * (grad.ndim - 1)))
        step = torch.where(norms > 0, grad / norms.clamp_min(1e-30), torch.zeros_like(grad))
    return (x.detach() + epsilon * step).detach()


# ---------------------------------------------------------------------------------------------
# Synthetic pool
# ---------------------------------------------------------------------------------------------


class SyntheticPool:
    """The growing synthetic set ``D_S`` (Alg. 1 line 10): every epoch's batch, all history.

    Images are stored as ``uint8`` ``(N, C, H, W)`` in ``[0, 255]`` (``round(255 x)`` of the
    generator's ``[0, 1]`` output, as the authors' PNG round trip) with their sampled labels.
    """

    def __init__(self, image_shape: Sequence[int], num_classes: int, flip: bool) -> None:
        self.image_shape = tuple(int(s) for s in image_shape)
        self.num_classes = int(num_classes)
        self.flip = bool(flip)
        self._x: list[np.ndarray] = []
        self._y: list[np.ndarray] = []
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def add(self, images: Tensor, labels: Tensor) -> None:
        """Append a batch of images in ``[0, 1]`` ``(b, C, H, W)`` with labels ``(b,)``."""
        if tuple(images.shape[1:]) != self.image_shape or images.shape[0] != labels.shape[0]:
            raise ValueError(
                f"pool batch must be (b, {self.image_shape}) with b labels, got "
                f"{tuple(images.shape)} and {tuple(labels.shape)}"
            )
        q = (images.detach().float().clamp(0, 1) * 255.0).round().to(torch.uint8).cpu().numpy()
        self._x.append(q)
        self._y.append(labels.detach().cpu().numpy().astype(np.int64))
        self._size += int(labels.shape[0])

    def dataset(self) -> ArrayDataset:
        """The pool as an :class:`ArrayDataset` (read by :func:`fedgo_flwr.data.batches`)."""
        if not self._size:
            raise ValueError("the synthetic pool is empty")
        return ArrayDataset(
            x=np.concatenate(self._x),
            y=np.concatenate(self._y),
            num_classes=self.num_classes,
            flip=self.flip,
        )

    def batches(
        self, batch_size: int, rng: torch.Generator, augment: bool, device: torch.device
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """One shuffled pass over the pool in model-input ``(x, y)`` batches."""
        return batches(
            self.dataset(), batch_size, shuffle=True, rng=rng, augment=augment, device=device
        )

    def state_dict(self) -> dict[str, Any]:
        data = self.dataset() if self._size else None
        return {
            "x": None if data is None else data.x,
            "y": None if data is None else data.y,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._x, self._y, self._size = [], [], 0
        if state.get("x") is not None:
            x, y = np.asarray(state["x"], dtype=np.uint8), np.asarray(state["y"], dtype=np.int64)
            if tuple(x.shape[1:]) != self.image_shape or x.shape[0] != y.shape[0]:
                raise ValueError(
                    f"pool state has shape {x.shape}, expected (N, {self.image_shape})"
                )
            self._x, self._y, self._size = [x], [y], int(y.shape[0])


# ---------------------------------------------------------------------------------------------
# Synthesis
# ---------------------------------------------------------------------------------------------


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
) -> SynthesisResult:
    """Synthesise one labelled batch against the weighted ensemble and the student (Alg. 1, 5-9).

    Labels are drawn uniformly over the classes; latent codes ``z ~ N(0, I)`` (or, for
    ``pixels``, the images' logits ``~ N(0, 1)``, squashed by a sigmoid so images stay in
    ``[0, 1]`` as the generator's). Every step computes the loss on the current images, keeps
    them if it is the lowest so far (the authors' ``best_inputs``), then takes the Adam step.
    The client models and the student are frozen and in eval mode during synthesis (the
    generator trains in train mode: its batch norm uses batch statistics); ``bn_weight > 0``
    hooks :class:`BNStatistics` on the client models for the duration of the call.
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
    if best_images is None:  # no step's loss was a finite number (NaN < inf is false)
        raise FloatingPointError(
            f"synthesis: the loss was not finite in any of its {settings.steps} steps (last: "
            f"{last_loss}); the ensemble's logits on the synthetic batch are not finite "
            "numbers (a client model that produces them should have been left out: "
            "fedgo_flwr.distill.teacher_logits_problem)"
        )
    return SynthesisResult(
        images=best_images,
        labels=labels.detach().cpu(),
        best_loss=best_loss,
        last_loss=last_loss,
        terms=best_terms,
    )


# ---------------------------------------------------------------------------------------------
# The epoch loop
# ---------------------------------------------------------------------------------------------

ORDERS = ("paper", "code")
"""When the ensemble weights are updated: after the epoch's batch joined the pool, on
diversified batches (Alg. 1 lines 10-13), or before, on the old pool as it is, from the second
epoch on (the authors' ``synthesize``)."""


@dataclass
class BoostSettings:
    """Everything of an epoch after synthesis (Alg. 1 lines 10-18).

    ``reweight`` (EE), ``mu`` (``None``: 0.1 / n, paper Sec. 4.1), ``mu_decay`` (0.99 per epoch,
    the code's ``wdc``), ``order`` (:data:`ORDERS`). ``diversify`` (DHS), ``variant``,
    ``epsilon`` (8/255), ``diversify_temperature`` (the code variant's softmax temperature 4).
    Distillation (eq. 4): ``temperature`` 4, SGD ``lr`` 0.01, ``momentum`` 0.9,
    ``weight_decay`` 1e-4, cosine-annealed over the run's epochs (the code), ``grad_clip`` 10,
    ``batch_size`` 128, one shuffled pass over the pool per epoch; ``augment``: random
    horizontal flips of pool images where the data set allows them.
    """

    reweight: bool = True
    mu: float | None = None
    mu_decay: float = 0.99
    order: str = "paper"
    diversify: bool = True
    variant: str = "paper"
    epsilon: float = 8 / 255
    diversify_temperature: float = 4.0
    temperature: float = 4.0
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 1e-4
    grad_clip: float = 10.0
    batch_size: int = 128
    augment: bool = True

    def check(self, c: Checker) -> None:
        if self.mu is not None:
            c.require("mu", self.mu > 0, "must be > 0 (or null: 0.1 / number of clients)")
        c.require("mu_decay", 0 < self.mu_decay <= 1, "must be in (0, 1]")
        c.choice("order", ORDERS)
        c.choice("variant", DIVERSIFY_VARIANTS)
        c.require("epsilon", self.epsilon >= 0, "must be >= 0")
        c.require("diversify_temperature", self.diversify_temperature > 0, "must be > 0")
        c.require("temperature", self.temperature > 0, "must be > 0")
        c.require("lr", self.lr > 0, "must be > 0")
        c.require("momentum", 0 <= self.momentum < 1, "must be in [0, 1)")
        c.require("weight_decay", self.weight_decay >= 0, "must be >= 0")
        c.require("grad_clip", self.grad_clip >= 0, "must be >= 0 (0: no clipping)")
        c.require("batch_size", self.batch_size >= 1, "must be >= 1")


class DataFreeDistillation:
    """The server's loop of Co-Boosting (Alg. 1) and its data-free peers, one epoch per call.

    Holds the frozen client models, their weights ``w`` (``1/n`` to start), the generator, the
    pool, the student and its optimiser, and one seeded ``torch.Generator`` for everything
    random. :meth:`state_dict` / :meth:`load_state_dict` capture all of it, so a run resumed
    after any epoch continues exactly as an uninterrupted one.
    """

    def __init__(
        self,
        models: Sequence[nn.Module],
        student: nn.Module,
        synthesis: SynthesisSettings,
        boost: BoostSettings,
        *,
        num_classes: int,
        image_shape: Sequence[int],
        flip: bool,
        rng: torch.Generator,
        device: torch.device,
        epochs: int,
        nz: int = 256,
        ngf: int = 64,
        sample_weights: Callable[[Tensor], Tensor] | None = None,
        teacher_norm: str = "none",
    ) -> None:
        if not models:
            raise ValueError("data-free distillation needs at least one client model")
        if boost.order not in ORDERS:
            raise ValueError(f"unknown order {boost.order!r}; choose one of {ORDERS}")
        self.models = [m.to(device).eval().requires_grad_(False) for m in models]
        self.student = student.to(device)
        self.synthesis = synthesis
        self.boost = boost
        self.num_classes = int(num_classes)
        self.image_shape = tuple(int(s) for s in image_shape)
        self.device = device
        self.rng = rng
        self.nz = int(nz)
        n = len(self.models)
        self.weights = torch.full((n,), 1.0 / n)
        self.mu = boost.mu if boost.mu is not None else 0.1 / n
        self.generator: Generator | None = None
        if synthesis.source == "generator":
            self.generator = Generator(self.image_shape, nz=nz, ngf=ngf).to(device)
            reset_generator(self.generator, rng)
        self.pool = SyntheticPool(self.image_shape, self.num_classes, flip)
        self.optimizer = torch.optim.SGD(
            self.student.parameters(),
            lr=boost.lr,
            momentum=boost.momentum,
            weight_decay=boost.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
            self.optimizer, T_max=max(int(epochs), 1)
        )
        self.epoch = 0
        self.sample_weights = sample_weights
        self.teacher_norm = teacher_norm

    # -- pieces ----------------------------------------------------------------------------
    def ensemble(self, x: Tensor, weights: Tensor | None = None) -> Tensor:
        """``A_w(x)`` under the current (or given) weights, times the per-sample multipliers
        ``m_k(x)`` when the engine has them (FedGO's odds: member ``k`` weighs ``w_k m_k(x)``)."""
        w = (self.weights if weights is None else weights).to(x.device)
        if self.sample_weights is not None:
            w = w[:, None] * self.sample_weights(x)
        return weighted_logits(member_logits(self.models, x, self.teacher_norm), w)

    def step_size(self) -> float:
        """``mu * mu_decay ** epoch``: this epoch's weight step."""
        return self.mu * self.boost.mu_decay**self.epoch

    def _diversified(self, x: Tensor) -> Tensor:
        if not self.boost.diversify:
            return x
        return diversify(
            x,
            self.ensemble,
            self.boost.epsilon,
            self.rng,
            variant=self.boost.variant,
            temperature=self.boost.diversify_temperature,
        )

    def reweight_pass(self, diversified: bool) -> int:
        """One weight step (eq. 12) per pool batch; returns the number of steps."""
        steps, step = 0, self.step_size()
        for x, y in self.pool.batches(
            self.boost.batch_size, self.rng, self.boost.augment, self.device
        ):
            if diversified:
                x = self._diversified(x)
            with torch.no_grad():
                logits = member_logits(self.models, x, self.teacher_norm)
                mult = None if self.sample_weights is None else self.sample_weights(x).cpu()
            self.weights = weight_step(self.weights, logits.cpu(), y.cpu(), step, mult)
            steps += 1
        return steps

    def distill_pass(self) -> tuple[float, int]:
        """One pass of the student over the (diversified) pool; mean KD loss and steps."""
        self.student.train()
        total, count, steps = 0.0, 0, 0
        for x, _y in self.pool.batches(
            self.boost.batch_size, self.rng, self.boost.augment, self.device
        ):
            x = self._diversified(x)
            with torch.no_grad():
                t_out = self.ensemble(x)
            loss = kd_loss(self.student(x), t_out, self.boost.temperature)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if self.boost.grad_clip > 0:
                nn.utils.clip_grad_norm_(self.student.parameters(), self.boost.grad_clip)
            self.optimizer.step()
            total += float(loss.item()) * x.shape[0]
            count += x.shape[0]
            steps += 1
        return total / max(count, 1), steps

    # -- the epoch -------------------------------------------------------------------------
    def run_epoch(self) -> dict[str, float]:
        """Alg. 1, one epoch: synthesise, grow the pool, re-weight, distil. Returns its stats."""
        start = time.perf_counter()
        result = synthesize(
            self.models,
            self.weights,
            self.student,
            self.synthesis,
            num_classes=self.num_classes,
            image_shape=self.image_shape,
            rng=self.rng,
            device=self.device,
            generator=self.generator,
            nz=self.nz,
            sample_weights=self.sample_weights,
            teacher_norm=self.teacher_norm,
        )
        synth_time = time.perf_counter() - start
        start = time.perf_counter()
        weight_steps = 0
        if self.boost.reweight and self.boost.order == "code" and self.epoch > 0:
            weight_steps = self.reweight_pass(diversified=False)
        self.pool.add(result.images, result.labels)
        if self.boost.reweight and self.boost.order == "paper":
            weight_steps = self.reweight_pass(diversified=True)
        weight_time = time.perf_counter() - start
        start = time.perf_counter()
        kd, kd_steps = self.distill_pass()
        self.scheduler.step()
        kd_time = time.perf_counter() - start
        self.epoch += 1
        stats = {
            "epoch": float(self.epoch),
            "pool_size": float(len(self.pool)),
            "synthesis_loss": result.best_loss,
            "synthesis_time": synth_time,
            "weight_steps": float(weight_steps),
            "weight_time": weight_time,
            "distill_loss": kd,
            "distill_steps": float(kd_steps),
            "distill_time": kd_time,
        }
        stats.update({f"synthesis_{k}": v for k, v in result.terms.items()})
        return stats

    # -- resume ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "weights": self.weights.clone(),
            "pool": self.pool.state_dict(),
            "student": {k: v.detach().cpu().clone() for k, v in self.student.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "generator": None
            if self.generator is None
            else {k: v.detach().cpu().clone() for k, v in self.generator.state_dict().items()},
            "rng": self.rng.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.weights = torch.as_tensor(state["weights"], dtype=torch.float32).clone()
        self.pool.load_state_dict(state["pool"])
        self.student.load_state_dict(state["student"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.generator is not None and state.get("generator") is not None:
            self.generator.load_state_dict(state["generator"])
        self.rng.set_state(state["rng"])
