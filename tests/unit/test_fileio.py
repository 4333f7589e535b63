"""Atomic writes: whole files or none, no temporary files left, the permissions of a plain write."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import numpy as np
import pytest
import torch

from fedgo_flwr.runtime import fileio
from fedgo_flwr.runtime.fileio import (
    atomic_numpy_save,
    atomic_torch_save,
    atomic_write,
    atomic_write_bytes,
    atomic_write_text,
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_writes_replace_the_target_and_leave_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    assert atomic_write_text(target, "first") == target
    atomic_write_text(target, "zweite Fassung: ä")
    assert target.read_text(encoding="utf-8") == "zweite Fassung: ä"
    atomic_write_bytes(tmp_path / "b.bin", b"\x00\x01")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.bin"]


def test_torch_and_numpy_round_trip(tmp_path: Path) -> None:
    state = {"w": torch.arange(6.0).reshape(2, 3), "step": 3}
    atomic_torch_save(tmp_path / "s.pt", state)
    loaded = torch.load(tmp_path / "s.pt")
    assert torch.equal(loaded["w"], state["w"]) and loaded["step"] == 3
    arr = np.arange(12, dtype=np.uint8).reshape(3, 4)
    atomic_numpy_save(tmp_path / "x.npy", arr)
    assert np.array_equal(np.load(tmp_path / "x.npy"), arr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.pt", "x.npy"]


def test_a_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "keep.txt"
    target.write_text("old")

    def half_then_fail(fh) -> None:
        fh.write(b"half a fi")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        atomic_write(target, half_then_fail)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_permissions_are_those_of_a_plain_write_unless_given(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        plain = tmp_path / "plain"
        plain.write_text("x")
        atomic_write_text(tmp_path / "atomic", "x")
        assert _mode(tmp_path / "atomic") == _mode(plain) == 0o644
        os.umask(0o077)
        atomic_write_text(tmp_path / "private", "x")
        assert _mode(tmp_path / "private") == 0o600
        atomic_write_text(tmp_path / "shared", "x", mode=0o644)
        assert _mode(tmp_path / "shared") == 0o644
    finally:
        os.umask(old)


def test_the_folder_is_synced_after_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[Path] = []
    monkeypatch.setattr(fileio, "_fsync_dir", synced.append)
    atomic_write_text(tmp_path / "a.txt", "x")
    assert synced == [tmp_path]


def test_a_write_replaces_a_planted_link_and_leaves_its_target(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "out").symlink_to(victim)
    fileio.atomic_write_text(tmp_path / "out", "new")
    assert victim.read_text() == "precious"
    assert not (tmp_path / "out").is_symlink() and (tmp_path / "out").read_text() == "new"


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("../x", "'..' component"),
        ("a/../../x", "'..' component"),
        ("./x", "'.' or '..' component"),
        ("a//x", "empty"),
        ("", "empty"),
        ("/etc/passwd", "absolute path"),
        ("a\nb", "control character '\\n'"),
        ("a\0b", "control character '\\x00'"),
        ("x" * 256, "component of 256 bytes"),
    ],
)
def test_path_inside_refuses_a_name_that_leaves_its_folder(tmp_path, name, problem) -> None:
    with pytest.raises(fileio.UnsafePathError, match=re.escape(problem)):
        fileio.path_inside(tmp_path, name, "archive: member ")


def test_path_inside_refuses_a_link_at_any_part_below_the_folder(tmp_path) -> None:
    folder, elsewhere = tmp_path / "folder", tmp_path / "elsewhere"
    (folder / "a").mkdir(parents=True)
    elsewhere.mkdir()
    assert fileio.path_inside(folder, "a/b/c.txt") == folder / "a" / "b" / "c.txt"  # may not exist
    assert fileio.path_inside(folder, "x" * 255) == folder / ("x" * 255)
    (folder / "a" / "b").symlink_to(elsewhere)
    with pytest.raises(fileio.UnsafePathError, match=f"{folder / 'a' / 'b'} is a symbolic link"):
        fileio.path_inside(folder, "a/b/c.txt")
    (folder / "a" / "dangling").symlink_to(tmp_path / "missing")  # a link to nothing, too
    with pytest.raises(fileio.UnsafePathError, match="is a symbolic link"):
        fileio.path_inside(folder, "a/dangling")
    linked = tmp_path / "linked"
    linked.symlink_to(folder)  # the folder itself is the caller's choice: taken as given
    assert fileio.path_inside(linked, "a/c.txt") == linked / "a" / "c.txt"


# -- a link planted between a check and the write ---------------------------------------------
def _planting(monkeypatch, plant, *modules) -> None:
    """``path_inside`` (of ``fileio`` and of ``modules``) that plants a link (``plant()``)
    right after its check passed: the race a check-then-write leaves open."""
    real = fileio.path_inside

    def checked_then_planted(folder, name, what=""):
        path = real(folder, name, what)
        plant(name)
        return path

    for module in (fileio, *modules):
        monkeypatch.setattr(module, "path_inside", checked_then_planted)


def test_atomic_write_inside_makes_folders_and_replaces_a_link_at_the_name(
    tmp_path, monkeypatch
) -> None:
    """Folders are made; a link at the name fails the check (as :func:`path_inside`), and one
    planted there after the check is replaced by the file, its target untouched."""
    out, victim = tmp_path / "out", tmp_path / "victim"
    victim.write_text("precious")
    write = lambda fh: fh.write(b"data")  # noqa: E731
    assert fileio.atomic_write_inside(out, "a/b/f.txt", write) == out / "a" / "b" / "f.txt"
    assert (out / "a" / "b" / "f.txt").read_bytes() == b"data"
    (out / "a" / "g.txt").symlink_to(victim)
    with pytest.raises(fileio.UnsafePathError, match="is a symbolic link this run did not make"):
        fileio.atomic_write_inside(out, "a/g.txt", write)
    (out / "a" / "g.txt").unlink()
    _planting(monkeypatch, lambda _: (out / "a" / "g.txt").symlink_to(victim))
    fileio.atomic_write_inside(out, "a/g.txt", write, mode=0o640)
    assert victim.read_text() == "precious" and not (out / "a" / "g.txt").is_symlink()
    assert (out / "a" / "g.txt").read_bytes() == b"data" and _mode(out / "a" / "g.txt") == 0o640
    assert sorted(p.name for p in (out / "a").iterdir()) == ["b", "g.txt"]  # no temp file


def test_atomic_write_inside_never_follows_a_link_planted_after_the_check(
    tmp_path, monkeypatch
) -> None:
    """The check passes, then ``out/a`` becomes a link to another folder before the write:
    the write refuses it (``O_NOFOLLOW``), and nothing appears in the link's target."""
    out, victim = tmp_path / "out", tmp_path / "victim"
    out.mkdir()
    victim.mkdir()
    _planting(monkeypatch, lambda _: (out / "a").symlink_to(victim, target_is_directory=True))
    with pytest.raises(fileio.UnsafePathError, match="is a symbolic link this run did not make"):
        fileio.atomic_write_inside(out, "a/f.txt", lambda fh: fh.write(b"x"), what="w: ")
    assert list(victim.iterdir()) == []


def test_open_append_refuses_a_link_and_appends_otherwise(tmp_path) -> None:
    victim, target = tmp_path / "victim", tmp_path / "metrics.jsonl"
    victim.write_text("precious\n")
    with fileio.open_append(target) as fh:
        fh.write("a\n")
    with fileio.open_append(target) as fh:
        fh.write("b\n")
    assert target.read_text() == "a\nb\n"
    link = tmp_path / "run.log"
    link.symlink_to(victim)
    with pytest.raises(fileio.UnsafePathError, match="is a symbolic link this run did not make"):
        fileio.open_append(link)
    assert victim.read_text() == "precious\n"


def test_latest_is_never_followed_nor_a_folder_put_there_replaced(tmp_path, monkeypatch) -> None:
    """``latest`` as a link to another folder is replaced (its target untouched); a folder
    made at ``latest`` between the check and the rename is one ``FileExistsError`` naming it
    (before: a raw ``IsADirectoryError``), the folder kept and no temporary link left."""
    from fedgo_flwr.records import runfolders

    parent, victim = tmp_path / "exp", tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("precious")
    first = runfolders.new_run_folder(parent)
    (parent / "latest").symlink_to(victim, target_is_directory=True)
    runfolders.point_latest(first)
    assert os.readlink(parent / "latest") == first.name
    assert sorted(p.name for p in victim.iterdir()) == ["keep"]
    second = parent / "second"
    second.mkdir()
    real = runfolders.latest_problem

    def raced(folder):
        problem = real(folder)
        (parent / "latest").unlink()
        (parent / "latest").mkdir()  # a folder appears after the check
        (parent / "latest" / "mine").write_text("x")
        return problem

    monkeypatch.setattr(runfolders, "latest_problem", raced)
    with pytest.raises(FileExistsError, match="latest is a folder"):
        runfolders.point_latest(second)
    assert (parent / "latest" / "mine").read_text() == "x"
    assert not [p for p in parent.iterdir() if p.name.startswith(".latest")]
