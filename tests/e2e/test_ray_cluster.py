"""A simulation on an existing Ray cluster: two local nodes (``ray.cluster_utils.Cluster``)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import ray
from flwr.simulation import run_simulation
from helpers import TINY_RUN
from ray.cluster_utils import Cluster

from fedgo_app.client_app import app as client_app
from fedgo_app.cluster import check_cluster
from fedgo_app.inprocess import run_inprocess
from fedgo_app.server_app import server_app_for
from fedgo_flwr.config.experiment import ConfigError
from strategies import load_experiment

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

# Two rounds of helpers.TINY_RUN (FedAvg, 2 of 4 clients a round: one on each node).
TINY = [*TINY_RUN, "rounds=2"]


def _metrics(folder: Path) -> list[dict]:
    keys = ("round", "test_accuracy", "test_loss", "train_loss", "clients_replied")
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return [{k: json.loads(x).get(k) for k in keys} for x in lines]


@pytest.fixture
def private_ray_tmpdir(monkeypatch):
    """Ray's temp folder for this test alone. ``Cluster`` writes its address to
    ``$RAY_TMPDIR/ray/ray_current_cluster``, and a plain ``ray.init()`` anywhere on the machine
    joins the cluster named there: under /tmp, a Ray simulation in another xdist worker would
    run its actors on this test's cluster and lose them when the test shuts it down. (Short:
    Ray's socket paths below it must fit in 107 bytes.)"""
    folder = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    monkeypatch.setenv("RAY_TMPDIR", folder)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_clients_run_on_both_nodes_of_a_cluster(tmp_path, capsys, private_ray_tmpdir):
    """Two nodes of one CPU each: the cluster check sees both, Flower's pool puts a client
    actor on each, and the run's metrics equal the same run in one process."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        address_file = Path(private_ray_tmpdir, "ray", "ray_current_cluster")
        assert address_file.read_text() == cluster.address  # not the machine's /tmp/ray
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()

        assert check_cluster(cluster.address, client_cpus=1, client_gpus=0.0) == [1, 1]
        assert "2 node(s), 2 clients side by side" in capsys.readouterr().err
        with pytest.raises(ConfigError, match="resources.client_gpus = 0.5"):
            check_cluster(cluster.address, client_cpus=1, client_gpus=0.5)  # no GPU anywhere

        cfg = load_experiment(ROOT / "conf/default.yaml", [*TINY, f"output_dir={tmp_path / 'ray'}"])
        run_simulation(
            server_app=server_app_for(cfg),
            client_app=client_app,
            num_supernodes=cfg.data.num_clients,
            backend_config={
                "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                "init_args": {"address": cluster.address},
            },
        )

        ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
        try:
            actors = ray._private.state.state.actor_table(None)
            nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        finally:
            ray.shutdown()
        placed = {
            a["Address"]["NodeID"]
            for a in actors.values()
            if a["ActorClassName"].endswith("ClientAppActor")
        }
        assert len(nodes) == 2 and placed == nodes
    finally:
        cluster.shutdown()

    run_inprocess(
        load_experiment(ROOT / "conf/default.yaml", [*TINY, f"output_dir={tmp_path / 'local'}"])
    )
    ray_rows, local_rows = _metrics(tmp_path / "ray"), _metrics(tmp_path / "local")
    assert [r["round"] for r in ray_rows] == [0, 1, 2]
    assert all(r["clients_replied"] == 2 for r in ray_rows[1:])
    assert ray_rows == local_rows
