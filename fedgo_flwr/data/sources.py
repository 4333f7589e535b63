"""Datasets by name: :func:`load_dataset` and the built-in sources.

The built-in datasets are the entries of :data:`fedgo_flwr.config.names.DATASETS`, each
naming its loader here:

* ``"digits"`` -- scikit-learn's embedded 8x8 digits (no download); a small CPU-friendly proxy.
* ``"four_gaussians"`` -- the synthetic toy task of FedGO App. E.1 (Figure 1).
* ``"cifar10"`` / ``"cifar100"`` -- via ``torchvision.datasets`` (download only if asked).
* ``"imagefolder"`` -- a local image tree (:mod:`fedgo_flwr.data.imagefolder`).

``"hf:<hub dataset id>"`` names a Hugging Face ``datasets`` image-classification dataset
(:func:`load_hf_dataset`; needs the optional ``datasets`` package, ``pip install .[hf]``).

Train/test splits and synthetic data never depend on the experiment seed, so every run sees the
same test set; the seed only affects the partition and training. ``torchvision``, ``sklearn`` and
``datasets`` are imported lazily inside the loaders that need them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from fedgo_flwr.config.names import (
    HF_PREFIX,
    TORCHVISION_ROOT,
    dataset_entry,
    dataset_names,
    hf_id,
)
from fedgo_flwr.data.arrays import ArrayDataset, DataBundle
from fedgo_flwr.data.imagefolder import DEFAULT_CACHE_ROOT, load_imagefolder
from fedgo_flwr.runtime.fileio import atomic_write

__all__ = [
    "FOUR_GAUSSIANS_LABELS",
    "FOUR_GAUSSIANS_MEANS",
    "FOUR_GAUSSIANS_PAPER_OWNERS",
    "FOUR_GAUSSIANS_PER_COMPONENT",
    "FOUR_GAUSSIANS_VARIANCE",
    "four_gaussians_oracle_labels",
    "four_gaussians_server_data",
    "load_cifar",
    "load_dataset",
    "load_digits",
    "load_four_gaussians",
    "load_hf_dataset",
    "load_image_tree",
    "make_four_gaussians",
]


# ------------------------------------------------------------------------------------------
# Entry point
# ------------------------------------------------------------------------------------------


def load_dataset(
    name: str,
    *,
    path: str | None = None,
    download: bool = False,
    cache_dir: str | None = None,
) -> DataBundle:
    """Load a dataset by name: one of :data:`~fedgo_flwr.config.names.DATASETS` (by its
    entry's loader), or ``"hf:<hub dataset id>"``.

    Args:
        name: A key of ``DATASETS`` (case and surrounding blanks ignored) or ``"hf:<id>"``
            (e.g. ``"hf:uoft-cs/cifar10"``).
        path: Root of the data (``data.path``; default: the entry's ``default_path``; required
            for an entry with a ``folder`` and no default, ``"imagefolder"``; not used by
            ``"hf:"`` datasets, which live in the Hugging Face cache).
        download: Let the loader download the data if missing (entries with ``download``).
        cache_dir: Where ``"imagefolder"`` caches decoded arrays (default ``path/.fedgo_cache`` or,
            if that is not writable, ``~/.cache/fedgo_flwr``).

    Raises:
        ValueError: Unknown name, a dataset that needs ``path`` without it, or ``"hf:"`` without
            an id.
        FileNotFoundError: CIFAR files missing and ``download=False``.
        ImportError: An ``"hf:"`` name without the ``datasets`` package.
    """
    key = name.strip()
    if key.startswith(HF_PREFIX):
        hub_id = hf_id(key)
        if hub_id is None:
            raise ValueError(f"dataset {name!r} needs a hub dataset id, e.g. hf:uoft-cs/cifar10")
        return dataclasses.replace(load_hf_dataset(hub_id), name=HF_PREFIX + hub_id)
    key = key.lower()
    entry = dataset_entry(key)
    if entry is None:
        raise ValueError(
            f"unknown dataset {name!r}; expected one of {', '.join(dataset_names())} "
            f"or {HF_PREFIX}<hub dataset id>"
        )
    root = path or entry.default_path
    if entry.folder is not None and not root:
        raise ValueError(f"dataset {key!r} needs a path (set data.path to its root)")
    module, _, function = entry.loader.partition(":")
    loader = getattr(importlib.import_module(module), function)
    return loader(name=key, path=root, download=download, cache_dir=cache_dir)


# ------------------------------------------------------------------------------------------
# digits
# ------------------------------------------------------------------------------------------


DIGITS_CACHE = Path(DEFAULT_CACHE_ROOT).expanduser() / "digits"
"""Where :func:`load_digits` keeps the split it computed, one file per scikit-learn version."""
_DIGITS_KEYS = ("x", "y", "idx_train", "idx_test")


def _digits_from_sklearn() -> dict[str, np.ndarray]:
    """The digits as :func:`load_digits` uses them: images (uint8), labels and the indices of
    the fixed stratified 80/20 split, computed by scikit-learn."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    raw = load_digits()
    x = np.rint(raw.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)[:, None, :, :]
    y = raw.target.astype(np.int64)
    idx_train, idx_test = train_test_split(
        np.arange(y.size), test_size=0.2, stratify=y, random_state=0
    )
    return {"x": x, "y": y, "idx_train": np.sort(idx_train), "idx_test": np.sort(idx_test)}


def _digits_arrays() -> dict[str, np.ndarray]:
    """:func:`_digits_from_sklearn`'s arrays, from :data:`DIGITS_CACHE` when a file made by this
    scikit-learn version is there: importing scikit-learn takes seconds (it imports SciPy), and
    every process that loads the digits paid them (the ServerApp, each Ray worker, each
    ClientApp process of a deployment). A missing, unreadable or malformed file is computed
    again and rewritten; an unwritable folder only loses the cache."""
    from importlib.metadata import version

    path = DIGITS_CACHE / f"digits-v1-sklearn-{version('scikit-learn')}.npz"
    if path.is_file():
        try:
            with np.load(path, allow_pickle=False) as f:
                arrays = {k: f[k] for k in _DIGITS_KEYS}
            x, y = arrays["x"], arrays["y"]
            if (
                x.dtype == np.uint8
                and x.shape[1:] == (1, 8, 8)
                and y.dtype == np.int64
                and y.shape == (len(x),)
                and np.array_equal(
                    np.sort(np.concatenate([arrays["idx_train"], arrays["idx_test"]])),
                    np.arange(len(x)),
                )
            ):
                return arrays
        except (OSError, ValueError, KeyError):
            pass
    arrays = _digits_from_sklearn()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda fh: np.savez(fh, **arrays), mode=0o644)
    return arrays


def load_digits(**_: Any) -> DataBundle:
    """scikit-learn 8x8 digits, pixels 0..16 scaled to uint8, fixed stratified 80/20 split
    (:func:`_digits_arrays`)."""
    a = _digits_arrays()
    x, y, idx_train, idx_test = (a[k] for k in _DIGITS_KEYS)
    return DataBundle(
        train=ArrayDataset(x[idx_train], y[idx_train], num_classes=10, flip=False),
        test=ArrayDataset(x[idx_test], y[idx_test], num_classes=10, flip=False),
        name="digits",
        class_names=tuple(str(c) for c in range(10)),
    )


# ------------------------------------------------------------------------------------------
# four_gaussians (FedGO App. E.1)
# ------------------------------------------------------------------------------------------

#: Component means, numbered by quadrant: Q1 (4, 4), Q2 (-4, 4), Q3 (-4, -4), Q4 (4, -4).
FOUR_GAUSSIANS_MEANS: tuple[tuple[float, float], ...] = (
    (4.0, 4.0),
    (-4.0, 4.0),
    (-4.0, -4.0),
    (4.0, -4.0),
)
#: Class of each component: (4, 4) and (-4, -4) are "Red" (0), (-4, 4) "Blue" (1),
#: (4, -4) "Green" (2).
FOUR_GAUSSIANS_LABELS: tuple[int, ...] = (0, 1, 0, 2)
#: "each with a variance of 3": isotropic covariance 3 * I.
FOUR_GAUSSIANS_VARIANCE = 3.0
#: "Each Gaussian provides 300 data samples."
FOUR_GAUSSIANS_PER_COMPONENT = 300
#: Components owned by the paper's clients 1-4 (quadrants 3, 4, 2, 1), for
#: :func:`fedgo_flwr.data.partition.component_partition`.
FOUR_GAUSSIANS_PAPER_OWNERS: tuple[int, ...] = (2, 3, 1, 0)
FOUR_GAUSSIANS_CLASS_NAMES = ("red", "blue", "green")
# Fixed generator seeds (NOT the experiment seed) so the task is identical in every run.
_FOUR_GAUSSIANS_SEEDS = {"train": 20250101, "test": 20250102, "server": 20250103}


def make_four_gaussians(
    split: str = "train", n_per_component: int = FOUR_GAUSSIANS_PER_COMPONENT
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sample the FedGO toy mixture (App. E.1) with a fixed, split-specific generator seed.

    Four 2-D Gaussians with covariance ``3 * I`` and means ``(+-4, +-4)``; ``n_per_component``
    samples each, stored component by component (Q1, Q2, Q3, Q4).

    Returns:
        ``(x, y, component)``: ``float32`` ``(4n, 2)`` points, ``int64`` class labels (0 red,
        1 blue, 2 green) and ``int64`` component ids (quadrant - 1).
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    rng = np.random.default_rng(_FOUR_GAUSSIANS_SEEDS[split])
    std = np.sqrt(FOUR_GAUSSIANS_VARIANCE)
    xs, ys, cs = [], [], []
    for j, (mean, label) in enumerate(
        zip(FOUR_GAUSSIANS_MEANS, FOUR_GAUSSIANS_LABELS, strict=True)
    ):
        xs.append(rng.normal(loc=mean, scale=std, size=(n_per_component, 2)))
        ys.append(np.full(n_per_component, label, dtype=np.int64))
        cs.append(np.full(n_per_component, j, dtype=np.int64))
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys), np.concatenate(cs)


def four_gaussians_oracle_labels(x: np.ndarray) -> np.ndarray:
    """The paper's oracle rule: red (0) in quadrants 1 and 3, blue (1) in 2, green (2) in 4."""
    x = np.asarray(x)
    right, up = x[:, 0] >= 0, x[:, 1] >= 0
    return np.where(right == up, 0, np.where(up, 1, 2)).astype(np.int64)


def four_gaussians_server_data(n: int = 300, half_width: float = 12.0) -> ArrayDataset:
    """The toy example's unlabeled server set: ``n`` points uniform on ``[-12, 12]^2`` (App. E.1).

    Drawn with a fixed generator seed.  ``y`` holds the oracle labels
    (:func:`four_gaussians_oracle_labels`) for diagnostics only.
    """
    rng = np.random.default_rng(_FOUR_GAUSSIANS_SEEDS["server"])
    x = rng.uniform(-half_width, half_width, size=(n, 2)).astype(np.float32)
    return ArrayDataset(x, four_gaussians_oracle_labels(x), num_classes=3, flip=False)


def load_four_gaussians(**_: Any) -> DataBundle:
    """Train: the paper's 1200 samples (300 per Gaussian); test: another 1200 drawn the same way."""
    x_tr, y_tr, _ = make_four_gaussians("train")
    x_te, y_te, _ = make_four_gaussians("test")
    return DataBundle(
        train=ArrayDataset(x_tr, y_tr, num_classes=3, flip=False),
        test=ArrayDataset(x_te, y_te, num_classes=3, flip=False),
        name="four_gaussians",
        class_names=FOUR_GAUSSIANS_CLASS_NAMES,
    )


# ------------------------------------------------------------------------------------------
# CIFAR-10 / CIFAR-100 (torchvision)
# ------------------------------------------------------------------------------------------


def load_cifar(*, name: str, path: str | None, download: bool, **_: Any) -> DataBundle:
    """CIFAR-10 or CIFAR-100 (``name``) via torchvision under ``path`` (default
    :data:`~fedgo_flwr.config.names.TORCHVISION_ROOT`); ``.data`` (N, 32, 32, 3) ->
    (N, 3, 32, 32) uint8."""
    from torchvision import datasets

    root = os.path.expanduser(path or TORCHVISION_ROOT)
    cls = datasets.CIFAR10 if name == "cifar10" else datasets.CIFAR100
    try:
        train = cls(root=root, train=True, download=download)
        test = cls(root=root, train=False, download=download)
    except RuntimeError as exc:
        if download:
            raise
        raise FileNotFoundError(
            f"{name} not found (or corrupted) under {root!r} and download is disabled; set "
            "`data.download: true` to let torchvision download it, or point `data.path` at a "
            f"directory that already contains the torchvision {name} files "
            f"({cls.base_folder}/)"
        ) from exc

    def convert(ds: Any) -> ArrayDataset:
        x = np.ascontiguousarray(np.asarray(ds.data, dtype=np.uint8).transpose(0, 3, 1, 2))
        y = np.asarray(ds.targets, dtype=np.int64)
        return ArrayDataset(x, y, num_classes=len(ds.classes), flip=True)

    return DataBundle(
        train=convert(train), test=convert(test), name=name, class_names=tuple(train.classes)
    )


def load_image_tree(*, path: str, cache_dir: str | None = None, **_: Any) -> DataBundle:
    """``"imagefolder"``: the ``train/<class>/*``, ``test/<class>/*`` tree at ``path``
    (:func:`fedgo_flwr.data.imagefolder.load_imagefolder`)."""
    return load_imagefolder(path, cache_dir=cache_dir)


# ------------------------------------------------------------------------------------------
# Hugging Face datasets (optional, needs internet or a local copy)
# ------------------------------------------------------------------------------------------


def load_hf_dataset(
    name_or_path: str,
    *,
    split_train: str = "train",
    split_test: str = "test",
    image_key: str = "img",
    label_key: str = "label",
    flip: bool = True,
) -> DataBundle:
    """Load an image-classification dataset with Hugging Face ``datasets``.

    E.g. ``load_hf_dataset("uoft-cs/cifar10")`` (``image_key="img"``, ``label_key="label"``);
    ``load_dataset("hf:uoft-cs/cifar10")`` (``data.dataset: hf:uoft-cs/cifar10``) calls it with
    the defaults. Images are converted to RGB ``uint8`` ``(N, C, H, W)`` and must share one size.

    Raises:
        ImportError: ``datasets`` is not installed.
    """
    try:
        import datasets as hf_datasets
    except ImportError as exc:
        raise ImportError(
            "load_hf_dataset needs the Hugging Face 'datasets' package: pip install datasets "
            "(or the project's extra: pip install .[hf])"
        ) from exc

    dd = hf_datasets.load_dataset(name_or_path)
    feature = dd[split_train].features.get(label_key)
    names: tuple[str, ...] = tuple(getattr(feature, "names", None) or ())

    def convert(split: str) -> tuple[np.ndarray, np.ndarray]:
        ds = dd[split]
        x = np.stack([np.asarray(im.convert("RGB"), dtype=np.uint8) for im in ds[image_key]])
        y = np.asarray(ds[label_key], dtype=np.int64)
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2)), y

    x_tr, y_tr = convert(split_train)
    x_te, y_te = convert(split_test)
    num_classes = len(names) if names else int(max(y_tr.max(), y_te.max())) + 1
    return DataBundle(
        train=ArrayDataset(x_tr, y_tr, num_classes, flip=flip),
        test=ArrayDataset(x_te, y_te, num_classes, flip=flip),
        name=name_or_path,
        class_names=names,
    )
