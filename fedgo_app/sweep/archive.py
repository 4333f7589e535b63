"""A sweep's finished runs kept in one archive, so a sweep can go on on another machine.

A long sweep outlives the machine it started on (a session's machine is handed back, a cluster
job ends). With ``--archive PATH.tar.xz`` the sweep first **restores** every run the archive
holds into ``<out>/<variant>/seed<N>/`` (unless that folder already holds a finished run), and
**packs** the records of every finished run in ``out`` into the archive each time a run
finishes. The records are what the table and the resume check read, and nothing else: the
run's ``config.yaml``, ``metrics.jsonl``, ``summary.json`` (it marks a run finished) and
``env.json``. Checkpoints and logs stay out, so the archive of a benchmark can be committed
beside its table (a few KB a run). A restored run is skipped like a finished one; to run it
again, delete its folder and its entry in the archive (or the archive).

An archive is untrusted input (it comes from another machine): a member that is not a run's
record (a name other than ``<variant>/seed<N>/<record>``, a member that is not a regular file, a
record named twice, a run without a summary, a record that is not what a run writes) is refused
with one error naming the member and the archive, and **nothing** of that archive is restored.
Nothing is written through a link in ``--out`` either: one there before the restore refuses it
(:func:`fedgo_flwr.runtime.fileio.path_inside`), one planted while the runs are written is not
followed (:func:`fedgo_flwr.runtime.fileio.atomic_write_inside`) and stops the restore with the
same error; :func:`pack` leaves a run under a link out of the archive with a WARNING.
``docs/architecture.md`` ("Sweep archives") has each rule in full.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from logging import WARNING
from pathlib import Path

import yaml
from flwr.supercore import log

from fedgo_app.sweep.table import SUMMARY
from fedgo_app.sweep.variants import NAME
from fedgo_flwr.runtime.fileio import UnsafePathError, atomic_write_inside, path_inside

RECORDS = ("config.yaml", "metrics.jsonl", SUMMARY, "env.json")
"""The files of a finished run that the archive keeps."""

_MEMBER = re.compile(rf"(?P<run>(?:{NAME.pattern})/seed\d+)/(?P<file>[^/]+)")
"""A record's name in the archive: a variant's name (never ``.`` or ``..``), its seed, the file."""
_OUTPUT_DIR = re.compile(rb"^output_dir: .*$", re.MULTILINE)


def _record(folder: Path, name: str, run: str) -> bytes:
    """A record's bytes as archived: ``config.yaml``'s top-level ``output_dir`` as ``run``."""
    data = (folder / name).read_bytes()
    if name == "config.yaml":
        data = _OUTPUT_DIR.sub(b"output_dir: " + run.encode(), data, count=1)
    return data


def _kind(member: tarfile.TarInfo) -> str:
    """What a tar member is, for the error that refuses it."""
    if member.issym():
        return f"a symbolic link (to {member.linkname!r})"
    if member.islnk():
        return f"a hard link (to {member.linkname!r})"
    if member.isdir():
        return "a folder"
    if member.ischr() or member.isblk():
        return "a device"
    if member.isfifo():
        return "a named pipe"
    return "not a regular file"


def _record_problem(name: str, data: bytes) -> str | None:
    """Why a record's bytes are not what a run writes (the table and the resume check read
    them), or ``None``."""
    try:
        text = data.decode()
        if name in (SUMMARY, "env.json"):
            if not isinstance(json.loads(text), dict):
                return "is not a JSON object"
        elif name == "config.yaml":
            if not isinstance(yaml.safe_load(text), dict):
                return "is not a YAML mapping"
        else:
            for n, line in enumerate(text.splitlines(), 1):
                row = json.loads(line) if line.strip() else {}
                if not isinstance(row, dict) or type(row.get("round", 0)) is not int:
                    return f"line {n} is not a JSON object (with an integer 'round' if any)"
    except (UnicodeDecodeError, json.JSONDecodeError, yaml.YAMLError) as exc:
        return f"cannot be read ({type(exc).__name__})"
    return None


def _read(archive: Path) -> dict[str, dict[str, bytes]]:
    """The archive's records by run (``variant/seedN`` -> file name -> bytes; absent: none).
    Any member that is not a run record refuses the whole archive (``ValueError`` naming the
    member and the archive): nothing of it is read."""
    if not archive.is_file():
        return {}
    runs: dict[str, dict[str, bytes]] = {}
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            where = f"{archive}: member {member.name!r}"
            match = _MEMBER.fullmatch(member.name)
            if not match or match["file"] not in RECORDS:
                raise ValueError(
                    f"{where} is not a run record (<variant>/seed<N>/"
                    f"{{{','.join(RECORDS)}}}); nothing of the archive is restored"
                )
            if not member.isfile():
                raise ValueError(f"{where} is {_kind(member)}; nothing of the archive is restored")
            files = runs.setdefault(match["run"], {})
            if match["file"] in files:
                raise ValueError(f"{where} is there twice; nothing of the archive is restored")
            data = tar.extractfile(member)
            assert data is not None  # a regular file (checked above)
            files[match["file"]] = data.read()
            problem = _record_problem(match["file"], files[match["file"]])
            if problem is not None:
                raise ValueError(f"{where} {problem}; nothing of the archive is restored")
    return runs


def restore(archive: Path, out: Path) -> list[str]:
    """Copy every finished run of ``archive`` (absent: none) into ``out`` whose folder holds no
    ``summary.json`` yet; return the runs restored (``variant/seedN``). Refused, before any
    file is written (``ValueError`` naming the culprit): an archive with a member that is not a
    run record, a run without a summary, a link at any part of a run's path below ``out``."""
    runs = _read(archive)
    for run, files in sorted(runs.items()):
        if SUMMARY not in files:
            raise ValueError(
                f"{archive}: {run} has no {SUMMARY}; nothing of the archive is restored"
            )
        for name in files:
            path_inside(out, f"{run}/{name}", f"{archive}: restoring ")
    restored = []
    for run, files in sorted(runs.items()):
        if (out / run / SUMMARY).is_file():
            continue
        for name, data in files.items():
            # no link is followed, even one planted after the check above
            atomic_write_inside(out, f"{run}/{name}", _writer(data), what=f"{archive}: restoring ")
        restored.append(run)
    return restored


def _writer(data: bytes):
    return lambda fh: fh.write(data)


def pack(archive: Path, out: Path) -> list[str]:
    """Write the records of every finished run in ``out`` to ``archive`` (replacing it at
    once, never half-written); return the runs packed. Runs the archive held but ``out`` no
    longer has are kept (a sweep restores them first, so they were not run again)."""
    kept = _read(archive)
    for summary in out.glob(f"*/seed*/{SUMMARY}"):
        folder = summary.parent
        run = folder.relative_to(out).as_posix()
        if not _MEMBER.fullmatch(f"{run}/{SUMMARY}"):
            continue
        try:
            names = [n for n in RECORDS if path_inside(out, f"{run}/{n}").is_file()]
        except UnsafePathError as exc:
            log(WARNING, "sweep: %s not archived: %s", run, exc)
            continue
        kept[run] = {n: _record(folder, n, run) for n in names}
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
