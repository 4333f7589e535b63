"""The README's main command path: ``./run.sh CONFIG overrides`` through ``flwr run``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from helpers import TINY_RUN, run_sh, tiny_config

from fedgo_app.inprocess import run_inprocess
from strategies import load_experiment

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def flower_processes(tag: str) -> set[int]:
    """Live Flower server-side processes (SuperLinks, SuperExecs, simulations) started by the
    run.sh call tagged ``tag``: they inherit its environment. Other runs on the machine (a
    benchmark, another test session) are not counted."""
    out = subprocess.run(
        ["pgrep", "-f", "flower-superlink|flower-superexec|flwr-simulation"],
        capture_output=True,
        text=True,
    )
    found = set()
    for pid in map(int, out.stdout.split()):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"FEDGO_TEST_TAG={tag}".encode() in env and alive(pid):
            found.add(pid)
    return found


def descendants(root: int) -> dict[int, str]:
    """Every live process below ``root`` (pid -> command line), across sessions."""
    out = subprocess.run(
        ["ps", "-ewwo", "pid=,ppid=,stat=,args="], capture_output=True, text=True
    ).stdout
    children: dict[int, list[tuple[int, str]]] = {}
    for line in out.splitlines():
        pid, ppid, stat, *cmd = line.split(maxsplit=3)
        if not stat.startswith("Z"):
            children.setdefault(int(ppid), []).append((int(pid), " ".join(cmd)))
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        for pid, cmd in children.get(todo.pop(), []):
            found[pid] = cmd
            todo.append(pid)
    return found


def flower_homes(out: Path) -> set[Path]:
    """The private Flower homes (``.flwr/run.*``) left by run.sh calls that wrote to ``out``."""
    configs = (ROOT / ".flwr").glob("run.*/run-config.toml")
    return {c.parent for c in configs if str(out) in c.read_text()}


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_bad_config_fails_fast_and_leaves_nothing_running(tmp_path):
    """The SuperLink boots while the config is checked; a bad config stops it again and
    removes the invocation's Flower home."""
    tag = uuid.uuid4().hex
    homes = tmp_path / "homes"  # this call's alone: run.sh calls of other tests run beside it
    out = tmp_path / "out"
    proc = run_sh(
        "conf/default.yaml",
        "data.alpha=-1",
        f"output_dir={out}",
        timeout=120,
        tag=tag,
        env={"FEDGO_FLWR_HOMES": str(homes)},
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "data.alpha = -1.0: must be > 0" in proc.stderr
    assert "override 'data.alpha=-1'" in proc.stderr
    assert not flower_processes(tag)
    assert not (out / "metrics.jsonl").exists()
    assert homes.is_dir() and not list(homes.iterdir())


def test_local_runs_the_experiment_in_one_process(tmp_path):
    tag = uuid.uuid4().hex
    tiny = ["rounds=1", "data.num_clients=2", "fraction=1.0", "train.local_epochs=1"]
    proc = run_sh("--local", "conf/scaffold.yaml", *tiny, f"output_dir={tmp_path}", tag=tag)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["strategy"] == "scaffold" and summary["rounds"] == 1
    assert json.loads(proc.stdout.strip().splitlines()[-1])["rounds"] == 1
    assert not flower_processes(tag)


def test_a_killed_run_resumes_to_the_same_metrics(tmp_path):
    """Kill ``./run.sh`` (its whole process group) mid-run, resume it with ``resume=true``:
    the SuperLink is gone after the kill, and the resumed run's metrics equal an uninterrupted
    in-process run's (same ServerApp/ClientApp code, same seeds).

    The resumed run is also the suite's check of the README's main command to its end: 4
    clients served by 2 simulated nodes, every round's replies, the summary, and its SuperLink
    stopped and its private Flower home (SuperLink address, run config, logs) removed after
    success. Through ``flwr run`` the ServerApp runs in Flower's process, yet the resumed run's
    env.json says what the user typed (run.sh hands it on in the run config) and keeps the
    first start's under ``earlier``, its summary's ``stage_times`` (run.sh's ``launch`` part,
    the killed run's ``earlier`` time) add up to ``total_time``, and run.log (written by the
    ServerApp, appended to on resume) ends with the done line."""
    import signal
    import time

    from fedgo_app.inprocess import run_inprocess
    from fedgo_flwr.records.checkpoint import load_checkpoint

    tiny = ["rounds=5", "data.num_clients=4", "fraction=0.5", "train.local_epochs=1"]
    tiny.append("strategy.name=scaffold")  # client state (c_i) must survive the restart too
    slow = "faults=[{partition: 0, round: 0, kind: hang, seconds: 1.5}]"  # slows rounds only
    out = tmp_path / "run"
    killed_log = (tmp_path / "killed.log").open("w")
    proc = subprocess.Popen(
        [str(ROOT / "run.sh"), "conf/default.yaml", *tiny, slow, f"output_dir={out}"],
        cwd=ROOT,
        stdout=killed_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "FEDGO_WORKDIR": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            ckpt = load_checkpoint(out) if (out / "checkpoint.pt").exists() else None
            if ckpt is not None and ckpt.round >= 2:
                break
            assert proc.poll() is None, "the run ended before it could be interrupted"
            time.sleep(0.2)
        tree = descendants(proc.pid)  # run.sh's SuperLink, SuperExec, simulation, Ray, ...
        assert any("flwr-simulation" in cmd for cmd in tree.values()), tree
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        killed_log.close()
    time.sleep(2)
    left = {pid: cmd for pid, cmd in tree.items() if alive(pid)}
    assert not left, f"the killed run.sh left processes running: {left}"
    assert not (out / "summary.json").exists()
    stopped_at = load_checkpoint(out).round
    assert 2 <= stopped_at < 5
    killed_homes = flower_homes(out)  # a run that did not succeed keeps its logs

    tag = uuid.uuid4().hex
    resume_args = ["conf/default.yaml", *tiny, "resume=true", f"output_dir={out}"]
    proc2 = run_sh(
        *resume_args,
        tag=tag,
        env={"FEDGO_SUPERNODES": "2"},  # 2 simulated nodes serve the 4 clients
    )
    log = proc2.stdout + proc2.stderr
    assert proc2.returncode == 0, log[-3000:]
    assert f"continuing {out} after round {stopped_at}" in log
    assert "4 clients on 2 nodes" in log and "done: final accuracy" in log
    assert not flower_processes(tag), "run.sh left its SuperLink running"
    assert flower_homes(out) == killed_homes
    for home in killed_homes:
        shutil.rmtree(home)

    run_inprocess(
        load_experiment(ROOT / "conf/default.yaml", [*tiny, f"output_dir={tmp_path / 'ref'}"])
    )

    def rows(path):
        lines = (path / "metrics.jsonl").read_text().splitlines()
        return [
            {k: v for k, v in json.loads(x).items() if k != "elapsed" and "time" not in k}
            for x in lines
        ]

    resumed = rows(out)
    # A client left out of a round names its reason in the run's log (the server's "Dropping
    # ... of client N" line, the ClientApp's or Ray's error): shown if the metrics differ.
    why = [x for x in log.splitlines() if any(w in x for w in ("Dropping", "ERROR", "Error"))]
    assert resumed == rows(tmp_path / "ref"), "\n".join(why) or log[-3000:]
    assert [r["round"] for r in resumed] == list(range(6))
    for row in resumed[1:]:
        assert (row["clients_sampled"], row["clients_replied"], row["clients_failed"]) == (2, 2, 0)
    assert resumed[-1]["test_accuracy"] > resumed[0]["test_accuracy"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["strategy"] == "scaffold" and summary["rounds"] == 5
    assert summary["final_accuracy"] == resumed[-1]["test_accuracy"]
    env = json.loads((out / "env.json").read_text())
    assert env["command"] == [str(ROOT / "run.sh"), *resume_args]
    assert env["earlier"][0]["command"] == [
        str(ROOT / "run.sh"),
        "conf/default.yaml",
        *tiny,
        slow,
        f"output_dir={out}",
    ]
    stages = summary["stage_times"]
    assert stages["launch"] > 0 and stages["earlier"] > 0
    assert sum(stages.values()) == pytest.approx(summary["total_time"], abs=0.05)
    run_log = (out / "run.log").read_text().splitlines()
    assert "INFO: fedgo-flwr: ServerApp start-up" in "\n".join(run_log)
    assert "INFO: [default] done: final accuracy" in run_log[-1]


# -- a used run folder (the ServerApp's side: tests/integration/test_output_folder.py) ------


def test_run_sh_refuses_a_used_folder_and_keeps_its_files(tmp_path):
    run_inprocess(tiny_config(tmp_path))
    before = {f.name: f.read_bytes() for f in tmp_path.iterdir() if f.is_file()}
    proc = run_sh("conf/default.yaml", *TINY_RUN, f"output_dir={tmp_path}", timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "holds an earlier run" in proc.stderr and "overwrite=true" in proc.stderr
    assert {f.name: f.read_bytes() for f in tmp_path.iterdir() if f.is_file()} == before


def test_run_sh_keeps_the_summary_of_a_run_whose_resume_fails(tmp_path):
    """A resume that the ServerApp refuses (changed config) fails, and the finished run's
    summary.json is neither deleted nor taken as this run's success. (Also the check of any run
    that fails inside Flower: `flwr run` exits 0 when the ServerApp raised, run.sh exits 1 and
    keeps its Flower home for the SuperLink's log.)"""
    run_inprocess(tiny_config(tmp_path))
    summary = (tmp_path / "summary.json").read_bytes()
    proc = run_sh(
        "conf/default.yaml", *TINY_RUN, "resume=true", "data.alpha=0.5", f"output_dir={tmp_path}"
    )
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-3000:]
    assert "the run failed" in proc.stderr
    assert "configuration differs" in proc.stdout + proc.stderr
    assert (tmp_path / "summary.json").read_bytes() == summary
    # A failed run keeps its Flower home, and says where, for the SuperLink's log; not the
    # app's files (the staged app and Flower's unpacked copy: about 1,300 files a failed run).
    kept = Path(proc.stderr.split("Flower's logs are in ")[1].split()[0])
    assert (kept / "superlink.log").is_file() and (kept / "run-config.toml").is_file()
    assert not (kept / "app").exists() and not (kept / "apps").exists()
    shutil.rmtree(kept)


def test_run_sh_sweep_passes_through_to_the_sweep(tmp_path):
    """``./run.sh --sweep``: ``python -m fedgo_app.sweep`` with run.sh's set-up (here only a
    table of runs not yet made: ``--table-only`` runs nothing)."""
    out = tmp_path / "sweep"
    result = run_sh(
        "--sweep", "a=conf/default.yaml", "--seeds", "tuning", "--out", str(out),
        "--table-only", *TINY_RUN, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr  # no run in the table
    assert "--table-only: 3 runs not run" in result.stderr
    assert "tuning seeds: not for claims" in (out / "table.md").read_text()


def test_the_staged_app_is_the_fab_of_this_repository(tmp_path):
    """run.sh bundles a staged copy (fedgo_app/staging.py): byte for byte the FAB that
    ``flwr run .`` builds from this checkout, .venv/ and all."""
    from flwr.cli.build import build_fab_from_disk

    from fedgo_app.staging import stage_app

    root = Path(__file__).resolve().parents[2]
    stage_app(root, tmp_path / "app")
    assert build_fab_from_disk(tmp_path / "app") == build_fab_from_disk(root)
