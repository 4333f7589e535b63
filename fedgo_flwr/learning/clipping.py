"""The streaming mean with each client's update clipped relative to its round.

A client model ``y_k`` sent back for the global model ``x`` is the update ``d_k = y_k - x``. Under
``strategy.aggregation.rule: mean`` (FedAvg's average; the default rule is ``consensus``,
:mod:`fedgo_flwr.learning.consensus`) every parameter-averaging strategy clips each update to
``c`` times the round's (lower) median update norm before FedAvg's n_k-weighted mean
(``strategy.aggregation.clip_factor``, :data:`DEFAULT_CLIP_FACTOR`):

    tau = c * median_k ||d_k||,    y_k' = x + d_k * min(1, tau / ||d_k||).

This is norm clipping (Sun et al., "Can You Really Backdoor Federated Learning?", 2019, Sec. 4)
with the threshold taken from the round itself, as ``upload_bound`` does for the other uploads
(:func:`fedgo_flwr.learning.aggregation.bound_uploads`): honest updates of one round are of one
scale (the largest ratio to the median measured in honest runs is in
``benchmarks/studies/trust.md``, "Honest ratios under the reply bounds"), so a bound a few
times the median never meets them, and one client can move the average by at most ``c``
typical updates times its weight, whatever direction it picks (a sign-flipped or scaled
update, a bias on one class). The median is the
*lower* median, which one client out of two cannot set (:func:`lower_median`).

**Streaming.** The median is only known once the round's last reply is in, but the mean is
folded in one reply at a time (the server holds one model's worth of sums, whatever the number
of clients). :class:`ClippedMean` therefore adds every reply unclipped and keeps the ``keep``
replies with the largest update norms (:data:`DEFAULT_CLIP_KEEP`); at the end it subtracts
``w_k (1 - s_k) d_k`` from the sums for each kept reply above ``tau``, which is exactly the
clipped reply's contribution. If more than ``keep`` replies exceed ``tau`` (more outliers than
it kept), the bound is raised to the ``(keep + 1)``-th largest norm, so that every reply above
the bound in force is one it kept, and a WARNING says so. The result depends on the set of
replies only, not on their order. When no update exceeds the bound, the result is FedAvg's mean
bit for bit (nothing is subtracted).
"""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedgo_flwr.learning.aggregation import (
    DEFAULT_CLIP_FACTOR,
    DEFAULT_CLIP_KEEP,
    AggregationConfig,
    Arrays,
    ReplyStack,
    RunningAverage,
    lower_median,
    new_average,
    upload_norm,
)
from fedgo_flwr.learning.consensus import ConsensusStack
from fedgo_flwr.learning.weighted_rules import new_weighted_average

run_log = logging.getLogger("flwr")

__all__ = [
    "DEFAULT_CLIP_FACTOR",
    "DEFAULT_CLIP_KEEP",
    "ArrayOutlier",
    "ClippedMean",
    "ClippedUpdate",
    "array_outliers",
    "array_update_norms",
    "round_average",
]


@dataclass(frozen=True)
class ClippedUpdate:
    """One update that :class:`ClippedMean` clipped: whose, its norm, the round's median, the
    bound it was brought down to."""

    client: Any
    norm: float
    median: float
    bound: float
    factor: float

    @property
    def ratio(self) -> float:
        return self.norm / self.median if self.median > 0 else math.inf

    def message(self, what: str) -> str:
        return (
            f"{what}: the update of client {self.client} has norm {self.norm:.3g}, "
            f"{self.ratio:.3g} x the round's median {self.median:.3g}, above "
            f"strategy.aggregation.clip_factor = {self.factor:g}; clipped to {self.bound:.3g}"
        )


class ClippedMean:
    """The n_k-weighted mean of a round's client models, each update clipped to ``factor``
    times the round's lower median update norm against ``reference`` (the model the clients
    were sent); streams (:mod:`fedgo_flwr.learning.clipping`).

    ``add(arrays, weight, client)`` and ``result()`` as :class:`RunningAverage`; ``factor``
    ``None``: no clipping (the plain mean), the norms are still measured. After
    :meth:`result`: ``clipped`` lists the clipped updates, ``norms`` maps each client to its
    update norm.
    """

    def __init__(
        self, reference: Arrays, factor: float | None, keep: int, what: str = "update"
    ) -> None:
        if factor is not None and not (math.isfinite(factor) and factor >= 1):
            raise ValueError(f"clip factor must be a finite number >= 1, got {factor}")
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.reference = reference
        self.factor = factor
        self.keep = keep
        self.what = what
        self.mean = RunningAverage()
        self.norms: dict[Any, float] = {}
        # min-heap of the `keep` largest: (norm, arrival index, client, arrays, weight)
        self._largest: list[tuple[float, int, Any, Arrays, float]] = []
        self.clipped: list[ClippedUpdate] = []

    @property
    def count(self) -> int:
        return self.mean.count

    def add(self, arrays: Arrays, weight: float, client: Any = None) -> None:
        index = self.mean.count
        self.mean.add(arrays, weight)
        norm = float(upload_norm(arrays, self.reference))
        name = index if client is None else client
        self.norms[name] = norm
        if self.factor is None:
            return
        entry = (norm, -index, name, arrays, float(weight))
        if len(self._largest) < self.keep:
            heapq.heappush(self._largest, entry)
        elif norm > self._largest[0][0]:
            heapq.heapreplace(self._largest, entry)

    def ratio_max(self) -> tuple[float, Any]:
        """The largest ratio of an update norm to the round's lower median, and its client."""
        return ratio_max(self.norms)

    def result(self) -> dict[str, np.ndarray]:
        self.clipped = []
        if not self.norms:
            return self.mean.result()
        norms = sorted(self.norms.values(), reverse=True)
        median = lower_median(norms)
        if self.factor is None:
            return self.mean.result()
        bound = self.factor * median
        above = sum(1 for n in norms if n > bound)
        if above > self.keep:
            run_log.warning(
                "%s: %d updates exceed strategy.aggregation.clip_factor = %g times the round's "
                "median norm %.3g, more than clip_keep = %d; clipped to the %d-th largest norm "
                "%.3g instead",
                self.what,
                above,
                self.factor,
                median,
                self.keep,
                self.keep + 1,
                norms[self.keep],
            )
            bound = norms[self.keep]
        sums = self.mean.sums
        assert sums is not None
        for norm, _, client, arrays, weight in sorted(self._largest, reverse=True):
            if norm <= bound:
                continue
            shrink = np.longdouble(weight) * (1 - np.longdouble(bound) / np.longdouble(norm))
            for key, acc in sums.items():
                value = np.asarray(arrays[key])
                if np.issubdtype(value.dtype, np.floating):
                    delta = value.astype(np.longdouble) - np.asarray(
                        self.reference[key], dtype=np.longdouble
                    )
                    acc -= shrink * delta
            self.clipped.append(ClippedUpdate(client, norm, median, bound, self.factor))
        for c in self.clipped:
            run_log.warning(c.message(self.what))
        self._largest = []  # let the kept models go
        return self.mean.result()


def ratio_max(norms: Mapping[Any, float]) -> tuple[float, Any]:
    """The largest ratio of a client's update norm in ``norms`` to their lower median, and its
    client (``nan, None`` for none)."""
    if not norms:
        return math.nan, None
    median = lower_median(list(norms.values()))
    client, norm = max(norms.items(), key=lambda kv: (kv[1], str(kv[0])))
    return (norm / median if median > 0 else (1.0 if norm == 0 else math.inf)), client


def round_average(
    config: AggregationConfig, reference: Mapping[str, np.ndarray] | None, what: str = "update"
) -> ClippedMean | RunningAverage | ReplyStack | ConsensusStack:
    """The accumulator of a round's client models under ``strategy.aggregation`` (``config``):
    with ``rule: mean`` and the model the clients were sent (``reference``), a
    :class:`ClippedMean` at ``clip_factor``; else :func:`new_average`'s (the median and
    trimmed mean, weighted by the replies' weights with ``config.weighted``:
    :func:`~fedgo_flwr.learning.weighted_rules.new_weighted_average`; a plain mean where there
    is no reference, e.g. a model trained from scratch; ``consensus``:
    :class:`~fedgo_flwr.learning.consensus.ConsensusStack` against ``reference``)."""
    if config.rule == "consensus":
        return new_average(config, reference or None)
    if config.rule != "mean" and config.weighted:
        return new_weighted_average(config)
    if config.rule != "mean" or not reference:
        return new_average(config)
    return ClippedMean(reference, config.clip_factor, config.clip_keep, what)


@dataclass(frozen=True)
class ArrayOutlier:
    """A model of :func:`array_outliers`: its index, its largest ratio and the array that has
    it."""

    index: int
    ratio: float
    key: str


def array_update_norms(
    models: list[Arrays] | tuple[Arrays, ...], reference: Arrays
) -> dict[str, list[float]]:
    """``key -> [||y_k^a - x^a|| for each model]`` over the floating arrays of ``reference``."""
    out: dict[str, list[float]] = {}
    for k, v in reference.items():
        if np.issubdtype(np.asarray(v).dtype, np.floating):
            x = np.asarray(v, dtype=np.float64)
            out[k] = [float(np.linalg.norm(np.asarray(m[k], dtype=np.float64) - x)) for m in models]
    return out


def array_outliers(
    models: list[Arrays] | tuple[Arrays, ...], reference: Arrays, factor: float
) -> list[ArrayOutlier]:
    """The models of a round that have an array whose update ``d_k^a = y_k^a - x^a`` is longer
    than ``factor`` times the round's lower median ``m^a`` of ``||d_j^a||`` (floating arrays
    only), with their largest ratio ``||d_k^a|| / m^a`` (infinite where ``m^a`` is 0: at most
    one model moved that array, and any move is beyond the bound).

    For the ensembles of client models (FedDF's family): a model whose update puts many
    typical updates into one array (the whole norm budget on one class's bias, a scaled
    layer) is not what honest training of one round gives, and as a teacher it steers the
    pseudo-labels whatever its logit scale. Per array for the reason the consensus rule is
    (:mod:`fedgo_flwr.learning.consensus`): a whole-model norm lets an update concentrated
    on a few coordinates through. Fewer than three models name none: the lower median of
    two is the smaller, which either of them sets (a model that moves only one array sets every
    other array's median to 0)."""
    if len(models) < 3:
        return []
    norms = array_update_norms(models, reference)
    medians = {k: lower_median(v) for k, v in norms.items()}
    out: list[ArrayOutlier] = []
    for i in range(len(models)):
        over = [k for k in norms if norms[k][i] > factor * medians[k]]
        if over:
            ratio, worst = max(
                (norms[k][i] / medians[k] if medians[k] > 0 else math.inf, k) for k in over
            )
            out.append(ArrayOutlier(i, ratio, worst))
    return out
