"""Parameter aggregation and client-reply checks (NumPy/PyTorch, no Flower types).

Arrays are plain ``dict[str, np.ndarray]`` here; strategies convert from and to Flower's
``ArrayRecord`` at their edge. Averages accumulate in extended precision and are cast back to
each array's own dtype (integer buffers such as BatchNorm's ``num_batches_tracked`` are rounded).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

Arrays = Mapping[str, np.ndarray]


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


def check_arrays(received: Arrays, reference: Arrays, what: str = "arrays") -> str | None:
    """Why ``received`` cannot be used in place of ``reference`` (``None`` if it can).

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
        return (
            f"{what}: keys differ from the global model (missing {missing[:3]}, extra {extra[:3]})"
        )
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
