"""Image-folder datasets: ``path/{train,test}/<class>/*.{jpg,jpeg,png}`` decoded once, cached.

:func:`load_imagefolder` lists the tree (sorted classes and files), decodes every image to RGB with
PIL (in a process pool for large trees) and keeps the arrays as ``.npy`` files in a cache entry
keyed by the tree's paths, sizes and mtimes; later loads memory-map the cache. Cache files are
written atomically (:mod:`fedgo_flwr.runtime.fileio`) and ``meta.json`` last, so an entry is
complete once ``meta.json`` exists and concurrent loaders are safe.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from fedgo_flwr.data.arrays import ArrayDataset, DataBundle
from fedgo_flwr.runtime.fileio import atomic_numpy_save, atomic_write_text, strict_json

__all__ = ["DEFAULT_CACHE_ROOT", "IMAGE_EXTENSIONS", "load_imagefolder", "load_unlabeled"]

log = logging.getLogger(__name__)

DEFAULT_CACHE_ROOT = "~/.cache/fedgo_flwr"
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")

_CACHE_VERSION = 1
# Decode with a process pool only for trees at least this large (pool start-up is not free).
_PARALLEL_MIN_FILES = 4096
_CHUNK = 1024
# Number of decode processes; None = automatic (see _decode_workers).
_DECODE_WORKERS: int | None = None
_CACHE_FILE_MODE = 0o644  # the cache may be shared with other users


def _list_split(split_dir: Path) -> tuple[list[str], list[str], list[int]]:
    """Sorted class names, sorted image files (paths as strings) and their labels under
    ``split_dir/<class>/``.

    Files are sorted by their path components, the order of sorting them as ``Path`` objects
    (``a/b`` before ``a-c``), with plain strings: a 60,000-image tree is listed and keyed on
    every load, and ``Path`` objects made that cost seconds a process.
    """
    if not split_dir.is_dir():
        raise FileNotFoundError(f"image folder split not found: {split_dir}")
    classes = sorted(
        e.name for e in os.scandir(split_dir) if e.is_dir() and not e.name.startswith(".")
    )
    files: list[str] = []
    labels: list[int] = []
    for label, cls in enumerate(classes):
        found: list[str] = []
        for dirpath, dirnames, filenames in os.walk(os.path.join(split_dir, cls)):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            found.extend(
                os.path.join(dirpath, f) for f in filenames if f.lower().endswith(IMAGE_EXTENSIONS)
            )
        found.sort(key=lambda f: f.split(os.sep))
        files.extend(found)
        labels.extend([label] * len(found))
    return classes, files, labels


def _decode_image(file: str | Path) -> np.ndarray:
    """Decode one image file into an ``(H, W, 3)`` ``uint8`` RGB array."""
    from PIL import Image

    try:
        with Image.open(file) as im:
            return np.asarray(im.convert("RGB"), dtype=np.uint8)
    except OSError as exc:
        raise ValueError(f"cannot decode image file {file}: {exc}") from exc


def _decode_chunk(files: Sequence[str | Path], hw: tuple[int, int]) -> np.ndarray:
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

    On 2-core machines the fork and the copies between processes cost more than the second
    core gains (``benchmarks/studies/performance.md``, "Two small measurements"), so small
    machines decode serially.
    """
    if _DECODE_WORKERS is not None:
        return max(1, int(_DECODE_WORKERS))
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        cpus = os.cpu_count() or 1
    return min(8, cpus) if cpus >= 4 else 1


def _decode_files(files: Sequence[str | Path], hw: tuple[int, int]) -> np.ndarray:
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


def _tree_key(root: Path, splits: dict[str, list[str]]) -> str:
    """Hash of (absolute root, every file's path relative to it, size and mtime)."""
    h = hashlib.sha256()
    h.update(f"fedgo-imagefolder-v{_CACHE_VERSION}\0{root}\0".encode())
    prefix = len(str(root)) + 1  # the files are listed under root: their paths start with it
    for split, files in splits.items():
        h.update(f"[{split}]\0".encode())
        for f in files:
            st = os.stat(f)
            relative = f[prefix:].replace(os.sep, "/")
            h.update(f"{relative}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
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
                atomic_numpy_save(entry / f"{name}.npy", arr, mode=_CACHE_FILE_MODE)
            meta = {
                "version": _CACHE_VERSION,
                "root": str(root),
                "classes": classes,
                "num_train": len(train_files),
                "num_test": len(test_files),
                "image_size": list(hw),
            }
            atomic_write_text(
                entry / "meta.json",
                strict_json(meta, name="meta.json", indent=1),
                mode=_CACHE_FILE_MODE,
            )
        except OSError as exc:
            log.warning("could not write imagefolder cache %s (%s)", entry, exc)

    return DataBundle(
        train=ArrayDataset(arrays["train_x"], arrays["train_y"], len(classes), flip=flip),
        test=ArrayDataset(arrays["test_x"], arrays["test_y"], len(classes), flip=flip),
        name="imagefolder",
        class_names=tuple(classes),
    )


def load_unlabeled(path: str, size: tuple[int, int] | None = None) -> ArrayDataset:
    """Every image under ``path`` (any depth, sorted, hidden folders skipped) as an unlabeled
    :class:`ArrayDataset` (labels 0, one class), resized to ``size`` = ``(H, W)`` if given.

    For a public distillation set such as STL-10's unlabeled split (CPFL distils CIFAR-10
    models on it, 96x96 images resized to 32x32). Images must share one size before resizing.

    Raises:
        FileNotFoundError: ``path`` is not a folder.
        ValueError: no images, an undecodable file or mixed sizes (the file is named).
    """
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        raise FileNotFoundError(f"public image folder {root} does not exist")
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        files.extend(Path(dirpath) / f for f in filenames if f.lower().endswith(IMAGE_EXTENSIONS))
    if not files:
        raise ValueError(f"no {'/'.join(IMAGE_EXTENSIONS)} images under {root}")
    files.sort()
    first = _decode_image(files[0])
    x = _decode_files(files, first.shape[:2])
    if size is not None and tuple(x.shape[2:]) != tuple(size):
        import torch
        import torch.nn.functional as F

        out = np.empty((len(x), 3, *size), dtype=np.uint8)
        for s in range(0, len(x), _CHUNK):
            part = torch.from_numpy(x[s : s + _CHUNK]).float()
            part = F.interpolate(part, size=tuple(size), mode="bilinear", antialias=True)
            out[s : s + _CHUNK] = part.round().clamp(0, 255).to(torch.uint8).numpy()
        x = out
    return ArrayDataset(x=x, y=np.zeros(len(x), dtype=np.int64), num_classes=1, flip=True)
