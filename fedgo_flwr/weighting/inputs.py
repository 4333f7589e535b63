"""What a weighting method may look at: :class:`WeightingInputs`, validated on construction.

One round's teachers' logits ``(K, N, C)``, their data-set sizes and, for the methods that need
them, the clients' discriminator logits, the true labels and the per-client class counts. Every
field is checked once here (shapes, dtypes, finiteness, ranges), so the methods of
:mod:`fedgo_flwr.weighting.methods` compute on inputs they can trust.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["WeightingInputs"]


def _as_tensor(name: str, value: Any) -> Tensor:
    """Return ``value`` as a tensor (lists / numpy arrays are converted), else raise."""
    if isinstance(value, Tensor):
        return value
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"{name} must be a tensor, got {type(value).__name__}") from exc


def _require_finite(name: str, t: Tensor) -> None:
    """Raise ``ValueError`` if a floating tensor holds NaN or ±inf."""
    if t.is_floating_point() and t.numel() > 0 and not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} contains NaN or infinite values")


@dataclass(frozen=True, eq=False)
class WeightingInputs:
    """Everything a weighting method may look at, for one round and one batch / set of samples.

    Validated on construction: a shape mismatch, a wrong dtype, a non-finite value, a negative
    count or an out-of-range label raises ``ValueError`` naming the field and the problem.
    Non-tensor values (lists, numpy arrays) are converted with :func:`torch.as_tensor` and moved to
    the device of ``logits``.

    Attributes:
        logits: ``(K, N, C)`` floating tensor, teacher ``k``'s logits ``f_k(x)`` on sample ``x``.
        num_examples: ``(K,)`` number of local training examples ``n_k`` of each teacher (ints or
            floats, ``>= 0``). Only ``data_size`` and ``fedgo`` use it; they also need
            ``sum_k n_k > 0``.
        disc_logits: ``(K, N)`` raw pre-sigmoid output ``z_k(x)`` of client ``k``'s discriminator
            (needed by ``domain`` and ``fedgo``).
        labels: ``(N,)`` integer true labels in ``[0, C)`` (``oracle`` only; simulation only).
        class_counts: ``(K, C)`` per-client class histogram ``n_{k,c}`` (``oracle`` only).
    """

    logits: Tensor
    num_examples: Tensor
    disc_logits: Tensor | None = None
    labels: Tensor | None = None
    class_counts: Tensor | None = None

    def __post_init__(self) -> None:
        """Convert array-likes to tensors on the logits' device and validate every field."""
        logits = _as_tensor("logits", self.logits)
        if logits.dim() != 3:
            raise ValueError(
                f"logits must have shape (K, N, C), got {tuple(logits.shape)} "
                f"({logits.dim()} dimensions)"
            )
        if not logits.is_floating_point():
            raise ValueError(f"logits must be a floating tensor, got dtype {logits.dtype}")
        k, n, c = logits.shape
        if k < 1:
            raise ValueError("logits must contain at least one teacher (K >= 1), got K = 0")
        if c < 1:
            raise ValueError("logits must contain at least one class (C >= 1), got C = 0")
        _require_finite("logits", logits)
        object.__setattr__(self, "logits", logits)
        device = logits.device

        num_examples = _as_tensor("num_examples", self.num_examples).to(device)
        if tuple(num_examples.shape) != (k,):
            raise ValueError(
                f"num_examples must have shape (K,) = ({k},) to match logits (K, N, C) = "
                f"{tuple(logits.shape)}, got {tuple(num_examples.shape)}"
            )
        if num_examples.dtype == torch.bool or num_examples.is_complex():
            raise ValueError(f"num_examples must be a real number tensor, got {num_examples.dtype}")
        _require_finite("num_examples", num_examples)
        if bool((num_examples < 0).any()):
            raise ValueError(
                f"num_examples must be non-negative, got {num_examples.tolist()} "
                "(negative client data-set size)"
            )
        object.__setattr__(self, "num_examples", num_examples)

        if self.disc_logits is not None:
            disc = _as_tensor("disc_logits", self.disc_logits).to(device)
            if tuple(disc.shape) != (k, n):
                raise ValueError(
                    f"disc_logits must have shape (K, N) = ({k}, {n}) to match logits (K, N, C) = "
                    f"{tuple(logits.shape)}, got {tuple(disc.shape)} (shape mismatch)"
                )
            if not disc.is_floating_point():
                raise ValueError(f"disc_logits must be a floating tensor, got dtype {disc.dtype}")
            _require_finite("disc_logits", disc)
            object.__setattr__(self, "disc_logits", disc)

        if self.labels is not None:
            labels = _as_tensor("labels", self.labels).to(device)
            if tuple(labels.shape) != (n,):
                raise ValueError(
                    f"labels must have shape (N,) = ({n},) to match logits (K, N, C) = "
                    f"{tuple(logits.shape)}, got {tuple(labels.shape)} (shape mismatch)"
                )
            if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
                raise ValueError(f"labels must be an integer tensor, got dtype {labels.dtype}")
            if n > 0 and (int(labels.min()) < 0 or int(labels.max()) >= c):
                raise ValueError(
                    f"labels must lie in [0, C) = [0, {c}), got range "
                    f"[{int(labels.min())}, {int(labels.max())}]"
                )
            object.__setattr__(self, "labels", labels.long())

        if self.class_counts is not None:
            counts = _as_tensor("class_counts", self.class_counts).to(device)
            if tuple(counts.shape) != (k, c):
                raise ValueError(
                    f"class_counts must have shape (K, C) = ({k}, {c}) to match logits "
                    f"(K, N, C) = {tuple(logits.shape)}, got {tuple(counts.shape)} (shape mismatch)"
                )
            if counts.dtype == torch.bool or counts.is_complex():
                raise ValueError(f"class_counts must be a real number tensor, got {counts.dtype}")
            _require_finite("class_counts", counts)
            if bool((counts < 0).any()):
                raise ValueError("class_counts must be non-negative")
            object.__setattr__(self, "class_counts", counts)

    @property
    def num_teachers(self) -> int:
        """``K``, the number of teachers (participating clients)."""
        return int(self.logits.shape[0])

    @property
    def num_samples(self) -> int:
        """``N``, the number of samples being pseudo-labelled."""
        return int(self.logits.shape[1])

    @property
    def num_classes(self) -> int:
        """``C``, the number of classes."""
        return int(self.logits.shape[2])
