"""A new folder for every run: ``outputs/<name>/<date-time>/`` and ``outputs/<name>/latest``.

A run whose config leaves ``output_dir`` unset (``null``, the default) writes to a folder of
its own under ``outputs/<name>/`` (relative to ``$FEDGO_WORKDIR`` or the current directory,
as any relative ``output_dir``), named by its start time, ``%Y-%m-%d_%H-%M-%S``, with ``-1``,
``-2`` ... appended when a run started in the same second already holds that name. The folder
is claimed by creating it (``mkdir`` fails if it exists), so runs started side by side never
share one. ``latest`` beside it is a relative symbolic link to the newest folder, replaced
atomically once the new folder exists; ``resume: true`` continues the run it points to. A
``latest`` that is not a link (a folder or file someone put there) is never replaced:
:func:`latest_problem` names it before any folder is made.

Only names and folders here: :func:`fedgo_flwr.records.recorder.decide_output_dir` decides a
run's folder from its config, and :mod:`fedgo_flwr.records.report` reads dated folders as runs of
the experiment that holds them. Standard library only, so the report can import it cheaply.
"""

from __future__ import annotations

import datetime
import os
import re
import uuid
from pathlib import Path

__all__ = [
    "LATEST",
    "RUNS_ROOT",
    "STAMP_FORMAT",
    "is_run_stamp",
    "latest_problem",
    "latest_run",
    "new_run_folder",
    "point_latest",
]

RUNS_ROOT = "outputs"
"""The folder that holds one folder per experiment name, each holding its runs."""
LATEST = "latest"
"""The link, in an experiment's folder, to its newest run."""
STAMP_FORMAT = "%Y-%m-%d_%H-%M-%S"
"""A run folder's name: its start time (local time), then ``-N`` if that name was taken."""
STAMP_PATTERN = re.compile(r"\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}(-\d+)?")


def is_run_stamp(name: str) -> bool:
    """Whether ``name`` is the name of a dated run folder."""
    return STAMP_PATTERN.fullmatch(name) is not None


def new_run_folder(parent: Path, now: datetime.datetime | None = None) -> Path:
    """Create and return a new, empty run folder in ``parent``, named by ``now``'s time."""
    parent.mkdir(parents=True, exist_ok=True)
    stamp = (now or datetime.datetime.now()).strftime(STAMP_FORMAT)
    for n in range(10_000):
        folder = parent / (stamp if n == 0 else f"{stamp}-{n}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise FileExistsError(f"{parent}: 10000 run folders named {stamp}[-N] already")


def latest_problem(parent: Path) -> str | None:
    """Why ``parent/latest`` cannot be made the link to a new run (it exists and is not a
    link: a folder or a file that this code did not make and must not replace), or ``None``."""
    link = parent / LATEST
    if link.is_symlink() or not link.exists():
        return None
    return _not_a_link(link)


def _not_a_link(link: Path) -> str:
    kind = "a folder" if link.is_dir() else "a file"
    return (
        f"{link} is {kind}, not the link to the newest run kept there; move it away, or "
        "set output_dir"
    )


def point_latest(folder: Path) -> None:
    """Make ``<folder's parent>/latest`` a relative link to ``folder``, atomically (a link
    made beside it under an unpredictable name, then renamed over the old one, both relative
    to the parent folder's descriptor: a reader never finds it missing, and a link planted at
    ``latest`` is replaced, never followed). A ``latest`` that is not a link is left alone:
    :class:`FileExistsError` naming it, also when it appears between the check and the
    rename (a folder there: the rename fails and nothing is changed)."""
    link = folder.parent / LATEST
    problem = latest_problem(folder.parent)
    if problem is not None:
        raise FileExistsError(problem)
    dfd = os.open(folder.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    tmp = f".{LATEST}.{uuid.uuid4().hex[:12]}"
    try:
        os.symlink(folder.name, tmp, target_is_directory=True, dir_fd=dfd)
        try:
            os.replace(tmp, LATEST, src_dir_fd=dfd, dst_dir_fd=dfd)
        except OSError as exc:
            os.unlink(tmp, dir_fd=dfd)
            if os.path.lexists(link) and not os.path.islink(link):
                raise FileExistsError(_not_a_link(link)) from exc
            raise
    finally:
        os.close(dfd)


def latest_run(parent: Path) -> Path | None:
    """The run folder ``parent/latest`` points to, if it names an existing folder."""
    link = parent / LATEST
    if not link.is_symlink() or not link.is_dir():
        return None
    return link.resolve()
