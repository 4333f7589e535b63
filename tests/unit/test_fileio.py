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
