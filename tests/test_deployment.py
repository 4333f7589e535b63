"""The deployment engine end to end: a SuperLink and SuperNodes as separate processes.

One federation on 127.0.0.1 (free ports) for the whole module, started with the scripts of
``deploy/``: credentials from ``make-credentials.py``, a SuperLink with TLS and SuperNode
authentication (``superlink.sh``), the three known SuperNode keys registered with ``flwr
supernode register``, three SuperNodes (``supernode.sh``), and a fourth SuperNode with an
unregistered key that must be refused. Runs go through ``flwr run`` with a TLS connection in a
private ``FLWR_HOME``. Every process started here (and everything below it) is stopped at the
end, and the test checks that none is left.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (BIN / "flower-superlink").exists() or not sys.platform.startswith("linux"),
        reason="needs the venv's Flower executables and Linux process tools",
    ),
]

K = 3
CONNECTION = "deploy-test"
# round_timeout of the run where a SuperNode is killed: that round lasts this long; the healthy
# rounds take 10-25 s on 2 loaded cores (a ClientApp process is started for every message).
TIMEOUT = 40

TINY = [
    "rounds=2",
    f"data.num_clients={K}",
    "fraction=1.0",
    "data.alpha=1.0",
    "train.local_epochs=1",
    "train.batch_size=32",
]
TINY_FEDGO = [
    "strategy.distill.epochs=1",
    "strategy.generator.steps=5",
    "strategy.generator.width=16",
    "strategy.generator.batch_size=16",
    "strategy.generator.n_critic=1",
    "strategy.discriminator.epochs=1",
]
TIMINGS: dict[str, float] = {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        time.sleep(0.3)
    raise TimeoutError(f"nothing listens on port {port} after {timeout}s")


def process_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, pgid, state) of every process."""
    out = subprocess.run(
        ["ps", "-eo", "pid=,ppid=,pgid=,stat="], capture_output=True, text=True, check=True
    ).stdout
    table = {}
    for line in out.splitlines():
        pid, ppid, pgid, stat = line.split()[:4]
        table[int(pid)] = (int(ppid), int(pgid), stat)
    return table


def process_tree(root: int) -> set[int]:
    """``root`` and all its descendants that are still alive (zombies excluded)."""
    table = process_table()
    tree = {root} if root in table else set()
    grew = True
    while grew:
        grew = False
        for pid, (ppid, _, _) in table.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return {p for p in tree if not table[p][2].startswith("Z")}


def alive(pids: set[int]) -> set[int]:
    table = process_table()
    return {p for p in pids if p in table and not table[p][2].startswith("Z")}


def stop_trees(roots: list[int], grace: float = 10.0) -> set[int]:
    """TERM, then KILL, every process group in the trees below ``roots``; return all pids.

    A SuperLink starts its SuperExec in a session of its own (the ServerApp runs under it), so
    the whole tree is collected before anything is stopped.
    """
    pids: set[int] = set()
    for root in roots:
        pids |= process_tree(root)
    table = process_table()
    groups = {table[p][1] for p in pids if p in table}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for group in groups:
            try:
                os.killpg(group, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + grace
        while alive(pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not alive(pids):
            break
    return pids


def read_rows(out_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]


@dataclasses.dataclass
class RunResult:
    out_dir: Path
    log: str
    seconds: float
    rows: list[dict]
    summary: dict


class Federation:
    """One SuperLink and its SuperNodes, started by the deploy/ scripts."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.creds = work / "credentials"
        self.logs = work / "logs"
        self.logs.mkdir(parents=True)
        self.env = {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "FEDGO_VENV": sys.prefix,
            "FEDGO_WORKDIR": str(work),
            "PYTHONUNBUFFERED": "1",
        }
        self.cli_home = work / "cli"
        self.procs: dict[str, subprocess.Popen] = {}
        self.port = 0
        self.node_ids: list[int] = []
        self.refused: subprocess.CompletedProcess | None = None
        self.stopped: set[int] = set()

    def spawn(self, name: str, cmd: list[str], flwr_home: Path) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "w")  # the child keeps its own copy
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env={**self.env, "FLWR_HOME": str(flwr_home)},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs[name] = proc
        return proc

    def flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(BIN / "flwr"), *args],
            cwd=ROOT,
            env={**self.env, "FLWR_HOME": str(self.cli_home)},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def supernode_cmd(self, key: str, partition: int, num: int) -> list[str]:
        return [
            str(ROOT / "deploy/supernode.sh"),
            "--superlink",
            f"127.0.0.1:{self.port}",
            "--ca",
            str(self.creds / "ca.crt"),
            "--key",
            str(self.creds / "supernode-keys" / key),
            "--partition",
            str(partition),
            "--num-partitions",
            str(num),
            "--port",
            str(free_port()),
            "--allow-faults",  # the runs below inject faults; a node obeys them only if it opts in
        ]

    def start(self) -> None:
        subprocess.run(
            [sys.executable, str(ROOT / "deploy/make-credentials.py"), str(self.creds)]
            + ["--supernodes", str(K)],
            check=True,
            capture_output=True,
        )
        self.port = free_port()
        superlink = self.spawn(
            "superlink",
            [str(ROOT / "deploy/superlink.sh"), str(self.creds)]
            + ["--host", "127.0.0.1", "--port", str(self.port)],
            self.work / "superlink-home",
        )
        wait_for_port(self.port, superlink, self.logs / "superlink.log")

        self.cli_home.mkdir()
        (self.cli_home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n'
            f"[superlink.{CONNECTION}]\n"
            f'address = "127.0.0.1:{self.port}"\n'
            f'root-certificates = "{self.creds / "ca.crt"}"\n'
        )
        for k in range(K):
            reg = self.flwr(
                "supernode",
                "register",
                str(self.creds / "supernode-keys" / f"supernode-{k}.pub"),
                CONNECTION,
                "--format",
                "json",
            )
            assert reg.returncode == 0, reg.stdout + reg.stderr
            self.node_ids.append(int(json.loads(reg.stdout[reg.stdout.index("{") :])["node-id"]))

        for k in range(K):
            self.spawn(
                f"supernode-{k}",
                self.supernode_cmd(f"supernode-{k}", k, K),
                self.work / f"supernode-{k}-home",
            )
        # A fourth client whose key was never registered: the SuperLink must refuse it.
        intruder = self.spawn(
            "supernode-unregistered",
            self.supernode_cmd("unregistered", K, K + 1),
            self.work / "supernode-unregistered-home",
        )
        intruder.wait(timeout=120)

    def nodes(self) -> list[dict]:
        listed = self.flwr("supernode", "list", CONNECTION, "--format", "json")
        assert listed.returncode == 0, listed.stdout + listed.stderr
        return json.loads(listed.stdout[listed.stdout.index("{") :])["nodes"]

    def wait_online(self, timeout: float = 60) -> list[dict]:
        deadline = time.monotonic() + timeout
        while True:
            nodes = self.nodes()
            if sum(n["status"] == "online" for n in nodes) >= K or time.monotonic() > deadline:
                return nodes
            time.sleep(1)

    def run(
        self,
        name: str,
        config: str,
        overrides: list[str],
        timeout: float = 400,
        on_line: tuple[str, Callable[[], None]] | None = None,
    ) -> RunResult:
        """``flwr run`` the app with ``config`` + ``overrides``; output_dir under the work dir.

        ``on_line = (text, action)`` calls ``action()`` once, when ``text`` first shows in the
        streamed log.
        """
        out_dir = self.work / "outputs" / name
        run_toml = self.work / f"{name}.toml"
        overrides = [*overrides, f"output_dir={out_dir}"]
        # A relative config path: the ServerApp finds it in the submitted app, as on a server.
        run_toml.write_text(
            f"config = {json.dumps(config)}\noverrides = {json.dumps(shlex.join(overrides))}\n"
        )
        log_path = self.logs / f"run-{name}.log"
        t0 = time.perf_counter()
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [str(BIN / "flwr"), "run", ".", CONNECTION, "--run-config", str(run_toml)]
                + ["--stream"],
                cwd=ROOT,
                env={**self.env, "FLWR_HOME": str(self.cli_home)},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + timeout
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"flwr run {name} still running after {timeout}s")
                if on_line is not None and on_line[0] in log_path.read_text():
                    on_line[1]()
                    on_line = None
                time.sleep(0.5)
        finally:
            stop_trees([proc.pid], grace=5)
        seconds = time.perf_counter() - t0
        TIMINGS[f"run {name}"] = seconds
        log = log_path.read_text()
        assert proc.returncode == 0, log[-4000:]
        assert (out_dir / "summary.json").exists(), f"the run failed:\n{log[-4000:]}"
        summary = json.loads((out_dir / "summary.json").read_text())
        return RunResult(out_dir, log, seconds, read_rows(out_dir), summary)

    def stop(self) -> None:
        self.stopped = stop_trees([p.pid for p in self.procs.values()])
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    t0 = time.perf_counter()
    fed = Federation(tmp_path_factory.mktemp("deployment"))
    try:
        fed.start()
        TIMINGS["federation start"] = time.perf_counter() - t0
        yield fed
    finally:
        fed.stop()
        TIMINGS["whole module"] = time.perf_counter() - t0
        print("\n[test_deployment] timings (s): " + json.dumps(TIMINGS))
        (fed.work / "timings.json").write_text(json.dumps(TIMINGS, indent=1))
        left = alive(fed.stopped)
        assert not left, f"processes left running: {left}"


def check_rounds(result: RunResult, replied: list[int]) -> None:
    rows = result.rows
    assert [r["round"] for r in rows] == list(range(len(replied) + 1))
    for row, n in zip(rows[1:], replied, strict=True):
        assert row["clients_sampled"] == K
        assert row["clients_replied"] == n, row
        assert row["clients_failed"] == K - n, row
    for row in rows:
        assert math.isfinite(row["test_accuracy"]) and 0.0 <= row["test_accuracy"] <= 1.0
    assert result.summary["rounds"] == len(replied)
    assert result.summary["final_accuracy"] == rows[-1]["test_accuracy"]
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"]
    # The refused fourth SuperNode (partition-id 3) never took part.
    assert "partition-id 3" not in result.log
    assert json.loads((result.out_dir / "partition.json").read_text())["class_histogram"]


def test_only_registered_supernodes_join(federation):
    intruder = federation.procs["supernode-unregistered"]
    log = (federation.logs / "supernode-unregistered.log").read_text()
    # Flower logs its own exit code (305: SUPERNODE_CONNECTION_ERROR); the process exits with 1.
    assert intruder.returncode == 1, log[-2000:]
    assert "Exit Code: 305" in log and "Failed to activate SuperNode" in log
    nodes = federation.wait_online()
    assert sorted(int(n["node-id"]) for n in nodes) == sorted(federation.node_ids)
    assert all(n["status"] == "online" for n in nodes), nodes
    superlink_log = (federation.logs / "superlink.log").read_text()
    assert "No SuperNode found with the given public key" in superlink_log
    activated = {int(n) for n in re.findall(r"Activated node_id=(\d+)", superlink_log)}
    assert activated == set(federation.node_ids)
    assert all(p.poll() is None for name, p in federation.procs.items() if "-unreg" not in name)


def test_fedgo_over_tls(federation):
    """FedGO end to end; in round 2 client 0 sends NaN weights, which are rejected, and the
    distillation weights cover the two clients that replied."""
    result = federation.run(
        "fedgo",
        "conf/fedgo.yaml",
        [*TINY, *TINY_FEDGO, "faults=[{partition: 0, round: 2, kind: nan}]"],
    )
    check_rounds(result, [K, K - 1])
    assert re.search(r"Dropping reply of client 0 \(node \d+\): .*non-finite", result.log)
    assert result.summary["strategy"] == "fedgo"
    prefl = json.loads((result.out_dir / "prefl.json").read_text())
    assert sorted(prefl["discriminators"]) == [str(k) for k in range(K)]
    assert prefl["missing_discriminators"] == []
    assert result.rows[-1]["distill_steps"] > 0
    assert (result.out_dir / "discriminators.pt").exists()


def test_fedavg_over_tls_survives_a_crash_and_a_killed_supernode(federation):
    """Round 1: client 1's ClientApp raises (``faults``). Round 2: SuperNode 2 is SIGKILLed.

    SuperNode 2 is killed (with its SuperExec and ClientApps) as soon as round 1 is evaluated,
    so it never answers round 2; the server waits ``round_timeout`` and goes on with the rest.
    Runs last: the federation has two SuperNodes afterwards.
    """
    victim = federation.procs["supernode-2"]
    killed: set[int] = set()

    def kill() -> None:
        pids = process_tree(victim.pid)
        killed.update(pids)
        table = process_table()
        for group in {table[p][1] for p in pids if p in table}:
            os.killpg(group, signal.SIGKILL)

    result = federation.run(
        "fedavg",
        "conf/fedavg.yaml",
        [*TINY, "faults=[{partition: 1, round: 1, kind: crash}]", f"round_timeout={TIMEOUT}"],
        on_line=("[fedavg] round 1/2", kill),
    )
    assert killed and not alive(killed) and victim.poll() is not None
    check_rounds(result, [K - 1, K - 1])
    assert result.summary["strategy"] == "fedavg"
    log = result.log
    assert re.search(
        r"Dropping reply of client 1 \(node \d+\): client error: .*injected fault", log
    )
    # SuperNode 2 is silent: no reply within round_timeout (or the SuperLink's error reply).
    assert re.search(r"client 2 \(node \d+\)", log), log[-3000:]
    round2 = log[log.index("[ROUND 2/2]") :]
    assert "client 1" not in round2
