"""Where a simulation's clients go on a Ray cluster (fedgo_app.cluster), without Ray."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedgo_app import cli, cluster
from fedgo_app.cluster import actors_per_node
from fedgo_flwr.config.experiment import ConfigError
from strategies import load_experiment

ROOT = Path(__file__).resolve().parents[2]


def test_actors_per_node_takes_the_tighter_of_cpus_and_gpus():
    nodes = [
        {"CPU": 16.0, "GPU": 1.0},  # GPU-bound: 4 quarters of a GPU
        {"CPU": 2.0, "GPU": 2.0},  # CPU-bound: 2 CPUs
        {"CPU": 64.0},  # no GPU: no client that asks for one
    ]
    assert actors_per_node(nodes, client_cpus=1, client_gpus=0.25) == [4, 2, 0]
    assert actors_per_node(nodes, client_cpus=2, client_gpus=0.0) == [8, 1, 32]
    assert actors_per_node(nodes, client_cpus=3, client_gpus=0.0) == [5, 0, 21]
    # Fractions that add up to exactly one GPU are not lost to rounding (3 x 1/3).
    assert actors_per_node([{"CPU": 8.0, "GPU": 1.0}], 1, 1 / 3) == [3]


def _prepare_cfg(*overrides: str):
    return load_experiment(ROOT / "conf/default.yaml", ["rounds=1", *overrides])


def test_with_ray_address_the_cluster_is_checked_not_this_machine(monkeypatch):
    """``client_device: cuda`` on a head without a GPU is fine when the cluster has GPUs;
    the cluster check gets the clients' share."""
    seen = []
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setattr(cli, "check_cluster", lambda a, c, g: seen.append((a, c, g)) or [4])
    monkeypatch.setattr(cli, "_check_device", lambda *a, **k: pytest.fail("local GPU checked"))
    cli.check_simulation_devices(
        _prepare_cfg("client_device=cuda", "resources.client_gpus=0.25", "resources.client_cpus=2")
    )
    assert seen == [("10.0.0.1:6379", 2, 0.25)]


def test_a_share_no_node_can_hold_is_refused(monkeypatch):
    monkeypatch.setattr(
        cluster, "read_nodes", lambda a: [{"id": "ab" * 8, "address": "h", "CPU": 4, "GPU": 0}]
    )
    assert cluster.check_cluster("h:1", 1, 0.0) == [4]
    with pytest.raises(ConfigError, match=r"resources.client_cpus = 8: "):
        cluster.check_cluster("h:1", 8, 0.0)
    with pytest.raises(ConfigError, match=r"resources.client_gpus = 0\.5: .*4 CPUs and 0 GPUs"):
        cluster.check_cluster("h:1", 1, 0.5)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens


def test_an_address_where_nothing_listens_is_refused_at_once():
    """Ray retries such an address for minutes; the check names RAY_ADDRESS within seconds."""
    import time

    port = _closed_port()
    started = time.monotonic()
    refused = rf"RAY_ADDRESS = '127.0.0.1:{port}': no Ray cluster there .*refused"
    with pytest.raises(ConfigError, match=refused):
        cluster.read_nodes(f"127.0.0.1:{port}")
    assert time.monotonic() - started < 10
    assert cluster.unreachable(f"ray://127.0.0.1:{port}") is not None


def test_a_listening_address_and_addresses_without_a_port_pass_the_probe():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert cluster.unreachable(f"127.0.0.1:{s.getsockname()[1]}") is None
    assert cluster.unreachable("auto") is None
    assert cluster.unreachable("ray://headnode") is None
