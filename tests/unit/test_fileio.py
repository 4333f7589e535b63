"""Atomic writes: whole files or none, no temporary files left, the permissions of a plain write."""

from __future__ import annotations

import os
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
