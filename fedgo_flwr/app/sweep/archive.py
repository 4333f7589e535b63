"""A sweep's finished runs kept in one archive, so a sweep can go on on another machine.

A long sweep outlives the machine it started on (a session's machine is handed back, a cluster
job ends). With ``--archive PATH.tar.xz`` the sweep first **restores** every run the archive
holds into ``<out>/<variant>/seed<N>/`` (unless that folder already holds a finished run), and
**packs** the records of every finished run in ``out`` into the archive each time a run
finishes. The records are what the table and the resume check read, and nothing else: the
run's ``config.yaml`` (compared with the variant's configuration as for any finished run),
``metrics.jsonl`` (curves) and ``summary.json`` (the final metric; it marks a run finished).
Checkpoints and logs stay out, so the archive of a benchmark can be committed beside its table
(a few KB a run); the ``output_dir`` line of ``config.yaml`` (this machine's absolute folder,
which the resume check ignores) is kept as the run's place in ``--out``, ``<variant>/seed<N>``.
A restored run is skipped like a finished one; to run it again, delete its folder and its entry
in the archive (or the archive).
"""

from __future__ import annotations

import io
import os
import re
import tarfile
from pathlib import Path

from fedgo_flwr.app.sweep.table import SUMMARY

RECORDS = ("config.yaml", "metrics.jsonl", SUMMARY)
"""The files of a finished run that the archive keeps."""

_MEMBER = re.compile(r"(?P<run>[A-Za-z0-9_.+-]+/seed\d+)/(?P<file>[^/]+)")
_OUTPUT_DIR = re.compile(rb"^output_dir: .*$", re.MULTILINE)


def _record(folder: Path, name: str, run: str) -> bytes:
    """A record's bytes as archived: ``config.yaml``'s top-level ``output_dir`` as ``run``."""
    data = (folder / name).read_bytes()
    if name == "config.yaml":
        data = _OUTPUT_DIR.sub(b"output_dir: " + run.encode(), data, count=1)
    return data


def _runs(tar: tarfile.TarFile) -> dict[str, dict[str, tarfile.TarInfo]]:
    """The archive's members by run (``variant/seedN``); anything else is refused."""
    runs: dict[str, dict[str, tarfile.TarInfo]] = {}
    for member in tar.getmembers():
        match = _MEMBER.fullmatch(member.name)
        if not member.isfile() or not match or match["file"] not in RECORDS:
            raise ValueError(
                f"{tar.name}: {member.name!r} is not a run record "
                f"(<variant>/seed<N>/{{{','.join(RECORDS)}}})"
            )
        runs.setdefault(match["run"], {})[match["file"]] = member
    return runs


def restore(archive: Path, out: Path) -> list[str]:
    """Copy every finished run of ``archive`` (absent: none) into ``out`` whose folder holds no
    ``summary.json`` yet; return the runs restored (``variant/seedN``). A run in the archive
    without a summary is refused (the archive holds finished runs only)."""
    if not archive.is_file():
        return []
    restored = []
    with tarfile.open(archive) as tar:
        for run, files in sorted(_runs(tar).items()):
            if SUMMARY not in files:
                raise ValueError(f"{archive}: {run} has no {SUMMARY}")
            folder = out / run
            if (folder / SUMMARY).is_file():
                continue
            folder.mkdir(parents=True, exist_ok=True)
            for name, member in files.items():
                data = tar.extractfile(member)
                assert data is not None  # a regular file (checked by _runs)
                (folder / name).write_bytes(data.read())
            restored.append(run)
    return restored


def pack(archive: Path, out: Path) -> list[str]:
    """Write the records of every finished run in ``out`` to ``archive`` (replacing it at
    once, never half-written); return the runs packed. Runs the archive held but ``out`` no
    longer has are kept (a sweep restores them first, so they were not run again)."""
    kept: dict[str, dict[str, bytes]] = {}
    if archive.is_file():
        with tarfile.open(archive) as tar:
            for run, files in _runs(tar).items():
                kept[run] = {}
                for name, member in files.items():
                    data = tar.extractfile(member)
                    assert data is not None
                    kept[run][name] = data.read()
    for summary in out.glob(f"*/seed*/{SUMMARY}"):
        folder = summary.parent
        run = folder.relative_to(out).as_posix()
        if _MEMBER.fullmatch(f"{run}/{SUMMARY}"):
            kept[run] = {n: _record(folder, n, run) for n in RECORDS if (folder / n).is_file()}
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    with tarfile.open(partial, "w:xz") as tar:
        for run in sorted(kept):
            for name in sorted(kept[run]):
                data = kept[run][name]
                info = tarfile.TarInfo(f"{run}/{name}")
                info.size = len(data)
                info.mode = 0o644
                tar.addfile(info, io.BytesIO(data))
    os.replace(partial, archive)
    return sorted(kept)
