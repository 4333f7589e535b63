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


def _read(archive: Path) -> dict[str, dict[str, bytes]]:
    """The archive's records by run (``variant/seedN`` -> file name -> bytes; absent: none);
    a member that is not a run record is refused."""
    if not archive.is_file():
        return {}
    runs: dict[str, dict[str, bytes]] = {}
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            match = _MEMBER.fullmatch(member.name)
            if not member.isfile() or not match or match["file"] not in RECORDS:
                raise ValueError(
                    f"{archive}: {member.name!r} is not a run record "
                    f"(<variant>/seed<N>/{{{','.join(RECORDS)}}})"
                )
            data = tar.extractfile(member)
            assert data is not None  # a regular file (checked above)
            runs.setdefault(match["run"], {})[match["file"]] = data.read()
    return runs


def restore(archive: Path, out: Path) -> list[str]:
    """Copy every finished run of ``archive`` (absent: none) into ``out`` whose folder holds no
    ``summary.json`` yet; return the runs restored (``variant/seedN``). A run in the archive
    without a summary is refused (the archive holds finished runs only)."""
    restored = []
    for run, files in sorted(_read(archive).items()):
        if SUMMARY not in files:
            raise ValueError(f"{archive}: {run} has no {SUMMARY}")
        folder = out / run
        if (folder / SUMMARY).is_file():
            continue
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (folder / name).write_bytes(data)
        restored.append(run)
    return restored


def pack(archive: Path, out: Path) -> list[str]:
    """Write the records of every finished run in ``out`` to ``archive`` (replacing it at
    once, never half-written); return the runs packed. Runs the archive held but ``out`` no
    longer has are kept (a sweep restores them first, so they were not run again)."""
    kept = _read(archive)
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
