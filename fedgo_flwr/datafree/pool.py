"""The synthetic pool ``D_S`` of data-free distillation: every epoch's batch, all history.

Images are kept as ``uint8`` in ``[0, 255]``, quantised exactly as the authors' PNG round trip,
and read back through :func:`fedgo_flwr.data.indexed_batches` (normalisation to ``[-1, 1]``,
random horizontal flips where the data set allows them). :class:`PoolLogits` keeps the frozen
client models' logits on every pool image, so a pass that reads the pool as stored does not
run the client models again.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fedgo_flwr.data import ArrayDataset, IndexedBatch, indexed_batches

__all__ = [
    "PoolLogits",
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
        return ((b.x, b.y) for b in self.indexed_batches(batch_size, rng, augment, device))

    def indexed_batches(
        self, batch_size: int, rng: torch.Generator, augment: bool, device: torch.device
    ) -> Iterator[IndexedBatch]:
        """:meth:`batches` (the same batches from the same ``rng``) with each batch's pool
        indices and flip mask, to read :class:`PoolLogits`."""
        return indexed_batches(
            self.dataset(), batch_size, shuffle=True, rng=rng, augment=augment, device=device
        )

    def inputs(self, start: int, batch_size: int) -> Iterator[Tensor]:
        """The model input of pool samples ``start:`` as stored (normalised, not flipped), on
        the CPU, ``batch_size`` at a time (the pool is gathered once, not per batch)."""
        if start >= self._size:
            return
        data = self.dataset()
        for at in range(start, len(data), batch_size):
            yield data.to_tensors(np.arange(at, min(at + batch_size, len(data))))[0]

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


class PoolLogits:
    """The frozen client models' logits on every pool image, as stored and flipped.

    A pass over the pool as stored (DENSE's and F-ADI's distillation, Co-Boosting's without
    diversification, its re-weighting in the ``code`` order) reads the ensemble on images whose
    client-model logits never change: the models are frozen and an image only ever appears as
    stored or flipped. Recomputed, they cost ``n`` forward passes per image and epoch against
    the student's one forward and backward; here they are computed once, when an image joins
    the pool (in both orientations where the passes flip), and read by pool index and flip mask
    (:meth:`SyntheticPool.indexed_batches`). The logits are raw (before ``teacher_norm``, which
    the reader applies over its batch, as :func:`~fedgo_flwr.datafree.ensemble.member_logits`
    does) and ``float32``; they are the models' outputs on the same inputs, in other batches:
    equal up to the float rounding of another batch composition (the golden DENSE and F-ADI
    runs are bit-equal; a last-bit difference, 7e-9, in one unit test). Kept on the CPU
    (``views x N x n x C`` floats: 51 MB for Co-Boosting's full budget on CIFAR-10, 64,000
    images of 10 clients); each read moves one batch to ``device``.
    """

    def __init__(self, models: Sequence[nn.Module], flip: bool, device: torch.device) -> None:
        self.models = list(models)
        self.views = 2 if flip else 1
        self.device = device
        self._table: Tensor | None = None  # (views, N, n, C)
        self._new: list[Tensor] = []

    def __len__(self) -> int:
        return sum(int(t.shape[1]) for t in self._parts())

    def _parts(self) -> list[Tensor]:
        return ([] if self._table is None else [self._table]) + self._new

    @torch.no_grad()
    def add(self, x: Tensor) -> None:
        """Logits of the pool's next images, given as model input ``x`` (normalised, as
        stored)."""
        x = x.to(self.device)
        views = (x, x.flip(-1))[: self.views]
        z = torch.stack([torch.stack([m(v).float() for m in self.models], 1) for v in views])
        self._new.append(z.cpu())

    def read(self, index: np.ndarray, flipped: Tensor) -> Tensor:
        """The members' raw logits ``(n, B, C)`` on ``device`` for pool samples ``index``, those
        of ``flipped`` horizontally flipped."""
        if self._new:
            self._table = torch.cat(self._parts(), 1)
            self._new = []
        if self._table is None:
            raise ValueError("no pool logits yet")
        idx = torch.from_numpy(np.asarray(index, dtype=np.int64))
        cached = self._table.shape[1]
        if int(idx.max()) >= cached:
            raise IndexError(f"pool index {int(idx.max())}: only {cached} images cached")
        if self.views == 1 and bool(flipped.any()):
            raise ValueError("a flipped pool image: the cache holds the stored orientation only")
        view = flipped.long() if self.views == 2 else torch.zeros_like(idx)
        return self._table[view, idx].permute(1, 0, 2).contiguous().to(self.device)

    def clear(self) -> None:
        self._table, self._new = None, []
