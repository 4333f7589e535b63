"""Small numerics the aggregation rules share: the lower median and the cast back to an
array's own dtype."""

from __future__ import annotations

from collections.abc import Sequence

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
