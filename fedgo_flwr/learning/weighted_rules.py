"""Weighted coordinate-wise median and trimmed mean, for rules whose weights are the method.

The robust rules of :mod:`fedgo_flwr.learning.aggregation` are unweighted on purpose (their
guarantee is in clients). A strategy whose aggregation *is* its weights, FedDisco's
discrepancy-aware ``p_k``, needs the robust rules with those weights: each client then counts
by its weight, as in the weighted mean, but no single client moves a coordinate further than
the weight it holds lets it. Values are taken in float64 and cast back to each array's dtype.

- :func:`weighted_median`: per coordinate, the value at which the cumulative weight of the
  sorted values first reaches half of the total; where it reaches exactly half, the mean of
  that value and the next (so equal weights give :func:`numpy.median`, the unweighted rule).
  A client with more than half of the weight is the median alone: the rule bounds clients
  whose weight is below half.
- :func:`weighted_trimmed_mean`: per coordinate, the ``b = floor(beta m)`` smallest and ``b``
  largest of the ``m`` values are cut off, as in the unweighted rule (Yin et al. 2018, Alg. 1,
  option II), and the rest averaged by their weights. The cut is by count, not by weight: a
  cut of ``beta`` of the *weight* at each end leaves a client whose weight is above ``beta``
  the excess of it at its extreme value, and one value 49 model norms away then moves the
  mean by that excess times 49 norms (measured with FedDisco in the adversary profile,
  ``benchmarks/studies/trust.md``). Cut by count, one bad client among ``m >= 3`` with ``b >= 1``
  never has a value outside the honest range in the mean. Equal weights give the unweighted
  ``beta``-trimmed mean.

Replies of weight 0 have no say and are left out before either rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fedgo_flwr.learning.aggregation import (
    AggregationConfig,
    Arrays,
    ReplyStack,
    RunningAverage,
    _cast_like,
    _stacked,
    trim_count,
)

__all__ = ["WeightedReplyStack", "new_weighted_average", "weighted_median", "weighted_trimmed_mean"]


def _checked(arrays: Sequence[Arrays], weights: Sequence[float]) -> tuple[list[Arrays], np.ndarray]:
    """The replies with a positive weight and those weights, after the checks."""
    if len(arrays) != len(weights):
        raise ValueError(f"{len(arrays)} array sets but {len(weights)} weights")
    w = np.asarray(weights, dtype=np.float64)
    if not np.isfinite(w).all() or (w < 0).any():
        raise ValueError(f"weights must be finite and non-negative, got {list(weights)}")
    keep = [i for i in range(len(w)) if w[i] > 0]
    if not keep:
        raise ValueError("weights must not all be zero")
    return [arrays[i] for i in keep], w[keep]


def _sorted(stack: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``stack`` ``(m, ...)`` sorted along the replies, and the weights in the same order."""
    order = np.argsort(stack, axis=0, kind="stable")
    shape = (len(w),) + (1,) * (stack.ndim - 1)
    weights = np.broadcast_to(w.reshape(shape), stack.shape)
    return np.take_along_axis(stack, order, 0), np.take_along_axis(weights, order, 0)


def weighted_median(arrays: Sequence[Arrays], weights: Sequence[float]) -> dict[str, np.ndarray]:
    """The coordinate-wise weighted median of the array sets ``arrays`` (module docstring)."""
    arrays, w = _checked(arrays, weights)
    half = w.sum() / 2
    out = {}
    for key, stack in _stacked(arrays).items():
        values, ws = _sorted(stack, w)
        cum = np.cumsum(ws, axis=0)
        reached = cum >= half * (1 - 1e-12)
        pos = np.argmax(reached, axis=0)[None]
        low = np.take_along_axis(values, pos, 0)[0]
        nxt = np.take_along_axis(values, np.minimum(pos + 1, len(w) - 1), 0)[0]
        exact = np.isclose(np.take_along_axis(cum, pos, 0)[0], half, rtol=1e-12, atol=0)
        out[key] = _cast_like(np.where(exact, (low + nxt) / 2, low), np.asarray(arrays[0][key]))
    return out


def weighted_trimmed_mean(
    arrays: Sequence[Arrays], weights: Sequence[float], trim_fraction: float
) -> dict[str, np.ndarray]:
    """The coordinate-wise trimmed mean of ``arrays``: the ``floor(beta m)`` smallest and
    largest values cut by count, the rest averaged by ``weights`` (module docstring); ``beta
    = trim_fraction`` in ``[0, 0.5)``."""
    if not (math.isfinite(trim_fraction) and 0 <= trim_fraction < 0.5):
        raise ValueError(f"trim_fraction must be in [0, 0.5), got {trim_fraction}")
    arrays, w = _checked(arrays, weights)
    m = len(w)
    b = trim_count(m, trim_fraction)
    out = {}
    for key, stack in _stacked(arrays).items():
        values, ws = _sorted(stack, w)
        kept, kw = values[b : m - b], ws[b : m - b]  # every weight > 0 (_checked)
        mean = (kw * kept).sum(axis=0) / kw.sum(axis=0)
        out[key] = _cast_like(mean, np.asarray(arrays[0][key]))
    return out


class WeightedReplyStack(ReplyStack):
    """:class:`~fedgo_flwr.learning.aggregation.ReplyStack` whose median and trimmed mean take
    the weights the replies were added with (:func:`weighted_median`,
    :func:`weighted_trimmed_mean`)."""

    def result(self) -> dict[str, np.ndarray]:
        if self.rule == "median":
            return weighted_median(self.replies, self.weights)
        return weighted_trimmed_mean(self.replies, self.weights, self.trim_fraction)


def new_weighted_average(config: AggregationConfig) -> RunningAverage | WeightedReplyStack:
    """:func:`~fedgo_flwr.learning.aggregation.new_average` for a strategy whose weights are its
    method: the weighted mean, or the weighted median / trimmed mean of ``config.rule``."""
    if config.rule == "mean":
        return RunningAverage()
    return WeightedReplyStack(config.rule, config.trim_fraction)
