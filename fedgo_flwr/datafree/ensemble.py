"""The weighted ensemble ``A_w`` of the clients' models, its weights and its diversification.

Co-Boosting (Dai et al., ICLR 2024) distils ``A_w(x) = sum_k w_k f_k(x) / sum_k w_k`` (eq. 2,
:func:`weighted_logits`, divided by ``sum_k w_k`` as the authors' ``WEnsemble``), learns ``w``
by signed-gradient steps (eqs. 11-12, :func:`weight_step`) and perturbs its inputs towards
diverse ensemble outputs (eq. 10, :func:`diversify`). FedGO's per-sample odds weights enter as
multipliers of ``w`` (:func:`fedgo_multipliers`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedgo_flwr.learning.distill import normalise_teachers
from fedgo_flwr.weighting import log_discriminator_odds

__all__ = [
    "DIVERSIFY_VARIANTS",
    "diversify",
    "fedgo_multipliers",
    "member_logits",
    "weight_step",
    "weighted_logits",
]

DIVERSIFY_VARIANTS = ("paper", "code")
"""Eq. 10 as printed, or the authors' sign step on softmax at temperature 4."""
MIN_WEIGHT_SUM = 1e-12
"""Floor of ``sum_k w_k`` in :func:`weighted_logits`: if every weight was clipped to 0 the
ensemble outputs zero logits (uniform predictions) instead of dividing by zero."""


# ---------------------------------------------------------------------------------------------
# Ensemble
# ---------------------------------------------------------------------------------------------


def member_logits(models: Sequence[nn.Module], x: Tensor, teacher_norm: str = "none") -> Tensor:
    """Every client model's logits on ``x``: ``(n, N, C)``, float32, under ``teacher_norm``
    (:func:`fedgo_flwr.learning.distill.normalise_teachers` over the batch ``x``; ``none``: as they
    are).

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
