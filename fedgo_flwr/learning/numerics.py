"""What the aggregation rules share below :mod:`fedgo_flwr.learning.aggregation`: the lower
median, the cast back to an array's own dtype, and a round's replies kept whole."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def lower_median(values: Sequence[float]) -> float:
    """The lower median of ``values``: the ``ceil(m / 2)``-th smallest of ``m``.

    The lower rather than the mean of the two middle values, so that of two uploads the
    larger cannot set it: with one honest and one huge norm the mean of the two would be
    half the huge one, and no bound relative to it would ever bind.
    """
    if not len(values):
        raise ValueError("the median of no values")
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


def cast_like(value: np.ndarray, like: np.ndarray) -> np.ndarray:
    """``value`` cast to ``like``'s dtype (integers rounded), as an array."""
    # np.asarray: arithmetic on a 0-d array (BatchNorm's num_batches_tracked) gives a NumPy
    # scalar, which torch.from_numpy and Flower's Array do not take.
    if np.issubdtype(like.dtype, np.integer):
        return np.asarray(np.rint(value).astype(like.dtype))
    return np.asarray(value.astype(like.dtype))


class KeptReplies:
    """A round's replies kept whole with their weights and clients, for the combinations that
    need them all at once: ``add(arrays, weight, client)`` checks the weight (finite, ``>= 0``)
    and that every reply has the same keys; ``count`` is how many were added."""

    def __init__(self) -> None:
        self.replies: list[Mapping[str, np.ndarray]] = []
        self.weights: list[float] = []
        self.clients: list[Any] = []

    @property
    def count(self) -> int:
        return len(self.replies)

    def add(self, arrays: Mapping[str, np.ndarray], weight: float, client: Any = None) -> None:
        w = float(weight)
        if not np.isfinite(w) or w < 0:
            raise ValueError(f"weight must be finite and non-negative, got {weight}")
        if self.replies and set(arrays) != set(self.replies[0]):
            raise ValueError("array sets have different keys")
        self.replies.append(arrays)
        self.weights.append(w)
        self.clients.append(len(self.clients) if client is None else client)
