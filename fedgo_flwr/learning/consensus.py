"""The consensus rule: each array of each update weighed by how far it points along the round's
coordinate-wise median update of that array, and clipped relative to the round
(``strategy.aggregation.rule: consensus``).

A client model ``y_k`` sent back for the global model ``x`` is the update ``d_k = y_k - x``, and
``d_k^a`` its part in array ``a`` (a layer's weight, its bias). The rule is FLTrust's aggregation
(Cao, Fang, Liu, Gong, "FLTrust: Byzantine-robust Federated Learning via Trust Bootstrapping",
NDSS 2021, Sec. IV, Eq. 3-5), applied to each array on its own, with four changes that let it
run without a server data set, keep FedAvg's weighting and bound a scaled model:

- the trusted reference ``g_0`` is the round's coordinate-wise median update ``med^a`` (Yin et
  al., ICML 2018), not an update the server trains on its own clean data;
- a client's trust score in array ``a`` is ``t_k^a = clip(cos(d_k^a, med^a) / (f c^a), 0, 1)``,
  where ``c^a`` is the round's lower median of those cosines and ``f`` = :data:`TRUST_FRACTION`
  (1/2), instead of FLTrust's ``ReLU(cos)``: a client pointing at least half as well along the
  median as the middle client counts in full, so honest replies keep their weights, and one
  pointing away from it (a sign-flipped update) or far less along it than the others counts
  for less or nothing;
- each ``d_k^a`` is clipped to ``consensus_clip`` times the round's lower median of
  ``||d_k^a||`` (``strategy.aggregation.consensus_clip``, default 2) instead of FLTrust's
  rescaling to ``||g_0||``: the median of several update vectors is much shorter than each of
  them when the clients disagree, and scaling to it would shrink honest rounds;
- before any of this, the *radial* part of each update, ``r_k^a = d_k^a . x^a / ||x^a||`` (how
  far it scales the array it started from), is clipped to ``radial_clip`` times the round's
  lower median of ``|r_k^a|`` (``strategy.aggregation.radial_clip``, default 8):
  ``d_k^a <- d_k^a - (r_k^a - clip(r_k^a)) x^a / ||x^a||``. Honest updates are mostly
  orthogonal to the weights, while a scaled model ``y = x - c x`` (the freeze attack, kept
  under ``update_bound``) is all radial; without this clip the rule trusted it: one extreme
  value in every coordinate moves the coordinate-wise median one rank its way, so the median
  update itself points partly along ``-x^a``, and the scaled model, clipped to twice a typical
  norm, shrank every array by its share in every round. Honest radial parts are spread wide
  (one of a round can be tens of times the lower median), so the factor is looser than
  ``consensus_clip``; its choice and cost are measured in
  ``benchmarks/results/robust-rule-cost/`` ("The radial clip"). Arrays at 0 (``||x^a|| = 0``)
  and uploads that are updates already (no reference) have no radial part;

and then combines with the strategy's weights ``w_k`` (FedAvg's ``n_k``):

    x'^a = x^a + sum_k w_k t_k^a d_k^a min(1, consensus_clip m^a / ||d_k^a||) / sum_k w_k t_k^a

(``d_k^a`` after its radial clip).

Per array, not over the whole model, because a whole-model cosine and norm let an update
concentrated on a few coordinates through: the coordinate-wise median of diverse updates is
short and dominated by its coherent coordinates (the biases), so a whole-model budget spent on
one class's bias scored a trust of 0.28 in the adversary profile's round 1 and took the model to
chance; per array it is clipped to twice a typical bias update. One client, whatever it sends,
then moves each array of the average by at most ``consensus_clip`` typical updates of that array
times its weight share, scales it by at most ``radial_clip`` typical radial parts times that
share, and moves it in full only in a direction whose cosine with the median is at least half
the middle client's: what it can still do is push within that cone (an attacker that knows
the rule aims there). What it costs honest runs, and what it stops, are measured in
``benchmarks/results/robust-rule-cost/`` ("The consensus rule"). Arrays that are not floating
(BatchNorm's counters) take the weighted mean of the models, as FedAvg's. Where no update of an
array has a positive score (every cosine 0 or below, or a zero median), that array takes the
round's median update. A client's recorded trust is the mean of its arrays' scores.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedgo_flwr.learning.numerics import KeptReplies, lower_median
from fedgo_flwr.learning.numerics import cast_like as _cast_like

Arrays = Mapping[str, np.ndarray]

__all__ = ["TRUST_FRACTION", "ConsensusStack", "Scores", "clip_radial", "consensus_mean"]

TRUST_FRACTION = 0.5
"""A client whose cosine with an array's median update is at least this fraction of the
round's lower median cosine counts in full (``t = 1``); below it, in proportion, down to 0.
Chosen on the tuning seeds (``benchmarks/results/robust-rule-cost/``, "The consensus rule"):
with 1 (the middle client's cosine) about half of the honest replies weighed less every round,
which cost the main job at Dirichlet alpha 0.1 on every report seed."""


@dataclass(frozen=True)
class Scores:
    """Per client, in the order of the models: its trust score (the mean over its arrays), its
    whole update's norm and whether any of its arrays was clipped."""

    trust: np.ndarray
    norms: np.ndarray
    clipped: np.ndarray


def clip_radial(
    d: np.ndarray, base: np.ndarray, factor: float | None
) -> tuple[np.ndarray, np.ndarray]:
    """``d`` (a row per client's update of the array ``base``) with each row's radial part
    ``r_k = d_k . base / ||base||`` clipped to ``factor`` times the lower median of ``|r_k|``
    (module docstring), and which rows were clipped. Unchanged where ``base`` is 0 or
    ``factor`` is ``None``."""
    length = float(np.linalg.norm(base))
    if factor is None or length == 0 or not math.isfinite(length):
        return d, np.zeros(len(d), bool)
    unit = base / length
    r = d @ unit
    bound = factor * lower_median(np.abs(r).tolist())
    kept = np.clip(r, -bound, bound)
    hit = np.abs(r) > bound
    if not hit.any():
        return d, hit
    return d - np.outer(r - kept, unit), hit


def _combine(
    d: np.ndarray, w: np.ndarray, clip_factor: float | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rule on one array's updates ``d`` (a row per client, radial parts clipped already):
    the combined update, the clients' trust scores and which of them were clipped."""
    norms = np.linalg.norm(d, axis=1)
    median = np.median(d, axis=0)
    median_norm = float(np.linalg.norm(median))
    if median_norm > 0:
        cos = np.where(norms > 0, d @ median / (np.where(norms > 0, norms, 1.0) * median_norm), 0.0)
    else:
        cos = np.zeros(len(d))
    c = lower_median(cos.tolist())
    c *= TRUST_FRACTION
    trust = np.clip(cos / c, 0.0, 1.0) if c > 0 else np.clip(cos, 0.0, 1.0)
    if clip_factor is None:
        scale = np.ones(len(d))
    else:
        bound = clip_factor * lower_median(norms.tolist())
        scale = np.where(norms > bound, bound / np.where(norms > 0, norms, 1.0), 1.0)
    mass = w * trust
    if mass.sum() > 0 and math.isfinite(float(mass.sum())):
        return ((mass * scale)[:, None] * d).sum(axis=0) / mass.sum(), trust, scale < 1
    return median, trust, scale < 1


def consensus_mean(
    models: Sequence[Arrays],
    weights: Sequence[float],
    reference: Arrays | None,
    clip_factor: float | None = 2.0,
    radial_clip: float | None = 8.0,
) -> tuple[dict[str, np.ndarray], Scores]:
    """The consensus rule's combination of ``models`` (module docstring) against ``reference``
    (the model the clients were sent; ``None``: the uploads are updates already, e.g. SCAFFOLD's
    control deltas), with the strategy's ``weights``, each array of each update clipped to
    ``clip_factor`` times the round's lower median norm of that array's updates, and before that
    its radial part to ``radial_clip`` times the lower median radial part (:func:`clip_radial`;
    ``None``: not clipped); returns it and the clients' :class:`Scores` (``norms``: before any
    clipping)."""
    if not models:
        raise ValueError("nothing to aggregate: no arrays")
    if len(weights) != len(models):
        raise ValueError(f"{len(models)} models but {len(weights)} weights")
    w = np.asarray(weights, dtype=np.float64)
    if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"weights must be finite, non-negative and not all 0, got {weights}")
    m = len(models)
    out: dict[str, np.ndarray] = {}
    trust, clipped, squares = np.zeros(m), np.zeros(m, bool), np.zeros(m)
    floating = 0
    for k, v in models[0].items():
        like = np.asarray(v)
        stack = np.stack([np.asarray(a[k], dtype=np.float64).ravel() for a in models])  # (m, size)
        if not np.issubdtype(like.dtype, np.floating):  # BatchNorm's counters: FedAvg's mean
            out[k] = _cast_like(np.tensordot(w / w.sum(), stack, axes=1).reshape(like.shape), like)
            continue
        base = np.asarray(reference[k], dtype=np.float64).ravel() if reference is not None else 0.0
        d = stack - base
        squares += np.square(d).sum(axis=1)
        radial = np.zeros(m, bool)
        if reference is not None:
            d, radial = clip_radial(d, base, radial_clip)
        combined, t, hit = _combine(d, w, clip_factor)
        out[k] = _cast_like((base + combined).reshape(like.shape), like)
        trust += t
        clipped |= hit | radial
        floating += 1
    trust = trust / floating if floating else np.ones(m)
    return out, Scores(trust, np.sqrt(squares), clipped)


class ConsensusStack(KeptReplies):
    """The round's models kept whole for :func:`consensus_mean` (it needs every update at once),
    with their weights and clients; ``add(arrays, weight, client)`` and ``result()`` as the
    other accumulators. After :meth:`result`, ``trust`` maps each client to its score, ``norms``
    to its whole update's norm, and ``clipped`` lists the clients with an array clipped."""

    def __init__(
        self,
        reference: Mapping[str, np.ndarray] | None,
        clip_factor: float | None = 2.0,
        radial_clip: float | None = 8.0,
    ) -> None:
        super().__init__()
        self.reference = reference
        self.clip_factor = clip_factor
        self.radial_clip = radial_clip
        self.trust: dict[Any, float] = {}
        self.norms: dict[Any, float] = {}
        self.clipped: list[Any] = []

    def result(self) -> dict[str, np.ndarray]:
        """The rule over the kept replies in their clients' order, not their arrival order:
        the sums round the same whatever order the replies came in (a deployment's order is
        the network's)."""
        order = sorted(
            range(self.count), key=lambda i: (str(type(self.clients[i])), self.clients[i])
        )
        replies = [self.replies[i] for i in order]
        weights = [self.weights[i] for i in order]
        clients = [self.clients[i] for i in order]
        out, scores = consensus_mean(
            replies, weights, self.reference, self.clip_factor, self.radial_clip
        )
        self.trust = dict(zip(clients, scores.trust.tolist(), strict=True))
        self.norms = dict(zip(clients, scores.norms.tolist(), strict=True))
        self.clipped = [c for c, hit in zip(clients, scores.clipped, strict=True) if hit]
        return out
