"""``./run.sh --setup`` on a disk too small for torch: one clear error before anything is
installed (a full disk would otherwise stop pip halfway with "No space left on device").

``df`` and the Python that creates the venv are stand-ins on ``PATH``, so nothing is
downloaded: the stand-in Python passes the version check and then fails to create the venv,
which is how the test tells "refused for the disk" from "went on to set up"."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _setup(
    tmp_path: Path, available_kb: int, skip: bool, torch: bool = False
) -> subprocess.CompletedProcess:
    if torch:  # README's CPU-only torch, put into the venv before the set-up
        (tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "torch").mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    df = bin_dir / "df"
    df.write_text(
        "#!/bin/sh\n"
        'echo "Filesystem 1024-blocks Used Available Capacity Mounted on"\n'
        f'echo "/dev/x 300000000 1 {available_kb} 99% /"\n'
    )
    python = bin_dir / "python-standin"
    python.write_text(
        '#!/bin/sh\ncase "$1" in -c) exit 0 ;; esac\necho "no venv here" >&2\nexit 3\n'
    )
    for f in (df, python):
        f.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FEDGO_VENV": str(tmp_path / "venv"),
        "PYTHON": str(python),
    }
    env.pop("FEDGO_SKIP_DISK_CHECK", None)
    if skip:
        env["FEDGO_SKIP_DISK_CHECK"] = "1"
    return subprocess.run(
        ["bash", str(ROOT / "run.sh"), "--setup"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_disk_too_small_is_refused_with_the_space_it_has(tmp_path):
    out = _setup(tmp_path, available_kb=1024 * 1024, skip=False)  # 1 GB
    assert out.returncode == 1
    assert "needs about 7 GB free" in out.stderr and "has 1024 MB free" in out.stderr
    assert "FEDGO_SKIP_DISK_CHECK=1" in out.stderr
    assert "first run: a few minutes" not in out.stderr  # it never started to set up
    assert not (tmp_path / "venv").exists()


@pytest.mark.parametrize(
    ("available_kb", "skip", "torch"),
    [(8 * 1024 * 1024, False, False), (1024 * 1024, True, False), (1024 * 1024, False, True)],
    ids=["8GB", "skip", "torch-installed"],
)
def test_enough_space_the_override_or_torch_in_place_goes_on(tmp_path, available_kb, skip, torch):
    out = _setup(tmp_path, available_kb, skip, torch)
    assert "needs about 7 GB free" not in out.stderr
    assert "first run: a few minutes" in out.stderr  # then the stand-in Python fails
    assert out.returncode != 0 and "no venv here" in out.stderr
