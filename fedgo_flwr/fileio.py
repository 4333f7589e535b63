"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Every writer goes through :func:`atomic_write`: the content is written to a temporary file in the
target's folder (same file system, so the rename is atomic), flushed and ``fsync``-ed, renamed
over the target with ``os.replace``, and then the folder is ``fsync``-ed so the rename itself
survives a power loss. On any error the temporary file is removed and the target is untouched.

The temporary file is created like ``open(path, "w")`` would create the target (mode ``0o666``
less the umask), so the written file has the permissions a plain write would give it; ``mode``
sets them explicitly (e.g. ``0o644`` for a cache that other users read).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

__all__ = [
    "atomic_numpy_save",
    "atomic_torch_save",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_text",
]


def atomic_write(
    path: str | os.PathLike[str], write: Callable[[IO[bytes]], Any], *, mode: int | None = None
) -> Path:
    """Write ``path`` atomically: ``write(fh)`` fills a binary temp file that replaces ``path``.

    Args:
        path: The target file; its folder must exist.
        write: Writes the content to the open binary file it is given.
        mode: Permission bits of the written file (default: ``0o666`` less the umask).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    fd = os.open(tmp, flags, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)
    return target


def atomic_write_bytes(
    path: str | os.PathLike[str], data: bytes, *, mode: int | None = None
) -> Path:
    """Write ``data`` to ``path`` atomically."""
    return atomic_write(path, lambda fh: fh.write(data), mode=mode)


def atomic_write_text(
    path: str | os.PathLike[str], text: str, *, encoding: str = "utf-8", mode: int | None = None
) -> Path:
    """Write ``text`` (encoded with ``encoding``) to ``path`` atomically."""
    return atomic_write_bytes(path, text.encode(encoding), mode=mode)


def atomic_torch_save(path: str | os.PathLike[str], obj: Any, *, mode: int | None = None) -> Path:
    """``torch.save(obj, path)``, atomically."""
    return atomic_write(path, lambda fh: torch.save(obj, fh), mode=mode)


def atomic_numpy_save(
    path: str | os.PathLike[str], arr: np.ndarray, *, mode: int | None = None
) -> Path:
    """``np.save(path, arr)``, atomically (``path`` is used as given: no ``.npy`` is appended)."""
    return atomic_write(path, lambda fh: np.save(fh, arr), mode=mode)


def _fsync_dir(folder: Path) -> None:
    """Flush a folder's entries (the rename) to disk; a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - file systems without directory fsync
        pass
    finally:
        os.close(fd)
