"""Parameter aggregation and client-reply checks (NumPy/PyTorch, no Flower types).

Arrays are plain ``dict[str, np.ndarray]`` here; strategies convert from and to Flower's
``ArrayRecord`` at their edge. Averages accumulate in float64 and are cast back to each array's
own dtype (integer buffers such as BatchNorm's ``num_batches_tracked`` are rounded).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

Arrays = Mapping[str, np.ndarray]


def weighted_average(arrays: Sequence[Arrays], weights: Sequence[float]) -> dict[str, np.ndarray]:
    """``sum_k w_k a_k / sum_k w_k`` key by key (FedAvg, McMahan et al. 2017, Alg. 1)."""
    if not arrays:
        raise ValueError("nothing to average: no arrays")
    if len(arrays) != len(weights):
        raise ValueError(f"{len(arrays)} array sets but {len(weights)} weights")
    w = np.asarray(weights, dtype=np.float64)
    if np.any(w < 0) or not np.isfinite(w).all() or w.sum() <= 0:
        raise ValueError(f"weights must be finite, non-negative and not all zero: {weights}")
    w = w / w.sum()
    out: dict[str, np.ndarray] = {}
    for key, first in arrays[0].items():
        acc = np.zeros(first.shape, dtype=np.float64)
        for a, wk in zip(arrays, w, strict=True):
            acc += wk * np.asarray(a[key], dtype=np.float64)
        out[key] = _cast_like(acc, first)
    return out


def _cast_like(value: np.ndarray, like: np.ndarray) -> np.ndarray:
    if np.issubdtype(like.dtype, np.integer):
        return np.rint(value).astype(like.dtype)
    return value.astype(like.dtype)


def check_arrays(received: Arrays, reference: Arrays, what: str = "arrays") -> str | None:
    """Why ``received`` cannot be used in place of ``reference`` (``None`` if it can).

    Rejects missing or extra keys, wrong shapes, and non-finite values.
    """
    missing = sorted(set(reference) - set(received))
    extra = sorted(set(received) - set(reference))
    if missing or extra:
        return (
            f"{what}: keys differ from the global model (missing {missing[:3]}, extra {extra[:3]})"
        )
    for key, ref in reference.items():
        value = np.asarray(received[key])
        if value.shape != ref.shape:
            return f"{what}: '{key}' has shape {value.shape}, expected {ref.shape}"
        if np.issubdtype(value.dtype, np.floating) and not np.isfinite(value).all():
            return f"{what}: '{key}' holds non-finite values"
    return None
