"""In-memory datasets and batching: :class:`ArrayDataset`, :class:`DataBundle`, :func:`batches`.

An :class:`ArrayDataset` holds ``uint8`` images ``(N, C, H, W)`` or ``float32`` feature vectors
``(N, D)`` plus ``int64`` labels. :func:`batches` normalises images to ``[-1, 1]`` (FedGO App. E.2)
and applies random horizontal flips on the batch tensor, drawing all randomness from one
``torch.Generator``. :func:`stratified_subset` picks the fixed stratified subset of a training
split used by ``data.train_subset``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from fedgo_flwr.runtime.rng import derive_seed

__all__ = [
    "ArrayDataset",
    "DataBundle",
    "IndexedBatch",
    "batches",
    "ends_in_batch_of_one",
    "indexed_batches",
    "stratified_subset",
]


# ------------------------------------------------------------------------------------------
# Containers
# ------------------------------------------------------------------------------------------


@dataclass
class ArrayDataset:
    """A labelled dataset held as numpy arrays.

    Attributes:
        x: ``uint8`` images ``(N, C, H, W)`` with values in ``[0, 255]`` or ``float32`` features
            ``(N, D)``.  May be a read-only memory map (cached image folders).
        y: ``int64`` labels ``(N,)`` in ``[0, num_classes)``.
        num_classes: Number of classes.
        flip: Whether a random horizontal flip is a valid augmentation (images only).
    """

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    flip: bool = False

    def __post_init__(self) -> None:
        x = self.x if isinstance(self.x, np.ndarray) else np.asarray(self.x)
        if x.dtype != np.uint8:
            if not np.issubdtype(x.dtype, np.floating):
                raise ValueError(f"x must be uint8 images or float features, got dtype {x.dtype}")
            x = x.astype(np.float32, copy=False)
        if x.ndim < 2:
            raise ValueError(f"x must have shape (N, ...) with at least 2 dims, got {x.shape}")
        y = np.asarray(self.y).astype(np.int64, copy=False)
        if y.ndim != 1 or y.shape[0] != x.shape[0]:
            raise ValueError(f"y must have shape ({x.shape[0]},), got {y.shape}")
        if int(self.num_classes) < 1:
            raise ValueError(f"num_classes must be >= 1, got {self.num_classes}")
        if y.size and (y.min() < 0 or y.max() >= self.num_classes):
            raise ValueError(
                f"labels must lie in [0, {self.num_classes}), got range [{y.min()}, {y.max()}]"
            )
        self.x, self.y, self.num_classes = x, y, int(self.num_classes)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one sample, ``x.shape[1:]``."""
        return tuple(int(s) for s in self.x.shape[1:])

    @property
    def is_image(self) -> bool:
        """True for ``(N, C, H, W)`` image data."""
        return self.x.ndim == 4

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def subset(self, idx: np.ndarray) -> ArrayDataset:
        """A new dataset with the samples ``idx`` (copied into memory)."""
        idx = np.asarray(idx, dtype=np.int64)
        return ArrayDataset(
            x=np.asarray(self.x[idx]),
            y=np.asarray(self.y[idx]),
            num_classes=self.num_classes,
            flip=self.flip,
        )

    def to_tensors(self, idx: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised ``(x, y)`` CPU tensors of all samples or of ``idx``.

        ``uint8`` images become ``float32`` ``x / 127.5 - 1`` in ``[-1, 1]``; float features are
        returned unchanged (as a copy); labels are ``int64``.
        """
        if idx is None:
            xs, ys = np.array(self.x), np.array(self.y)
        else:
            idx = np.asarray(idx, dtype=np.int64)
            xs, ys = np.asarray(self.x[idx]), np.asarray(self.y[idx])
        return _normalise(torch.from_numpy(_writable(xs))), torch.from_numpy(_writable(ys))


@dataclass
class DataBundle:
    """Train and test split of one dataset.

    Attributes:
        train: Training set (partitioned into server share and clients).
        test: Test set (identical across runs and seeds).
        name: Dataset name as passed to :func:`fedgo_flwr.data.load_dataset`.
        class_names: Human-readable class names if known (may be empty).
    """

    train: ArrayDataset
    test: ArrayDataset
    name: str
    class_names: tuple[str, ...] = ()


def _writable(a: np.ndarray) -> np.ndarray:
    """``a`` as a writable base-class ndarray (copies read-only views such as memory maps)."""
    a = np.asarray(a)
    return a if a.flags.writeable and a.flags.c_contiguous else np.array(a, order="C")


def _normalise(x: torch.Tensor) -> torch.Tensor:
    """``uint8`` -> ``float32`` in ``[-1, 1]``; floating tensors -> ``float32`` unchanged."""
    if x.dtype == torch.uint8:
        return x.to(torch.float32).div_(127.5).sub_(1.0)
    return x.to(torch.float32)


# ------------------------------------------------------------------------------------------
# Batching
# ------------------------------------------------------------------------------------------


def ends_in_batch_of_one(n: int, batch_size: int) -> bool:
    """Whether ``n`` samples in batches of ``batch_size`` end in a batch of a single sample.

    BatchNorm cannot train on a batch of one, so every training loop (local training, the
    discriminators, distillation) drops that batch: the one rule, written once.
    """
    return n > 1 and n % batch_size == 1


def batches(
    ds: ArrayDataset,
    batch_size: int,
    *,
    shuffle: bool,
    rng: torch.Generator | None = None,
    augment: bool = False,
    drop_last: bool = False,
    device: torch.device | str = "cpu",
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Iterate once over ``ds`` in normalised ``(x, y)`` batches on ``device``.

    Randomness (the epoch permutation, then one flip mask per batch) is drawn only from
    ``rng`` (torch's global RNG if ``None``), so a freshly seeded ``rng`` reproduces
    the exact same batches.  With ``augment=True`` and ``ds.flip`` every image is flipped
    horizontally with probability 0.5, vectorised on the batch.  No ``DataLoader`` is used: the
    ``uint8`` batch is gathered with numpy fancy indexing, moved to ``device`` and normalised there.

    Args:
        ds: The dataset.
        batch_size: Samples per batch (``>= 1``); the last batch may be smaller.
        shuffle: Visit samples in a random order (otherwise in index order).
        rng: CPU ``torch.Generator`` for shuffling and flips.
        augment: Apply random horizontal flips (only if ``ds.flip`` and ``ds`` holds images).
        drop_last: Skip a final incomplete batch.
        device: Device of the yielded tensors.
    """
    it = _indexed(ds, batch_size, shuffle, rng, augment, drop_last, device)
    return ((b.x, b.y) for b in it)


class IndexedBatch(NamedTuple):
    """A batch of :func:`indexed_batches`: the model input and labels on the device, and which
    samples of the dataset they are (``index``, numpy ``int64``) and which of them were flipped
    (``flipped``, a CPU ``bool`` tensor; all ``False`` without flips)."""

    x: torch.Tensor
    y: torch.Tensor
    index: np.ndarray
    flipped: torch.Tensor


def indexed_batches(ds: ArrayDataset, batch_size: int, **options: Any) -> Iterator[IndexedBatch]:
    """:func:`batches` (its keyword options; the same batches from the same ``rng``), each batch
    with its samples' indices into ``ds`` and its flip mask: what a cache of per-sample
    outputs needs (:class:`fedgo_flwr.datafree.pool.PoolLogits`)."""
    return _indexed(ds, batch_size, **options)


def _indexed(ds: ArrayDataset, batch_size: int, shuffle: bool, rng: torch.Generator | None = None,
             augment: bool = False, drop_last: bool = False,
             device: torch.device | str = "cpu") -> Iterator[IndexedBatch]:  # fmt: skip
    if int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    flip = augment and ds.flip and ds.is_image
    return _iter_batches(ds, int(batch_size), shuffle, rng, flip, drop_last, device)


def _iter_batches(
    ds: ArrayDataset,
    batch_size: int,
    shuffle: bool,
    rng: torch.Generator | None,
    flip: bool,
    drop_last: bool,
    device: torch.device | str,
) -> Iterator[IndexedBatch]:
    n = len(ds)
    dev = torch.device(device)
    if shuffle:
        order = torch.randperm(n, generator=rng).numpy()
    else:
        order = np.arange(n, dtype=np.int64)
    for start in range(0, n, batch_size):
        idx = order[start : start + batch_size]
        if drop_last and idx.size < batch_size:
            break
        xb = torch.from_numpy(_writable(ds.x[idx])).to(dev, non_blocking=True)
        yb = torch.from_numpy(_writable(ds.y[idx])).to(dev, non_blocking=True)
        xb = _normalise(xb)
        if flip:
            mask = torch.rand(idx.size, generator=rng) < 0.5
            xb = torch.where(mask.to(dev)[:, None, None, None], xb.flip(-1), xb)
        else:
            mask = torch.zeros(idx.size, dtype=torch.bool)
        yield IndexedBatch(xb, yb, idx, mask)


# ------------------------------------------------------------------------------------------
# Subsets
# ------------------------------------------------------------------------------------------


def stratified_subset(labels: np.ndarray, size: int) -> np.ndarray:
    """``size`` sorted indices with the classes in their original proportions.

    Drawn with a fixed seed, not the experiment's: every seed and strategy sees the same subset
    (``data.train_subset`` of the training split, ``data.test_subset`` of the test split).
    """
    rng = np.random.default_rng(derive_seed("train-subset"))
    classes, counts = np.unique(labels, return_counts=True)
    exact = counts * (size / len(labels))
    take = np.floor(exact).astype(int)
    # Largest remainders get the leftover samples, so the total is exactly ``size``.
    take[np.argsort(take - exact)[: size - take.sum()]] += 1
    picked = [
        rng.choice(np.flatnonzero(labels == c), size=n, replace=False)
        for c, n in zip(classes, take, strict=True)
    ]
    return np.sort(np.concatenate(picked))
