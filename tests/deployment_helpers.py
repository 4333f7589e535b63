"""A Flower deployment of this app as separate processes, for the end-to-end tests.

:class:`Federation` starts what ``deploy/`` describes: credentials from ``make-credentials.py``,
a SuperLink with TLS and SuperNode authentication (``superlink.sh``), the SuperNode keys
registered with ``flwr supernode register``, one SuperNode per partition (``supernode.sh``);
runs go through ``flwr run`` with a TLS connection in a private ``FLWR_HOME``. By default all
of it runs on 127.0.0.1 (``tests/e2e/test_deployment.py``); given network namespaces, the SuperLink
and the ``flwr`` CLI run in one and each SuperNode in its own, dialling the SuperLink's address
on its link (``tests/e2e/test_network.py``). Every process is started in a session of its own and
stopped with everything below it (:func:`stop_trees`), so a test can check that none is left.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from helpers import rows_of

from fedgo_app.staging import stage_app

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
CONNECTION = "deploy-test"
HAVE_FLOWER = (BIN / "flower-superlink").exists() and sys.platform.startswith("linux")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def netns_exec(netns: str | None, cmd: list[str]) -> list[str]:
    """``cmd`` run in network namespace ``netns`` (``None``: this process's namespace)."""
    return cmd if netns is None else ["ip", "netns", "exec", netns, *cmd]


def port_open(port: int, netns: str | None = None) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port`` (in ``netns``)."""
    if netns is None:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0
    probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), 2).close()"
    cmd = netns_exec(netns, [sys.executable, "-c", probe])
    return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0


def wait_for_port(
    port: int, proc: subprocess.Popen, log: Path, timeout: float = 60, netns: str | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_open(port, netns):
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


def kill_trees(roots: Sequence[int], sig: int = signal.SIGKILL) -> set[int]:
    """Send ``sig`` to every process group in the trees below ``roots`` at once; their pids."""
    pids: set[int] = set()
    for root in roots:
        pids |= process_tree(root)
    table = process_table()
    for group in {table[p][1] for p in pids if p in table}:
        try:
            os.killpg(group, sig)
        except (ProcessLookupError, PermissionError):
            pass
    return pids


def stop_trees(roots: Sequence[int], grace: float = 10.0) -> set[int]:
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


@dataclasses.dataclass
class RunResult:
    out_dir: Path
    log: str
    seconds: float
    rows: list[dict]
    summary: dict


SHORT_HEARTBEAT = Path(__file__).resolve().parent / "short_heartbeat"


def short_heartbeat_env(env: dict[str, str], seconds: float) -> dict[str, str]:
    """The environment additions that give a SuperNode (and its ClientApps) a heartbeat
    interval of ``seconds`` (tests/short_heartbeat/sitecustomize.py)."""
    path = env.get("PYTHONPATH")
    return {
        "PYTHONPATH": f"{SHORT_HEARTBEAT}{os.pathsep}{path}" if path else str(SHORT_HEARTBEAT),
        "FEDGO_TEST_HEARTBEAT_S": str(seconds),
    }


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where the processes of a :class:`Federation` run and how the SuperNodes reach the SuperLink.

    The default is one machine, everything on 127.0.0.1. With ``server_netns`` the SuperLink
    (and the ServerApp under it) and the ``flwr`` CLI run in that network namespace, listening
    on ``listen``; SuperNode k runs in ``node_netns[k]`` and dials ``dial[k]`` (the SuperLink's
    address on its link, which the TLS certificate must name: it names every ``dial``).
    """

    server_netns: str | None = None
    node_netns: tuple[str, ...] = ()
    dial: tuple[str, ...] = ()
    listen: str = "127.0.0.1"
    # SuperNode k -> its heartbeat interval in seconds, where not Flower's 30 s (at least 10 s,
    # the SuperLink's least): the SuperLink reports a silent node unavailable 2 x that after
    # its last heartbeat (tests/short_heartbeat/sitecustomize.py).
    heartbeat_s: tuple[tuple[int, float], ...] = ()

    def node(self, k: int) -> tuple[str | None, str]:
        """SuperNode k's namespace and the SuperLink address it dials."""
        netns = self.node_netns[k] if k < len(self.node_netns) else None
        return netns, self.dial[k] if k < len(self.dial) else "127.0.0.1"


class Federation:
    """One SuperLink and its SuperNodes, started by the deploy/ scripts."""

    def __init__(self, work: Path, num_nodes: int, placement: Placement | None = None) -> None:
        self.work = work
        self.num_nodes = num_nodes
        self.place = placement or Placement()
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
        self.stopped: set[int] = set()
        self.timings: dict[str, float] = {}

    def spawn(
        self,
        name: str,
        cmd: list[str],
        flwr_home: Path,
        netns: str | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "w")  # the child keeps its own copy
        proc = subprocess.Popen(
            netns_exec(netns, cmd),
            cwd=ROOT,
            env={**self.env, **(env or {}), "FLWR_HOME": str(flwr_home)},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs[name] = proc
        return proc

    def flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            netns_exec(self.place.server_netns, [str(BIN / "flwr"), *args]),
            cwd=ROOT,
            env={**self.env, "FLWR_HOME": str(self.cli_home)},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def supernode_cmd(self, key: str, partition: int, num: int, dial: str) -> list[str]:
        return [
            str(ROOT / "deploy/supernode.sh"),
            "--superlink",
            f"{dial}:{self.port}",
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
            "--allow-faults",  # the tests inject faults; a node obeys them only if it opts in
        ]

    def start(self) -> None:
        """Credentials, the SuperLink, the keys registered, one SuperNode per partition."""
        hosts = [arg for host in dict.fromkeys(self.place.dial) for arg in ("--host", host)]
        subprocess.run(
            [sys.executable, str(ROOT / "deploy/make-credentials.py"), str(self.creds)]
            + ["--supernodes", str(self.num_nodes), *hosts],
            check=True,
            capture_output=True,
        )
        self.port = free_port()
        superlink = self.spawn(
            "superlink",
            [str(ROOT / "deploy/superlink.sh"), str(self.creds)]
            + ["--host", self.place.listen, "--port", str(self.port)],
            self.work / "superlink-home",
            self.place.server_netns,
        )
        wait_for_port(
            self.port, superlink, self.logs / "superlink.log", netns=self.place.server_netns
        )

        self.cli_home.mkdir()
        (self.cli_home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n'
            f"[superlink.{CONNECTION}]\n"
            f'address = "127.0.0.1:{self.port}"\n'
            f'root-certificates = "{self.creds / "ca.crt"}"\n'
        )
        for k in range(self.num_nodes):
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

        heartbeat = dict(self.place.heartbeat_s)
        for k in range(self.num_nodes):
            netns, dial = self.place.node(k)
            self.spawn(
                f"supernode-{k}",
                self.supernode_cmd(f"supernode-{k}", k, self.num_nodes, dial),
                self.work / f"supernode-{k}-home",
                netns,
                env=short_heartbeat_env(self.env, heartbeat[k]) if k in heartbeat else None,
            )

    def nodes(self) -> list[dict]:
        listed = self.flwr("supernode", "list", CONNECTION, "--format", "json")
        assert listed.returncode == 0, listed.stdout + listed.stderr
        return json.loads(listed.stdout[listed.stdout.index("{") :])["nodes"]

    def wait_online(self, timeout: float = 60) -> list[dict]:
        deadline = time.monotonic() + timeout
        while True:
            nodes = self.nodes()
            online = sum(n["status"] == "online" for n in nodes)
            if online >= self.num_nodes or time.monotonic() > deadline:
                return nodes
            time.sleep(1)

    def run(
        self,
        name: str,
        config: str,
        overrides: list[str],
        timeout: float = 400,
        on_line: tuple[str, Callable[[], None]] | None = None,
        each_poll: Callable[[str], None] | None = None,
        run_config: dict[str, str] | None = None,
    ) -> RunResult:
        """``flwr run`` the app with ``config`` + ``overrides``; output_dir under the work dir.

        ``run_config``: further run config keys (``node-map``).

        ``on_line = (text, action)`` calls ``action()`` once, when ``text`` first shows in the
        streamed log; ``each_poll(log)`` is called with the log so far every half second.
        """
        out_dir = self.work / "outputs" / name
        run_toml = self.work / f"{name}.toml"
        overrides = [*overrides, f"output_dir={out_dir}"]
        # A relative config path: the ServerApp finds it in the submitted app, as on a server.
        extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in (run_config or {}).items())
        run_toml.write_text(
            f"config = {json.dumps(config)}\noverrides = {json.dumps(shlex.join(overrides))}\n"
            + extra
        )
        log_path = self.logs / f"run-{name}.log"
        # The app as run.sh submits it: its files staged (the same FAB as `flwr run .`).
        app = self.work / f"app-{name}"
        if not app.exists():
            stage_app(ROOT, app)
        cmd = [str(BIN / "flwr"), "run", str(app), CONNECTION, "--run-config", str(run_toml)]
        cmd.append("--stream")
        t0 = time.perf_counter()
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                netns_exec(self.place.server_netns, cmd),
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
                text = log_path.read_text()
                if on_line is not None and on_line[0] in text:
                    on_line[1]()
                    on_line = None
                if each_poll is not None:
                    each_poll(text)
                time.sleep(0.5)
        finally:
            stop_trees([proc.pid], grace=5)
        seconds = time.perf_counter() - t0
        self.timings[f"run {name}"] = seconds
        log = log_path.read_text()
        assert proc.returncode == 0, log[-4000:]
        assert (out_dir / "summary.json").exists(), f"the run failed:\n{log[-4000:]}"
        summary = json.loads((out_dir / "summary.json").read_text())
        return RunResult(out_dir, log, seconds, rows_of(out_dir), summary)

    def stop(self) -> None:
        self.stopped = stop_trees([p.pid for p in self.procs.values()])
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
