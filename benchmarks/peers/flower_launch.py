"""Run the plain Flower peer (``flower_peer.py``) as a Flower 1.42 user does with ``flwr run``:
a simulation SuperLink on a free port of 127.0.0.1, then ``flwr run APP --stream`` with the
federation's ``num-supernodes`` and client resources, then the SuperLink is stopped.

``python flower_launch.py RUN_DIR``: the app folder is ``RUN_DIR/flower_app`` (written by
``benchmarks/peers_setting.py``); the Flower home and the SuperLink's log go to ``RUN_DIR``.
Exit status: ``flwr run``'s, or 1 when no ``result.json`` was written (``flwr run`` exits 0
even when the ServerApp raised).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from common import load_setting, run_dir_from_argv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    run_dir = run_dir_from_argv()
    conf = load_setting(run_dir)["config"]
    bin_dir = Path(sys.executable).parent
    home = run_dir / "flwr-home"
    home.mkdir(exist_ok=True)
    port = free_port()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "peers"\n\n[superlink.peers]\n'
        f'address = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    env = {**os.environ, "FLWR_HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    with (run_dir / "superlink.log").open("w") as log:
        link = subprocess.Popen(
            [
                str(bin_dir / "flower-superlink"),
                "--simulation",
                "--insecure",
                "--disable-runtime-dependency-installation",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            if link.poll() is not None or time.monotonic() > deadline:
                print(f"the SuperLink did not start; see {run_dir / 'superlink.log'}")
                return 1
            time.sleep(0.1)
        status = subprocess.call(
            [
                str(bin_dir / "flwr"),
                "run",
                str(run_dir / "flower_app"),
                "peers",
                "--stream",
                "--federation-config",
                conf["federation_config"],
            ],
            env=env,
        )
    finally:
        try:
            os.killpg(link.pid, signal.SIGTERM)
            link.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(link.pid, signal.SIGKILL)
    if status == 0 and not (run_dir / "result.json").exists():
        print("the Flower run wrote no result.json; see the log above")
        return 1
    return status


if __name__ == "__main__":
    sys.exit(main())
