"""Datasets for fedgo-flwr: in-memory arrays, fast batching and loaders.

All datasets are held as :class:`ArrayDataset` -- ``uint8`` images ``(N, C, H, W)`` or ``float32``
feature vectors ``(N, D)`` plus ``int64`` labels -- and are batched by :func:`batches`, which
normalises images to ``[-1, 1]`` (FedGO App. E.2) and applies random horizontal flips on the batch
tensor, drawing all randomness from one ``torch.Generator``.

Loaders (:func:`load_dataset`):

* ``"digits"`` -- scikit-learn's embedded 8x8 digits (no download); a small CPU-friendly proxy.
* ``"four_gaussians"`` -- the synthetic toy task of FedGO App. E.1 (Figure 1).
* ``"cifar10"`` / ``"cifar100"`` -- via ``torchvision.datasets`` (download only if asked).
* ``"imagefolder"`` -- a local ``path/{train,test}/<class>/*.{jpg,jpeg,png}`` tree, decoded once
  with PIL and cached as ``.npy`` files.

:func:`load_hf_dataset` loads a Hugging Face ``datasets`` image dataset for users with internet.

``torchvision``, ``PIL``, ``sklearn`` and ``datasets`` are imported lazily inside the loaders that
need them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "DATASET_NAMES",
    "FOUR_GAUSSIANS_LABELS",
    "FOUR_GAUSSIANS_MEANS",
    "FOUR_GAUSSIANS_PAPER_OWNERS",
    "FOUR_GAUSSIANS_PER_COMPONENT",
    "FOUR_GAUSSIANS_VARIANCE",
    "IMAGE_EXTENSIONS",
    "ArrayDataset",
    "DataBundle",
    "batches",
    "four_gaussians_oracle_labels",
    "four_gaussians_server_data",
    "load_dataset",
    "load_hf_dataset",
    "load_imagefolder",
    "make_four_gaussians",
]

log = logging.getLogger(__name__)

DATASET_NAMES = ("digits", "four_gaussians", "cifar10", "cifar100", "imagefolder")

DEFAULT_TORCHVISION_ROOT = "~/.cache/fedgo_flwr/torchvision"
DEFAULT_CACHE_ROOT = "~/.cache/fedgo_flwr"
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")


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
        name: Dataset name as passed to :func:`load_dataset`.
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
    if int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    return _iter_batches(
        ds,
        int(batch_size),
        shuffle,
        rng,
        augment and ds.flip and ds.is_image,
        drop_last,
        device,
    )


def _iter_batches(
    ds: ArrayDataset,
    batch_size: int,
    shuffle: bool,
    rng: torch.Generator | None,
    flip: bool,
    drop_last: bool,
    device: torch.device | str,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
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
            mask = (torch.rand(idx.size, generator=rng) < 0.5).to(dev)
            xb = torch.where(mask[:, None, None, None], xb.flip(-1), xb)
        yield xb, yb


# ------------------------------------------------------------------------------------------
# Entry point
# ------------------------------------------------------------------------------------------


def load_dataset(
    name: str,
    *,
    path: str | None = None,
    download: bool = False,
    cache_dir: str | None = None,
    seed: int = 0,
) -> DataBundle:
    """Load a dataset by name (one of :data:`DATASET_NAMES`).

    Args:
        name: ``"digits"``, ``"four_gaussians"``, ``"cifar10"``, ``"cifar100"`` or
            ``"imagefolder"``.
        path: Root of the data (torchvision root for CIFAR, default
            ``~/.cache/fedgo_flwr/torchvision``; required for ``"imagefolder"``).
        download: Let torchvision download CIFAR if missing.
        cache_dir: Where ``"imagefolder"`` caches decoded arrays (default ``path/.fedgo_cache`` or,
            if that is not writable, ``~/.cache/fedgo_flwr``).
        seed: Experiment seed.  Deliberately unused by the built-in loaders: train/test splits and
            synthetic data are fixed so that every run sees the same test set; the seed only
            affects the partition and training.

    Raises:
        ValueError: Unknown name, or ``"imagefolder"`` without ``path``.
        FileNotFoundError: CIFAR files missing and ``download=False``.
    """
    del seed  # data never depends on the experiment seed (see docstring)
    key = name.lower().strip()
    if key == "digits":
        return _load_digits()
    if key == "four_gaussians":
        return _load_four_gaussians()
    if key in ("cifar10", "cifar100"):
        return _load_cifar(key, path=path, download=download)
    if key == "imagefolder":
        if not path:
            raise ValueError("dataset 'imagefolder' needs a path (set data.path to the tree root)")
        return load_imagefolder(path, cache_dir=cache_dir)
    raise ValueError(f"unknown dataset {name!r}; expected one of {', '.join(DATASET_NAMES)}")


# ------------------------------------------------------------------------------------------
# digits
# ------------------------------------------------------------------------------------------


def _load_digits() -> DataBundle:
    """scikit-learn 8x8 digits, pixels 0..16 scaled to uint8, fixed stratified 80/20 split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    raw = load_digits()
    x = np.rint(raw.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)[:, None, :, :]
    y = raw.target.astype(np.int64)
    idx_train, idx_test = train_test_split(
        np.arange(y.size), test_size=0.2, stratify=y, random_state=0
    )
    idx_train, idx_test = np.sort(idx_train), np.sort(idx_test)
    names = tuple(str(c) for c in raw.target_names)
    return DataBundle(
        train=ArrayDataset(x[idx_train], y[idx_train], num_classes=10, flip=False),
        test=ArrayDataset(x[idx_test], y[idx_test], num_classes=10, flip=False),
        name="digits",
        class_names=names,
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
#: :func:`fedgo_flwr.partition.component_partition`.
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


def _load_four_gaussians() -> DataBundle:
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


def _load_cifar(name: str, *, path: str | None, download: bool) -> DataBundle:
    """CIFAR via torchvision; ``.data`` (N, 32, 32, 3) -> (N, 3, 32, 32) uint8."""
    from torchvision import datasets

    root = os.path.expanduser(path or DEFAULT_TORCHVISION_ROOT)
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


# ------------------------------------------------------------------------------------------
# ImageFolder with .npy cache
# ------------------------------------------------------------------------------------------

_CACHE_VERSION = 1
# Decode with a process pool only for trees at least this large (pool start-up is not free).
_PARALLEL_MIN_FILES = 4096
_CHUNK = 1024
# Number of decode processes; None = automatic (see _decode_workers).
_DECODE_WORKERS: int | None = None
_CACHE_FILE_MODE = 0o644  # mkstemp creates 0600 files; the cache may be shared


def _list_split(split_dir: Path) -> tuple[list[str], list[Path], list[int]]:
    """Sorted class names, sorted image files and their labels under ``split_dir/<class>/``."""
    if not split_dir.is_dir():
        raise FileNotFoundError(f"image folder split not found: {split_dir}")
    classes = sorted(
        e.name for e in os.scandir(split_dir) if e.is_dir() and not e.name.startswith(".")
    )
    files: list[Path] = []
    labels: list[int] = []
    for label, cls in enumerate(classes):
        found: list[Path] = []
        for dirpath, dirnames, filenames in os.walk(split_dir / cls):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            found.extend(
                Path(dirpath) / f for f in filenames if f.lower().endswith(IMAGE_EXTENSIONS)
            )
        found.sort()
        files.extend(found)
        labels.extend([label] * len(found))
    return classes, files, labels


def _decode_image(file: Path) -> np.ndarray:
    """Decode one image file into an ``(H, W, 3)`` ``uint8`` RGB array."""
    from PIL import Image

    try:
        with Image.open(file) as im:
            return np.asarray(im.convert("RGB"), dtype=np.uint8)
    except OSError as exc:
        raise ValueError(f"cannot decode image file {file}: {exc}") from exc


def _decode_chunk(files: Sequence[Path], hw: tuple[int, int]) -> np.ndarray:
    """Decode ``files`` into ``(n, 3, H, W)``; every image must be ``hw`` pixels."""
    out = np.empty((len(files), 3, hw[0], hw[1]), dtype=np.uint8)
    for i, f in enumerate(files):
        arr = _decode_image(f)
        if arr.shape[:2] != hw:
            raise ValueError(
                f"image {f} is {arr.shape[1]}x{arr.shape[0]} (WxH) but the first image of the "
                f"tree is {hw[1]}x{hw[0]}; all images of an imagefolder dataset must share one size"
            )
        out[i] = arr.transpose(2, 0, 1)
    return out


def _decode_workers() -> int:
    """Decode processes: ``_DECODE_WORKERS`` if set, else ``min(8, CPUs)`` on >= 4 CPUs, else 1.

    On 2-core machines the fork + IPC overhead ate the gain (CIFAR-10 JPEGs: 10k images in 0.8 s
    serially vs 1.0 s with 2 processes), so small machines decode serially.
    """
    if _DECODE_WORKERS is not None:
        return max(1, int(_DECODE_WORKERS))
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        cpus = os.cpu_count() or 1
    return min(8, cpus) if cpus >= 4 else 1


def _decode_files(files: list[Path], hw: tuple[int, int]) -> np.ndarray:
    """Decode all ``files`` in order, in parallel processes for large trees (deterministic)."""
    chunks = [files[i : i + _CHUNK] for i in range(0, len(files), _CHUNK)]
    workers = _decode_workers()
    if len(files) >= _PARALLEL_MIN_FILES and workers > 1:
        try:
            import multiprocessing as mp

            ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
                parts = list(pool.map(_decode_chunk, chunks, [hw] * len(chunks)))
            return np.concatenate(parts)
        except ValueError:
            raise
        except Exception as exc:  # pool unavailable (daemonic process, sandbox, ...)
            log.warning("parallel image decoding failed (%s); decoding serially", exc)
    out = np.empty((len(files), 3, hw[0], hw[1]), dtype=np.uint8)
    for i, chunk in enumerate(chunks):
        out[i * _CHUNK : i * _CHUNK + len(chunk)] = _decode_chunk(chunk, hw)
    return out


def _tree_key(root: Path, splits: dict[str, list[Path]]) -> str:
    """Hash of (absolute root, every file's relative path, size and mtime)."""
    h = hashlib.sha256()
    h.update(f"fedgo-imagefolder-v{_CACHE_VERSION}\0{root}\0".encode())
    for split, files in splits.items():
        h.update(f"[{split}]\0".encode())
        for f in files:
            st = f.stat()
            h.update(f"{f.relative_to(root).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:24]


def _cache_candidates(root: Path, cache_dir: str | None) -> list[Path]:
    if cache_dir is not None:
        return [Path(cache_dir).expanduser()]
    return [root / ".fedgo_cache", Path(DEFAULT_CACHE_ROOT).expanduser()]


def _is_writable_dir(d: Path) -> bool:
    try:
        d.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=d, prefix=".probe-"):
            pass
        return True
    except OSError:
        return False


def _atomic_save(target: Path, arr: np.ndarray) -> None:
    """``np.save`` to a temp file in the same directory, then ``os.replace``."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.save(fh, arr)
        os.chmod(tmp, _CACHE_FILE_MODE)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _atomic_write_text(target: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, _CACHE_FILE_MODE)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _read_cache(entry: Path) -> dict[str, Any] | None:
    """Load a complete cache entry (``meta.json`` is written last), else ``None``."""
    meta_file = entry / "meta.json"
    if not meta_file.is_file():
        return None
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        arrays = {
            f"{s}_{a}": np.load(entry / f"{s}_{a}.npy", mmap_mode="r" if a == "x" else None)
            for s in ("train", "test")
            for a in ("x", "y")
        }
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable imagefolder cache %s (%s)", entry, exc)
        return None
    return {"meta": meta, **arrays}


def load_imagefolder(path: str, *, cache_dir: str | None = None, flip: bool = True) -> DataBundle:
    """Load ``path/train/<class>/*`` and ``path/test/<class>/*`` images as a :class:`DataBundle`.

    Classes are the sorted subfolder names of ``train`` (``test`` must have the same set).  Images
    (``.jpg``, ``.jpeg``, ``.png``) are converted to RGB and must all share one size.  The decoded
    arrays are cached once as ``.npy`` files in ``cache_dir`` (default ``path/.fedgo_cache``, or
    ``~/.cache/fedgo_flwr`` if that is not writable) under a key hashing the absolute path and every
    file's name, size and mtime; later loads memory-map the cache.  Cache files are written
    atomically, so concurrent loaders are safe.

    Args:
        path: Root of the tree.
        cache_dir: Override of the cache directory.
        flip: Value of :attr:`ArrayDataset.flip` (natural images: ``True``).

    Raises:
        FileNotFoundError: ``path/train`` or ``path/test`` missing.
        ValueError: Different class sets, no images, undecodable files or mixed image sizes.
    """
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"imagefolder path {root} does not exist")
    classes, train_files, train_labels = _list_split(root / "train")
    test_classes, test_files, test_labels = _list_split(root / "test")
    if classes != test_classes:
        only_train = sorted(set(classes) - set(test_classes))
        only_test = sorted(set(test_classes) - set(classes))
        raise ValueError(
            f"train and test of {root} have different class folders: only in train: {only_train}, "
            f"only in test: {only_test}"
        )
    if not classes:
        raise ValueError(f"no class folders under {root / 'train'}")
    for split, files in (("train", train_files), ("test", test_files)):
        if not files:
            raise ValueError(
                f"no images ({'/'.join(IMAGE_EXTENSIONS)}) found under {root / split}/<class>/"
            )

    key = _tree_key(root, {"train": train_files, "test": test_files})
    candidates = _cache_candidates(root, cache_dir)
    for cand in candidates:
        cached = _read_cache(cand / f"imagefolder-{key}")
        if cached is not None:
            log.info("loaded imagefolder %s from cache %s", root, cand)
            return DataBundle(
                train=ArrayDataset(cached["train_x"], cached["train_y"], len(classes), flip=flip),
                test=ArrayDataset(cached["test_x"], cached["test_y"], len(classes), flip=flip),
                name="imagefolder",
                class_names=tuple(classes),
            )

    first = _decode_image(train_files[0])
    hw = (int(first.shape[0]), int(first.shape[1]))
    arrays = {
        "train_x": _decode_files(train_files, hw),
        "train_y": np.asarray(train_labels, dtype=np.int64),
        "test_x": _decode_files(test_files, hw),
        "test_y": np.asarray(test_labels, dtype=np.int64),
    }

    writable = next((c for c in candidates if _is_writable_dir(c)), None)
    if writable is None:
        log.warning("no writable cache directory among %s; imagefolder not cached", candidates)
    else:
        entry = writable / f"imagefolder-{key}"
        try:
            entry.mkdir(parents=True, exist_ok=True)
            for name, arr in arrays.items():
                _atomic_save(entry / f"{name}.npy", arr)
            meta = {
                "version": _CACHE_VERSION,
                "root": str(root),
                "classes": classes,
                "num_train": len(train_files),
                "num_test": len(test_files),
                "image_size": list(hw),
            }
            _atomic_write_text(entry / "meta.json", json.dumps(meta, indent=1))
        except OSError as exc:
            log.warning("could not write imagefolder cache %s (%s)", entry, exc)

    return DataBundle(
        train=ArrayDataset(arrays["train_x"], arrays["train_y"], len(classes), flip=flip),
        test=ArrayDataset(arrays["test_x"], arrays["test_y"], len(classes), flip=flip),
        name="imagefolder",
        class_names=tuple(classes),
    )


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

    E.g. ``load_hf_dataset("uoft-cs/cifar10")`` (``image_key="img"``, ``label_key="label"``).
    Images are converted to RGB ``uint8`` ``(N, C, H, W)`` and must share one size.

    Raises:
        ImportError: ``datasets`` is not installed.
    """
    try:
        import datasets as hf_datasets
    except ImportError as exc:
        raise ImportError(
            "load_hf_dataset needs the Hugging Face 'datasets' package: pip install datasets"
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
