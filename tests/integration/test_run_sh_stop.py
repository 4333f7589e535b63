"""``./run.sh --stop``: it stops the processes a run recorded as its own (``pids`` in the run's
Flower home, each with its start time) and those that carry the run's ``FLWR_HOME``, and no
other process, also not one that now holds a recorded PID (another start time).

The processes here are stand-ins (``sleep``), so the test needs no Flower start-up; the real
SuperLink, SuperExec and Ray below it are stopped by the same code as after a run
(``stop_tree``, ``tests/e2e/test_run_sh.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/environ").exists(), reason="the FLWR_HOME look-up reads Linux's /proc"
)


def _start(*args: str, home: Path | None = None, session: bool = True) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "FLWR_HOME"}
    if home is not None:
        env["FLWR_HOME"] = str(home)
    proc = subprocess.Popen(list(args), env=env, start_new_session=session)
    # Reaped at once, as init reaps a stopped run's processes: no zombie looks alive to --stop.
    threading.Thread(target=proc.wait, daemon=True).start()
    return proc


def _record(pids: Path, role: str, pid: int) -> None:
    subprocess.run(
        ["bash", "-c", f'source deploy/proc.sh && record_pid "{pids}" {role} {pid}'],
        cwd=ROOT,
        check=True,
    )


def _gone(proc: subprocess.Popen, within: float = 5.0) -> bool:
    try:
        proc.wait(within)
    except subprocess.TimeoutExpired:
        return False
    return True


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def _stop(homes: Path, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "FEDGO_FLWR_HOMES": str(homes), "FEDGO_VENV": sys.prefix}
    return subprocess.run(
        [str(ROOT / "run.sh"), "--stop", *args], cwd=cwd, env=env, capture_output=True, text=True
    )


def test_stop_ends_the_runs_recorded_processes_and_leaves_every_other_process(tmp_path):
    homes = tmp_path / "homes"
    home = homes / "run.abc123"
    (home / "app").mkdir(parents=True)
    (home / "superlink.log").write_text("kept\n")
    pids = home / "pids"
    # The SuperLink stand-in, in a session of its own with a child (its SuperExec, Ray ...).
    link = _start("bash", "-c", "sleep 300 & wait", home=home)
    # A process of the run whose parent is gone: found by its FLWR_HOME alone.
    orphan = _start("sleep", "301", home=home)
    # Not ours: another run's home (whose name starts with this one's), and one whose PID the
    # record names with another start time (the recorded process ended, the PID went to it).
    other_run = _start("sleep", "302", home=homes / "run.abc1234")
    reused = _start("sleep", "303", home=None)
    stranger_session = _start("sleep", "304", home=None, session=False)
    procs = [link, orphan, other_run, reused, stranger_session]
    try:
        for _ in range(50):
            if _children(link.pid):
                break
            time.sleep(0.05)
        (grandchild,) = _children(link.pid)
        _record(pids, "superlink", link.pid)
        line = f"run.sh {reused.pid} Mon Jan  1 00:00:00 2001\n"
        pids.write_text(pids.read_text() + line)

        out = _stop(homes)
        assert out.returncode == 0, out.stderr
        assert f"stopped the run of {home}" in out.stdout
        assert f"SuperLink {link.pid}" in out.stdout and "run.sh" not in out.stdout
        assert _gone(link) and _gone(orphan) and not _alive(grandchild)
        for proc in (other_run, reused, stranger_session):
            assert proc.poll() is None, proc.args
        # The home of a run that did not finish keeps its logs, not the app's files.
        assert (home / "superlink.log").is_file()
        assert not pids.exists() and not (home / "app").exists()

        again = _stop(homes)
        assert again.returncode == 0 and "no run of this checkout's run.sh was running" in (
            again.stdout
        )
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_stop_of_a_named_home_leaves_the_other_runs(tmp_path):
    """``--stop HOME`` (relative to the caller's folder) stops that run only; a path that is no
    run's home, or no folder, is said so."""
    homes = tmp_path / "homes"
    mine, other = homes / "run.mine", homes / "run.other"
    procs = []
    try:
        for home in (mine, other):
            home.mkdir(parents=True)
            proc = _start("sleep", "300", home=home)
            procs.append(proc)
            _record(home / "pids", "superlink", proc.pid)
        out = _stop(homes, "homes/run.mine", str(tmp_path), "no-such", cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert _gone(procs[0]) and procs[1].poll() is None
        assert f"stopped the run of {mine}: SuperLink {procs[0].pid}" in out.stdout
        assert f"{tmp_path} is no Flower home of a running run.sh run" in out.stderr
        assert "no folder no-such" in out.stderr
        assert (other / "pids").is_file()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
