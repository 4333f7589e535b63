"""Parameter aggregation and client-reply checks (NumPy/PyTorch, no Flower types).

Arrays are plain ``dict[str, np.ndarray]`` here; strategies convert from and to Flower's
``ArrayRecord`` at their edge. Averages accumulate in extended precision and are cast back to
each array's own dtype (integer buffers such as BatchNorm's ``num_batches_tracked`` are rounded).

Besides FedAvg's n_k-weighted mean (:class:`RunningAverage`) there are robust rules a user can
turn on for every parameter-averaging strategy (``strategy.aggregation``,
:class:`AggregationConfig`): the coordinate-wise median and trimmed mean of the round's client
models (:func:`coordinate_median`, :func:`trimmed_mean`; Yin et al., "Byzantine-Robust
Distributed Learning: Towards Optimal Statistical Rates", ICML 2018, Sec. 3-4) and the clipping
of each client's update to a norm bound before any rule (:func:`clip_update`; Sun et al., "Can
You Really Backdoor Federated Learning?", 2019, Sec. 4 "norm thresholding").
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fedgo_flwr.schema import Checker

Arrays = Mapping[str, np.ndarray]

log = logging.getLogger(__name__)

AGGREGATION_RULES: tuple[str, ...] = ("mean", "median", "trimmed_mean")
"""``mean``: FedAvg's n_k-weighted mean (streams); ``median`` / ``trimmed_mean``: unweighted,
coordinate-wise over the round's client models (keep every reply of the round in memory)."""


@dataclass
class AggregationConfig:
    """How the round's client models become one (``strategy.aggregation.<key>`` in YAML).

    ``rule``: one of :data:`AGGREGATION_RULES`. ``trim_fraction``: the share ``beta`` of the
    replies dropped at each end of every coordinate by ``trimmed_mean`` (``floor(beta * m)`` of
    ``m`` replies; Yin et al. need ``beta`` above the share of bad clients). ``clip_norm``: the
    L2 bound on each client's update ``y_k - x`` (every floating array of the model), applied
    before the rule; ``null``: no clipping. The defaults (``mean``, no clipping) are FedAvg's
    aggregation, bit for bit.
    """

    rule: str = "mean"
    trim_fraction: float = 0.2
    clip_norm: float | None = None

    def check(self, c: Checker) -> None:
        c.choice("rule", AGGREGATION_RULES)
        c.require("trim_fraction", 0 <= self.trim_fraction < 0.5, "must be in [0, 0.5)")
        if self.clip_norm is not None:
            c.require(
                "clip_norm",
                math.isfinite(self.clip_norm) and self.clip_norm > 0,
                "must be a finite number > 0 (or null: no clipping)",
            )

    def trimmed(self, replies: int) -> int:
        """How many of ``replies`` ``trimmed_mean`` drops at each end of a coordinate."""
        return trim_count(replies, self.trim_fraction)


class RunningAverage:
    """``sum_k w_k a_k / sum_k w_k``, accumulated one array set at a time.

    Memory is one model's worth of accumulators, whatever the number of clients, so a server
    can fold each reply in as it arrives and let it go. Sums are kept in ``np.longdouble``
    (80-bit on x86-64 Linux; float64 elsewhere), so the result, cast back to each array's dtype,
    does not depend on the order the replies arrived in except in rare last-bit cases.
    """

    def __init__(self) -> None:
        self.sums: dict[str, np.ndarray] | None = None
        self.like: dict[str, np.ndarray] = {}
        self.total = 0.0
        self.count = 0

    def add(self, arrays: Arrays, weight: float) -> None:
        w = float(weight)
        if not np.isfinite(w) or w < 0:
            raise ValueError(f"weight must be finite and non-negative, got {weight}")
        if self.sums is None:
            self.like = {k: np.asarray(v) for k, v in arrays.items()}
            self.sums = {k: np.zeros(np.shape(v), dtype=np.longdouble) for k, v in arrays.items()}
        elif set(arrays) != set(self.sums):
            raise ValueError("array sets have different keys")
        for key, acc in self.sums.items():
            acc += np.longdouble(w) * np.asarray(arrays[key], dtype=np.longdouble)
        self.total += w
        self.count += 1

    def result(self) -> dict[str, np.ndarray]:
        if self.sums is None:
            raise ValueError("nothing to average: no arrays")
        if self.total <= 0:
            raise ValueError("weights must not all be zero")
        total = np.longdouble(self.total)
        return {k: _cast_like(acc / total, self.like[k]) for k, acc in self.sums.items()}


class ReplyStack:
    """The round's client models kept whole, for the rules that cannot stream.

    The coordinate-wise median and trimmed mean need every reply of a coordinate at once, so
    memory grows with the number of replies (``K`` models), unlike :class:`RunningAverage`.
    Weights are checked as there but not used: both rules are unweighted (:func:`robust_average`).
    """

    def __init__(self, rule: str, trim_fraction: float = 0.0) -> None:
        if rule not in ("median", "trimmed_mean"):
            raise ValueError(f"ReplyStack takes median or trimmed_mean, not {rule!r}")
        self.rule = rule
        self.trim_fraction = trim_fraction
        self.replies: list[Arrays] = []

    @property
    def count(self) -> int:
        return len(self.replies)

    def add(self, arrays: Arrays, weight: float) -> None:
        w = float(weight)
        if not np.isfinite(w) or w < 0:
            raise ValueError(f"weight must be finite and non-negative, got {weight}")
        if self.replies and set(arrays) != set(self.replies[0]):
            raise ValueError("array sets have different keys")
        self.replies.append(arrays)

    def result(self) -> dict[str, np.ndarray]:
        if self.rule == "median":
            return coordinate_median(self.replies)
        m = len(self.replies)
        if m and self.trim_fraction > 0 and trim_count(m, self.trim_fraction) == 0:
            log.warning(
                "trimmed_mean trims nothing: floor(%g * %d replies) = 0; this round is the "
                "unweighted mean",
                self.trim_fraction,
                m,
            )
        return trimmed_mean(self.replies, self.trim_fraction)


def new_average(config: AggregationConfig) -> RunningAverage | ReplyStack:
    """An empty accumulator for ``config.rule`` (``add(arrays, weight)``, ``result()``)."""
    if config.rule == "mean":
        return RunningAverage()
    return ReplyStack(config.rule, config.trim_fraction)


def trim_count(replies: int, trim_fraction: float) -> int:
    """``floor(trim_fraction * replies)`` (``1e-9`` guards ``0.3 * 10 = 2.9999...``)."""
    return int(math.floor(trim_fraction * replies + 1e-9))


def _stacked(arrays: Sequence[Arrays]) -> dict[str, np.ndarray]:
    """``key -> (m, ...)`` float64 stacks of ``m`` array sets with equal keys and shapes."""
    if not arrays:
        raise ValueError("nothing to aggregate: no arrays")
    keys = set(arrays[0])
    for a in arrays[1:]:
        if set(a) != keys:
            raise ValueError("array sets have different keys")
    return {k: np.stack([np.asarray(a[k], dtype=np.float64) for a in arrays]) for k in arrays[0]}


def coordinate_median(arrays: Sequence[Arrays]) -> dict[str, np.ndarray]:
    """The coordinate-wise median of ``m`` array sets, unweighted (Yin et al. 2018, Alg. 1,
    option I).

    Unweighted on purpose: the median's guarantee is in clients (it stays within the honest
    values while fewer than half of the ``m`` replies are bad, whatever they send); weighting
    by n_k would let one client holding more than half of the round's data be the median
    alone. An even ``m`` takes the mean of the two middle values. Each result is cast back to
    its array's dtype (integer buffers are rounded).
    """
    return {
        k: _cast_like(np.median(stack, axis=0), np.asarray(arrays[0][k]))
        for k, stack in _stacked(arrays).items()
    }


def trimmed_mean(arrays: Sequence[Arrays], trim_fraction: float) -> dict[str, np.ndarray]:
    """The coordinate-wise ``beta``-trimmed mean of ``m`` array sets, unweighted (Yin et al.
    2018, Alg. 1, option II).

    For every coordinate the ``b = floor(beta * m)`` largest and ``b`` smallest values are
    dropped and the other ``m - 2b`` averaged with equal weights (unweighted for the reason
    :func:`coordinate_median` gives). ``beta = trim_fraction`` in ``[0, 0.5)``; with ``b = 0``
    it is the plain unweighted mean.
    """
    if not 0 <= trim_fraction < 0.5:
        raise ValueError(f"trim_fraction must be in [0, 0.5), got {trim_fraction}")
    out = {}
    for key, stack in _stacked(arrays).items():
        m = stack.shape[0]
        b = trim_count(m, trim_fraction)
        kept = np.sort(stack, axis=0)[b : m - b]
        out[key] = _cast_like(kept.mean(axis=0), np.asarray(arrays[0][key]))
    return out


def _deltas(arrays: Arrays, reference: Arrays) -> dict[str, np.ndarray]:
    """``arrays - reference`` in extended precision, for every floating array."""
    out = {}
    for key, ref in reference.items():
        value = np.asarray(arrays[key])
        if np.issubdtype(value.dtype, np.floating):
            out[key] = value.astype(np.longdouble) - np.asarray(ref, dtype=np.longdouble)
    return out


def _norm(deltas: Mapping[str, np.ndarray]) -> np.longdouble:
    """The L2 norm of all ``deltas`` together, scaled by their largest entry so that no
    square overflows (or underflows) whatever the values' range."""
    peak = max((np.abs(d).max(initial=0) for d in deltas.values()), default=np.longdouble(0))
    if peak == 0:
        return np.longdouble(0)
    total = sum(np.square(d / peak).sum() for d in deltas.values())
    return peak * np.sqrt(np.longdouble(total))


def update_norm(arrays: Arrays, reference: Arrays) -> float:
    """``||arrays - reference||_2`` over every floating array (integer buffers left out)."""
    return float(_norm(_deltas(arrays, reference)))


def clip_update(
    arrays: Arrays, reference: Arrays, clip_norm: float
) -> tuple[dict[str, np.ndarray], bool]:
    """``x + (y - x) * min(1, clip_norm / ||y - x||)``, and whether it clipped.

    Norm clipping of a client's update ``y - x`` against the round's global model ``x``
    (Sun et al. 2019, Sec. 4): a client that scales its update up (model replacement,
    Bagdasaryan et al., AISTATS 2020) moves the average by at most ``clip_norm`` times its
    weight. The norm and the scaling cover every floating array (parameters and BatchNorm
    statistics alike) and a clipped array takes the global model's dtype; integer buffers are
    left as received. An update within the bound is returned unchanged (the same arrays).
    """
    if not (math.isfinite(clip_norm) and clip_norm > 0):
        raise ValueError(f"clip_norm must be a finite number > 0, got {clip_norm}")
    deltas = _deltas(arrays, reference)
    norm = _norm(deltas)
    if norm <= clip_norm:
        return dict(arrays), False
    scale = np.longdouble(clip_norm) / norm
    out = {}
    for key, value in arrays.items():
        value = np.asarray(value)
        if key in deltas:
            x = np.asarray(reference[key], dtype=np.longdouble)
            out[key] = _cast_like(x + deltas[key] * scale, np.asarray(reference[key]))
        else:
            out[key] = value
    return out, True


def weighted_average(arrays: Sequence[Arrays], weights: Sequence[float]) -> dict[str, np.ndarray]:
    """``sum_k w_k a_k / sum_k w_k`` key by key (FedAvg, McMahan et al. 2017, Alg. 1)."""
    if not arrays:
        raise ValueError("nothing to average: no arrays")
    if len(arrays) != len(weights):
        raise ValueError(f"{len(arrays)} array sets but {len(weights)} weights")
    w = np.asarray(weights, dtype=np.float64)
    if np.any(w < 0) or not np.isfinite(w).all() or w.sum() <= 0:
        raise ValueError(f"weights must be finite, non-negative and not all zero: {weights}")
    avg = RunningAverage()
    for a, wk in zip(arrays, w, strict=True):
        avg.add(a, wk)
    return avg.result()


def _cast_like(value: np.ndarray, like: np.ndarray) -> np.ndarray:
    # np.asarray: arithmetic on a 0-d array (BatchNorm's num_batches_tracked) gives a NumPy
    # scalar, which torch.from_numpy and Flower's Array do not take.
    if np.issubdtype(like.dtype, np.integer):
        return np.asarray(np.rint(value).astype(like.dtype))
    return np.asarray(value.astype(like.dtype))


def check_arrays(
    received: Arrays, reference: Arrays, what: str = "arrays", of: str = "the global model"
) -> str | None:
    """Why ``received`` cannot be used in place of ``reference`` (``None`` if it can).

    ``what`` names the received arrays and ``of`` the reference in the message.

    Rejects missing or extra keys, wrong shapes, dtypes other than the reference's, and
    non-finite values. The dtype must match exactly: :class:`RunningAverage` casts the average
    back to the first reply's dtype, so one int8 or float64 reply would otherwise set the
    global model's dtype. Only real numbers (floating, signed or unsigned integer) are
    accepted: complex, boolean or object arrays are refused whatever the reference holds, so
    the finiteness check always sees every value.
    """
    missing = sorted(set(reference) - set(received))
    extra = sorted(set(received) - set(reference))
    if missing or extra:
        return f"{what}: keys differ from {of} (missing {missing[:3]}, extra {extra[:3]})"
    for key, ref in reference.items():
        value, ref = np.asarray(received[key]), np.asarray(ref)
        if value.shape != ref.shape:
            return f"{what}: '{key}' has shape {value.shape}, expected {ref.shape}"
        if value.dtype.kind not in _REAL_KINDS:
            return f"{what}: '{key}' has dtype {value.dtype.name}, not real numbers"
        if value.dtype != ref.dtype:
            return f"{what}: '{key}' has dtype {value.dtype.name}, expected {ref.dtype.name}"
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            return f"{what}: '{key}' holds non-finite values"
    return None


_REAL_KINDS = frozenset("fiu")  # NumPy dtype kinds: floating, signed and unsigned integer
