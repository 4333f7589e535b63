"""The weighted ensemble of the teachers' logits, its pseudo-labels, and caps on any share.

FedGO Alg. 1/2 pseudo-label a sample ``x`` with ``softmax(Σ_k w_k(x) f_k(x))`` (AVGLOGITS of
FedDF when ``w = 1/K``): :func:`ensemble_logits` is the one implementation of that sum
(distillation targets, pseudo-label diagnostics and ensemble evaluation all use it),
:func:`pseudo_labels` its softmax. :func:`cap_weights` bounds any one client's share of the
weights of :mod:`fedgo_flwr.weighting.methods` on each sample (opt-in), and
:func:`cap_mean_shares` its share averaged over the samples (on by default in every weighted
ensemble); both are robustness steps not in the paper.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from fedgo_flwr.weighting.methods import _positive_float

__all__ = [
    "MAX_SHARE_FACTOR",
    "SHARE_CAP_RULE",
    "cap_mean_shares",
    "cap_mean_shares_named",
    "cap_scalar_shares",
    "cap_weights",
    "check_weight_cap",
    "ensemble_logits",
    "mean_share_caps",
    "pseudo_labels",
    "share_cap_warning",
]

MAX_SHARE_FACTOR = 3.0
"""The factor of :func:`mean_share_caps`: no teacher's weight, averaged over the samples, above
``max(2 / K, 3 n_k / sum_i n_i)``, and with three or more teachers never above
``max(1/2, n_k / sum_i n_i)`` (:data:`SHARE_CAP_RULE`). Why 3: FedGO's optimal weights (Thm 3.4,
Eq. (8)) ``w_k(x) = pi_k p_k(x) / sum_i pi_i p_i(x)`` average to exactly
``pi_k = n_k / sum_i n_i`` over samples of the clients' mixture ``sum_i pi_i p_i``, so an honest
teacher's mean share is near its data share on data like the clients'; and the paper's
double-sigmoid odds lie in ``(1, e)``, so ``w_k(x) <= e n_k / (e n_k + sum_{i != k} n_i) <
e pi_k < 3 pi_k`` on every sample: the factor alone never binds on FedGO's default weights (the
half does, where one discriminator says "mine" on most samples and ``e pi_k / (e pi_k + 1 -
pi_k) > 1/2``). The cap binds where the odds are exact (``disc_mode: sigmoid``, DaFKD's
``domain``) or logit-based (``variance``, ``entropy``) and one teacher takes several times its
data share of every sample: a discriminator with a large bias says "mine" everywhere. Honest
DaFKD runs meet it too, where one client's domain discriminator claims most of the generated
distillation set (measured in benchmarks/studies/trust.md, "DaFKD's honest run meets the share
cap": no accuracy cost detected)."""

SHARE_CAP_RULE = "max(2/K, 3 n_k / sum n), at most max(1/2, n_k / sum n) with K >= 3"
"""How the WARNINGs of a capped share name the cap of :func:`mean_share_caps`."""

run_log = logging.getLogger("flwr")

# ------------------------------------------------------------------------------------------
# A cap on any one client's share
# ------------------------------------------------------------------------------------------


def check_weight_cap(cap: Any, num_teachers: int | None = None) -> float:
    """``cap`` as a float in ``(0, 1]`` such that ``cap * K >= 1``, else ``ValueError``.

    Below ``1 / K`` no weights can sum to one with every share at most ``cap``.
    """
    value = _positive_float("weight_cap", "cap", cap)
    if value > 1:
        raise ValueError(f"weight_cap must be in (0, 1], got {cap!r}")
    if num_teachers is not None and value * num_teachers < 1 - 1e-12:
        raise ValueError(
            f"weight_cap {value:g} is infeasible for {num_teachers} clients: cap * K must be "
            f">= 1 (at least {1 / num_teachers:.4g})"
        )
    return value


def cap_weights(weights: Tensor, cap: float) -> Tensor:
    """``weights`` (``(K, ...)``, summing to 1 over ``K``) with no share above ``cap``.

    A robustness post-processing step for any weighting: per sample, every client above
    ``cap`` is set to ``cap`` and the excess goes to the others in proportion to their weights
    (repeated until none is above; at most ``K`` passes), so the weights still sum to 1 and
    keep their order. Clients whose weights are all zero share what is left equally when the
    others cannot take it (e.g. single-sigmoid FedGO, where one client's huge discriminator
    logits underflow every other weight to 0). Why: with ``disc_mode: sigmoid`` the odds are
    ``exp(z)`` and one client that reports (or overfits to) huge logits takes weight 1.0 on
    every sample; a cap bounds the share any single teacher has in a pseudo-label. Columns
    already within the cap are returned unchanged (the same tensor if all are). Computed in
    float64; returned in ``weights``' dtype. ``cap * K < 1`` raises ``ValueError``.
    """
    k = weights.shape[0]
    cap = check_weight_cap(cap, k)
    if not bool((weights > cap).any()):
        return weights
    w = weights.to(torch.float64)
    fixed = torch.zeros_like(w, dtype=torch.bool)
    for _ in range(k):
        over = (w > cap) & ~fixed
        if not bool(over.any()):
            break
        fixed |= over
        w = torch.where(fixed, torch.full_like(w, cap), w)
        left = 1 - cap * fixed.sum(0, keepdim=True)  # mass for the free clients
        free_w = torch.where(fixed, torch.zeros_like(w), w)
        mass = free_w.sum(0, keepdim=True)
        free_count = (~fixed).sum(0, keepdim=True).clamp(min=1)
        share = torch.where(
            mass > 0, free_w * left / torch.where(mass > 0, mass, 1.0), left / free_count
        )
        w = torch.where(fixed, w, share)
    w = w.clamp(max=cap).to(weights.dtype)  # clamp: rounding of the last pass
    touched = fixed.any(0, keepdim=True)
    return torch.where(touched, w, weights)


def mean_share_caps(sizes: Tensor, factor: float = MAX_SHARE_FACTOR) -> Tensor:
    """``(K,)`` float64 caps on the mean shares of the teachers of sizes ``n`` ``(K,)``:
    ``min(1, max(2 / K, factor * pi_k))`` with ``pi_k = n_k / sum_i n_i``
    (:data:`MAX_SHARE_FACTOR`; ``n`` all 0: ``pi = 0``), and with ``K >= 3`` at most
    ``max(1/2, pi_k)``.

    The half: with three or more teachers no one of them holds a strict majority of the
    ensemble's weight, so the others together always weigh at least as much (the factor alone
    allows ``3/K``, a majority for ``K <= 5`` teachers of equal size, and the floor ``2/K`` one
    for ``K = 3``). A teacher that holds more than half of the data by the server's count keeps
    up to its data share, as in FedAvg's average. With two teachers no cap can keep either
    from half of the weight (``1/2`` is the least feasible cap, and it would only make the two
    mean shares equal), so there is none (1): :func:`share_cap_warning` says so at the start
    of such a run.
    """
    n = sizes.detach().to(torch.float64).cpu().clamp_min(0)
    k = n.numel()
    total = float(n.sum())
    pi = n / total if total > 0 else torch.zeros_like(n)
    caps = (factor * pi).clamp_min(2.0 / max(k, 1)).clamp_max(1.0)
    if k >= 3:
        caps = torch.minimum(caps, pi.clamp_min(0.5))
    return caps


def share_cap_warning(who: str, teachers: int) -> str | None:
    """The WARNING for a run whose ensembles have ``teachers`` teachers (``who``: the
    strategy), or ``None`` unless there are two: then no share cap can keep one client from
    half of the ensemble (:func:`mean_share_caps`)."""
    if teachers != 2:
        return None
    return (
        f"{who}: its ensembles have 2 teachers: no cap on a teacher's share can keep one "
        "client from half of an ensemble of two (a cap of 1/2 would only make both mean shares "
        "1/2), so there is none, and one client can decide every sample the two disagree on. "
        "Where clients are not trusted, use 3 or more (then no client's mean share exceeds 1/2 "
        "unless it holds more than half of the data)"
    )


def cap_mean_shares(weights: Tensor, caps: Tensor) -> tuple[Tensor, list[int]]:
    """``weights`` ``(K, ...)`` (summing to 1 over ``K`` at every sample) with no teacher's mean
    share over the samples above its cap ``caps`` ``(K,)``, and the teachers it scaled down.

    Each pass takes every teacher whose mean share ``m_k`` exceeds ``cap_k``, multiplies its
    weights by ``cap_k / m_k`` on every sample (so its mean share is exactly ``cap_k`` and its
    ranking of the samples is kept) and gives the removed weight of each sample to the
    teachers not yet scaled, in proportion to their weights there (equally where theirs are
    all 0); at most ``K`` passes, since a scaled teacher is not raised again. Every sample's
    weights still sum to 1. Why: a per-sample weighting lets one teacher take nearly every
    sample (a discriminator whose bias is large says "mine" everywhere); the cap bounds its
    say over the ensemble as a whole while leaving its ranking. No teacher above its cap:
    ``weights`` itself. The factors are computed without gradients and applied to
    ``weights``, so gradients flow through them (the synthesis of Co-Boosting + FedGO).
    """
    k = weights.shape[0]
    if caps.shape != (k,):
        raise ValueError(f"caps must have shape ({k},), got {tuple(caps.shape)}")
    if k == 0 or weights[0].numel() == 0:
        return weights, []
    flat = weights.reshape(k, -1)
    passes: list[tuple[Tensor, Tensor, Tensor]] = []  # (scaled rows, their factors, free rows)
    with torch.no_grad():
        w = flat.detach().to(torch.float64)
        cap = caps.detach().to(device=w.device, dtype=torch.float64)
        fixed = torch.zeros(k, dtype=torch.bool, device=w.device)
        for _ in range(k):
            shares = w.mean(1)
            over = (shares > cap * (1 + 1e-9)) & ~fixed
            if not bool(over.any()):
                break
            fixed = fixed | over
            if bool(fixed.all()):  # caps summing below 1: nothing can take the weight
                break
            step = (over, torch.where(over, cap / shares, torch.ones_like(shares)), ~fixed)
            passes.append(step)
            w = _rescaled(w, *step)
    if not passes:
        return weights, []
    out = flat.to(torch.float64)
    for step in passes:
        out = _rescaled(out, *step)
    capped = sorted({int(i) for over, _, _ in passes for i in torch.nonzero(over).flatten()})
    return out.to(weights.dtype).reshape(weights.shape), capped


def cap_mean_shares_named(
    weights: Tensor, sizes: Tensor, clients: Sequence[int], who: str, where: str
) -> Tensor:
    """:func:`cap_mean_shares` at the caps :func:`mean_share_caps` of the teachers' data sizes
    ``sizes`` ``(K,)``, with one WARNING per teacher it scaled down naming its client
    (``clients[k]``), the strategy ``who`` and the data ``where``."""
    caps = mean_share_caps(sizes)
    out, capped = cap_mean_shares(weights, caps)
    for k in capped:
        run_log.warning(
            "%s: the weights of client %d on %s: mean share above its cap %.3g (%s); scaled "
            "down to it",
            who,
            clients[k],
            where,
            float(caps[k]),
            SHARE_CAP_RULE,
        )
    return out


def cap_scalar_shares(weights: Tensor, caps: Tensor) -> tuple[Tensor, list[int]]:
    """Non-negative scalar ensemble weights ``weights`` ``(K,)`` (not normalised: the ensemble
    divides by their sum) with no teacher's share ``w_k / sum_i w_i`` above ``caps`` ``(K,)``,
    and the teachers it lowered.

    Only the weights above their cap are lowered, each to the value at which its share is
    exactly its cap (the others keep what they hold): with ``S`` the lowered teachers and
    ``R`` the sum of the others, ``w_k = cap_k R / (1 - sum_{i in S} cap_i)``, ``S`` grown
    until no share is above its cap (at most ``K`` passes). Where the others hold nothing
    (``R = 0``) there is nothing to compare against and they get an equal part instead, the
    smallest that meets the caps. ``S`` whose caps sum to 1 or more cannot all be above them
    (shares sum to 1), so the loop stops there. Within the caps: ``weights`` itself. Used on
    Co-Boosting's learned weights after every step of eq. 12, which bounds each ``w_k`` to
    ``[0, 1]`` but not its share.
    """
    k = weights.shape[0]
    if caps.shape != (k,):
        raise ValueError(f"caps must have shape ({k},), got {tuple(caps.shape)}")
    w = weights.detach().to(torch.float64).clamp_min(0)
    cap = caps.detach().to(torch.float64).cpu()
    total = float(w.sum())
    if k == 0 or total <= 0 or not bool((w / total > cap * (1 + 1e-6)).any()):
        return weights, []
    fixed = torch.zeros(k, dtype=torch.bool)
    for _ in range(k):
        total = float(w.sum())
        over = (w / total > cap * (1 + 1e-6)) & ~fixed
        if not bool(over.any()):
            break
        if float(cap[fixed | over].sum()) >= 1.0:
            break
        fixed |= over
        rest = float(w[~fixed].sum())
        if rest <= 0:  # the others hold nothing: give them an equal part
            held = float(w[fixed].sum())
            part = held * (1 - float(cap[fixed].sum())) / float(cap[fixed].sum())
            w = torch.where(fixed, w, torch.full_like(w, part / int((~fixed).sum())))
            rest = float(w[~fixed].sum())
        new_total = rest / (1 - float(cap[fixed].sum()))
        w = torch.where(fixed, cap * new_total, w)
    capped = [int(i) for i in torch.nonzero(fixed).flatten()]
    return w.to(weights.dtype).clamp(0.0, 1.0), capped


def _rescaled(w: Tensor, over: Tensor, factor: Tensor, free: Tensor) -> Tensor:
    """``w`` ``(K, M)`` with the ``over`` rows times ``factor`` and the weight they give up in
    every column spread over the ``free`` rows (in proportion to theirs; equally where they
    hold none); every other row as it is."""
    kept = w * torch.where(over, factor, torch.ones_like(factor))[:, None]
    removed = (w - kept).sum(0, keepdim=True)  # (1, M)
    free_w = w * free[:, None]
    mass = free_w.sum(0, keepdim=True)
    count = free.sum().clamp_min(1)
    share = torch.where(mass > 0, free_w / torch.where(mass > 0, mass, 1.0), free[:, None] / count)
    return kept + removed * share


# ------------------------------------------------------------------------------------------
# Ensemble and pseudo-labels
# ------------------------------------------------------------------------------------------


def _check_ensemble_shapes(logits: Tensor, weights: Tensor) -> None:
    """Raise ``ValueError`` unless ``weights`` is ``logits``' shape without its last axis."""
    if logits.dim() < 3:
        raise ValueError(f"logits must have shape (K, ..., N, C), got {tuple(logits.shape)}")
    if tuple(weights.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"weights must have shape {tuple(logits.shape[:-1])} to match logits "
            f"{tuple(logits.shape)}, got {tuple(weights.shape)} (shape mismatch)"
        )


def ensemble_logits(logits: Tensor, weights: Tensor) -> Tensor:
    """Return the weighted logit ensemble ``Σ_k w_k(x) f_k(x)``: ``(K, ..., N, C) -> (..., N, C)``.

    This is the argument of the softmax in FedGO Alg. 1/2 (AVGLOGITS of FedDF when ``w = 1/K``).
    ``logits`` is ``(K, N, C)``, or ``(K, V, N, C)`` with a leading view axis after ``K`` (the
    augmentation views of :mod:`fedgo_flwr.learning.distill`); ``weights`` has the same shape
    without ``C``. The result has the promoted floating dtype of both (at least float32). The one
    implementation of the ensemble: distillation targets, pseudo-label diagnostics and
    ensemble evaluation all use it.
    """
    _check_ensemble_shapes(logits, weights)
    dtype = torch.promote_types(torch.promote_types(logits.dtype, weights.dtype), torch.float32)
    w = weights.to(device=logits.device, dtype=dtype)
    return (w.unsqueeze(-1) * logits.to(dtype)).sum(0)


def pseudo_labels(logits: Tensor, weights: Tensor, temperature: float = 1.0) -> Tensor:
    """Return the pseudo-label distribution ``softmax(Σ_k w_k(x) f_k(x) / T)``: ``(..., N, C)``.

    FedGO Alg. 1/2: ``ỹ(u) = σ(Σ_k w_k(u) f(u; θ_k))``; the paper uses ``T = 1`` (no temperature,
    like FedDF). Shapes as :func:`ensemble_logits`. Rows sum to 1.
    """
    tau = _positive_float("pseudo_labels", "temperature", temperature)
    return torch.softmax(ensemble_logits(logits, weights) / tau, dim=-1)
