"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Every writer goes through :func:`atomic_write`: the content is written to a temporary file in the
target's folder (same file system, so the rename is atomic), flushed and ``fsync``-ed, renamed
over the target with ``os.replace``, and then the folder is ``fsync``-ed so the rename itself
survives a power loss. On any error the temporary file is removed and the target is untouched.

A symbolic link at the target is replaced, never followed: the temporary file is created with
``O_EXCL`` (which does not follow a link) and ``os.replace`` renames it onto the link's own name,
so a link planted where a file is written redirects nothing. :func:`path_inside` checks a name
inside a folder before anything is written or read there: it stays inside (no absolute name, no
``..``) and no part of the path below the folder is a link. A check and a later write are two
steps, and a link planted between them would still be followed by a write through its folders;
:func:`atomic_write_inside` closes that gap: it opens each folder below the given one relative
to the one above with ``O_NOFOLLOW`` and writes and renames relative to the last one's
descriptor (``dir_fd``), so no link below the folder is followed, whenever it appeared.
:func:`open_append` opens a file for appending with ``O_NOFOLLOW``.

The temporary file is created like ``open(path, "w")`` would create the target (mode ``0o666``
less the umask), so the written file has the permissions a plain write would give it; ``mode``
sets them explicitly (e.g. ``0o644`` for a cache that other users read).

Every JSON file or line the project writes is made by :func:`strict_json`: strict JSON
(``allow_nan=False``, so no ``NaN`` or ``Infinity``, which are not JSON). A non-finite float
(NaN, +-inf; also a numpy float or 0-d array) is written as ``null``, in a dict (the key stays)
and in a list alike -- the convention the run files always had (``metrics.jsonl``,
``summary.json``: ``null`` is "no value"), which keeps the keys and list lengths of a document
the same whatever its values. One WARNING per document names the dotted paths written so.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from collections.abc import Callable
from logging import WARNING
from pathlib import Path
from typing import IO, Any

import numpy as np
from flwr.supercore import log

from fedgo_flwr.config.names import path_problem

__all__ = [
    "UnsafePathError",
    "atomic_numpy_save",
    "atomic_torch_save",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_inside",
    "atomic_write_text",
    "open_append",
    "path_inside",
    "strict_json",
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


class UnsafePathError(ValueError):
    """A name that would leave its folder, or a path through a link this code did not make."""


def path_inside(folder: str | os.PathLike[str], name: str, what: str = "") -> Path:
    """``folder / name``, once it is safe to write or read there; else :class:`UnsafePathError`.

    ``name`` is ``/``-separated and relative: not absolute, no empty, ``.`` or ``..``
    component, no control character, no component over 255 bytes
    (:func:`fedgo_flwr.config.names.path_problem`), so it stays inside ``folder``. Every
    part of the path below ``folder`` that exists must not be a symbolic link: a link planted
    there (``out/variant -> /elsewhere``) would carry a write or a read out of the folder.
    ``folder`` itself is taken as given (the user's choice). ``what`` starts the error
    message (e.g. ``"runs.tar.xz: member "``).
    """
    problem = path_problem(name, relative=True)
    if problem is not None:
        raise UnsafePathError(f"{what}{name!r} {problem}")
    path = Path(folder)
    for part in name.split("/"):
        path = path / part
        if path.is_symlink():
            raise UnsafePathError(
                f"{what}{name!r}: {path} is a symbolic link this run did not make; nothing is "
                "written or read through it (remove it)"
            )
    return path


_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _link_error(what: str, name: str, path: Path) -> UnsafePathError:
    return UnsafePathError(
        f"{what}{name!r}: {path} is a symbolic link this run did not make (or not a folder); "
        "nothing is written or read through it (remove it)"
    )


def _open_below(folder: Path, parts: list[str], name: str, what: str) -> int:
    """A descriptor of the folder ``folder/parts[0]/...``, each part made if missing and opened
    relative to the one above with ``O_NOFOLLOW`` (a link there, or a file, is
    :class:`UnsafePathError`); ``folder`` itself is opened as given."""
    fd = os.open(folder, _DIR_FLAGS)
    path = folder
    try:
        for part in parts:
            path = path / part
            try:
                os.mkdir(part, 0o777, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                below = os.open(part, _DIR_FLAGS | _NOFOLLOW, dir_fd=fd)
            except OSError as exc:  # ELOOP: a link; ENOTDIR: a file
                raise _link_error(what, name, path) from exc
            os.close(fd)
            fd = below
    except BaseException:
        os.close(fd)
        raise
    return fd


def atomic_write_inside(
    folder: str | os.PathLike[str],
    name: str,
    write: Callable[[IO[bytes]], Any],
    *,
    what: str = "",
    mode: int | None = None,
) -> Path:
    """Write ``folder / name`` atomically, never through a link below ``folder``.

    ``name`` is checked as :func:`path_inside` checks it (the error names it, after
    ``what``); its folders are made where missing. Unlike :func:`atomic_write` on
    :func:`path_inside`'s path, nothing is looked up by path after the check: each folder below
    ``folder`` is opened relative to the one above with ``O_NOFOLLOW``, and the temporary file
    is made (``O_EXCL | O_NOFOLLOW``), renamed over the target (a link there is replaced) and
    the folder flushed, all relative to the last folder's descriptor. A link planted at any
    part between a check and the write is :class:`UnsafePathError`, never followed.
    ``folder`` itself is taken as given (the user's choice); its parent folders must exist.
    Returns the written path.
    """
    target = path_inside(folder, name, what)
    # os.replace takes dir fds where os.rename does (renameat); supports_dir_fd lists rename
    if not {os.open, os.mkdir, os.rename, os.unlink} <= os.supports_dir_fd:  # pragma: no cover
        return atomic_write(target, write, mode=mode)
    parts = name.split("/")
    Path(folder).mkdir(parents=True, exist_ok=True)
    dfd = _open_below(Path(folder), parts[:-1], name, what)
    try:
        tmp = f".{parts[-1]}.{uuid.uuid4().hex[:12]}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | getattr(os, "O_BINARY", 0)
        fd = os.open(tmp, flags, 0o666, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb") as fh:
                write(fh)
                fh.flush()
                if mode is not None:
                    os.fchmod(fh.fileno(), mode)
                os.fsync(fh.fileno())
            os.replace(tmp, parts[-1], src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except FileNotFoundError:
                pass
            raise
        _fsync_fd(dfd)
    finally:
        os.close(dfd)
    return target


def open_append(path: str | os.PathLike[str], encoding: str = "utf-8") -> IO[str]:
    """``open(path, "a")``, but never through a symbolic link at ``path`` (``O_NOFOLLOW``): a
    link there is :class:`UnsafePathError` naming it, so a link planted in a folder the code
    appends to (a run's ``metrics.jsonl``) redirects nothing."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if Path(path).is_symlink():
            raise UnsafePathError(
                f"{path} is a symbolic link this run did not make; nothing is appended "
                "through it (remove it)"
            ) from exc
        raise
    return os.fdopen(fd, "a", encoding=encoding)


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


def safe_torch_load(path: str | os.PathLike[str], what: str = "file") -> Any:
    """``torch.load(path, weights_only=True)`` on CPU; any failure is a ``ValueError`` naming
    ``path`` (a truncated file, or one that holds objects other than tensors and plain data,
    which weights_only loading refuses instead of running their code)."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - truncated, foreign or malicious files alike
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(
            f"{what} {path} is unreadable or holds more than tensors and plain data "
            f"(refused by torch.load(weights_only=True): {first})"
        ) from exc


def atomic_torch_save(path: str | os.PathLike[str], obj: Any, *, mode: int | None = None) -> Path:
    """``torch.save(obj, path)``, atomically."""
    import torch  # here: the report and the sweep's table write files without importing torch

    return atomic_write(path, lambda fh: torch.save(obj, fh), mode=mode)


def atomic_numpy_save(
    path: str | os.PathLike[str], arr: np.ndarray, *, mode: int | None = None
) -> Path:
    """``np.save(path, arr)``, atomically (``path`` is used as given: no ``.npy`` is appended)."""
    return atomic_write(path, lambda fh: np.save(fh, arr), mode=mode)


NAMED_PATHS = 10
"""At most this many dotted paths are named in :func:`strict_json`'s warning (then a count)."""


def strict_json(
    obj: Any,
    *,
    name: str = "JSON",
    nan_is_missing: bool = False,
    default: Callable[[Any], Any] | None = None,
    **kwargs: Any,
) -> str:
    """``json.dumps(obj, allow_nan=False, **kwargs)`` with every non-finite float as ``null``.

    The formatting is ``json.dumps``'s with the same ``kwargs`` (``indent``, ``sort_keys``,
    ``separators`` ...): a document without non-finite floats comes out byte for byte as
    ``json.dumps(obj, **kwargs)`` would write it.

    Args:
        obj: What to serialise (dicts, lists, tuples, str, int, float, bool, ``None``; numpy
            scalars and 0-d arrays are written as their Python value).
        name: The document, for the warning (e.g. ``"prefl.json"``).
        nan_is_missing: NaN is the document's mark of "no value" (the recorder's rows:
            ``test_accuracy`` of a round that is not evaluated): NaN is written ``null``
            without a warning; infinities still warn.
        default: As ``json.dumps``'s, applied before the check, so what it returns (e.g.
            ``default=float`` of a tensor) is checked too.
        **kwargs: Passed on to :func:`json.dumps`.

    Returns:
        The JSON text. One WARNING names the dotted paths (``discriminators.3.disc_loss``,
        ``rounds.2``) of the non-finite values written as ``null``, if any.
    """
    found: list[str] = []
    clean = _finite(obj, "", found, default, nan_is_missing)
    if found:
        named = ", ".join(p or "(the top level)" for p in found[:NAMED_PATHS])
        more = f" and {len(found) - NAMED_PATHS} more" if len(found) > NAMED_PATHS else ""
        log(WARNING, "%s: non-finite values written as null at %s%s", name, named, more)
    return json.dumps(clean, allow_nan=False, **kwargs)


def _finite(
    value: Any,
    path: str,
    found: list[str],
    default: Callable[[Any], Any] | None,
    nan_is_missing: bool,
) -> Any:
    """``value`` with every non-finite float replaced by ``None``; their paths go to ``found``."""
    if isinstance(value, float):  # numpy float64 too
        if math.isfinite(value):
            return value
        if not (nan_is_missing and math.isnan(value)):
            found.append(path)
        return None
    if value is None or isinstance(value, str | int):  # bool is an int
        return value
    if isinstance(value, dict):
        return {
            k: _finite(v, f"{path}.{k}" if path else str(k), found, default, nan_is_missing)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [
            _finite(v, f"{path}.{i}" if path else str(i), found, default, nan_is_missing)
            for i, v in enumerate(value)
        ]
    if default is not None:  # as json.dumps would, but before the check
        out = default(value)
        return out if out is value else _finite(out, path, found, default, nan_is_missing)
    if isinstance(value, np.generic | np.ndarray) and np.ndim(value) == 0:
        return _finite(value.item(), path, found, default, nan_is_missing)
    return value  # json.dumps raises its TypeError


def _fsync_dir(folder: Path) -> None:
    """Flush a folder's entries (the rename) to disk; a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        _fsync_fd(fd)
    finally:
        os.close(fd)


def _fsync_fd(fd: int) -> None:
    """Flush an open folder's entries; file systems without directory fsync are skipped."""
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - file systems without directory fsync
        pass
