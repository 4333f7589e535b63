"""The synthetic pool ``D_S`` of data-free distillation: every epoch's batch, all history.

Images are kept as ``uint8`` in ``[0, 255]``, quantised exactly as the authors' PNG round trip,
and read back through :func:`fedgo_flwr.data.batches` (normalisation to ``[-1, 1]``, random
horizontal flips where the data set allows them).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedgo_flwr.data import ArrayDataset, batches

__all__ = [
    "SyntheticPool",
]


class SyntheticPool:
    """The growing synthetic set ``D_S`` (Alg. 1 line 10): every epoch's batch, all history.

    Images are stored as ``uint8`` ``(N, C, H, W)`` in ``[0, 255]`` (``round(255 x)`` of the
    generator's ``[0, 1]`` output, as the authors' PNG round trip) with their sampled labels.
    """

    def __init__(self, image_shape: Sequence[int], num_classes: int, flip: bool) -> None:
        self.image_shape = tuple(int(s) for s in image_shape)
        self.num_classes = int(num_classes)
        self.flip = bool(flip)
        self._x: list[np.ndarray] = []
        self._y: list[np.ndarray] = []
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def add(self, images: Tensor, labels: Tensor) -> None:
        """Append a batch of images in ``[0, 1]`` ``(b, C, H, W)`` with labels ``(b,)``."""
        if tuple(images.shape[1:]) != self.image_shape or images.shape[0] != labels.shape[0]:
            raise ValueError(
                f"pool batch must be (b, {self.image_shape}) with b labels, got "
                f"{tuple(images.shape)} and {tuple(labels.shape)}"
            )
        q = (images.detach().float().clamp(0, 1) * 255.0).round().to(torch.uint8).cpu().numpy()
        self._x.append(q)
        self._y.append(labels.detach().cpu().numpy().astype(np.int64))
        self._size += int(labels.shape[0])

    def dataset(self) -> ArrayDataset:
        """The pool as an :class:`ArrayDataset` (read by :func:`fedgo_flwr.data.batches`)."""
        if not self._size:
            raise ValueError("the synthetic pool is empty")
        return ArrayDataset(
            x=np.concatenate(self._x),
            y=np.concatenate(self._y),
            num_classes=self.num_classes,
            flip=self.flip,
        )

    def batches(
        self, batch_size: int, rng: torch.Generator, augment: bool, device: torch.device
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """One shuffled pass over the pool in model-input ``(x, y)`` batches."""
        return batches(
            self.dataset(), batch_size, shuffle=True, rng=rng, augment=augment, device=device
        )

    def state_dict(self) -> dict[str, Any]:
        data = self.dataset() if self._size else None
        return {
            "x": None if data is None else data.x,
            "y": None if data is None else data.y,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._x, self._y, self._size = [], [], 0
        if state.get("x") is not None:
            x, y = np.asarray(state["x"], dtype=np.uint8), np.asarray(state["y"], dtype=np.int64)
            if tuple(x.shape[1:]) != self.image_shape or x.shape[0] != y.shape[0]:
                raise ValueError(
                    f"pool state has shape {x.shape}, expected (N, {self.image_shape})"
                )
            self._x, self._y, self._size = [x], [y], int(y.shape[0])
