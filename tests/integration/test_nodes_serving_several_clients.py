"""Fewer simulated nodes than clients (issue 17): a node serves several partitions, each
client's state in its own folder, and a reply for a partition its node does not serve is
dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from helpers import TINY_RUN

from fedgo_app.client_app import app as client_app
from fedgo_app.client_app import message_partition
from fedgo_app.inprocess import InProcessGrid, run_inprocess
from fedgo_app.server_app import discover_nodes
from fedgo_flwr.learning.task import load_bundle, new_model, sample_clients
from fedgo_flwr.runtime import messages as msgs
from strategies import load_experiment, strategy_class

ROOT = Path(__file__).resolve().parents[2]
TINY = [*TINY_RUN, "rounds=3"]


def accuracies(out: Path, num_nodes: int | None, *overrides: str) -> list[float]:
    cfg = load_experiment(ROOT / "conf/default.yaml", [*TINY, f"output_dir={out}", *overrides])
    run_inprocess(cfg, num_nodes=num_nodes)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x)["test_accuracy"] for x in lines]


@pytest.mark.parametrize("checkpoint", ["true", "false"])
def test_two_nodes_serving_four_clients_give_the_same_run(tmp_path, checkpoint):
    # SCAFFOLD keeps c_i on the client: a client sampled twice must find its own again.
    sampled = [sample_clients(0, r, 4, 2) for r in (1, 2, 3)]
    assert len({p for s in sampled for p in s}) < sum(len(s) for s in sampled)
    args = ("strategy.name=scaffold", f"checkpoint={checkpoint}")
    shared = accuracies(tmp_path / "shared", 2, *args)
    own = accuracies(tmp_path / "own", None, *args)
    assert shared == own
    # With two nodes, node 0 serves clients 0 and 2: each client's state has its own folder.
    folders = sorted(p.name for p in (tmp_path / "shared" / "client-state").glob("*/partition-*"))
    assert folders == sorted({f"partition-{p}" for s in sampled for p in s})


def node(partition: int, total: int | None = None, share: bool | None = None) -> Context:
    config: dict = {"partition-id": partition}
    if total is not None:
        config["num-partitions"] = total
    if share is not None:
        config["share-partitions"] = share
    return Context(run_id=1, node_id=7, node_config=config, state=RecordDict(), run_config={})


def message_for(group: str) -> Message:
    # Message construction reads Flower's process identity (set by a grid in a real run).
    TaskIdentity.run_id = TaskIdentity.task_id = TaskIdentity.node_id = 1
    content = RecordDict({msgs.CONFIG: ConfigRecord()})
    return Message(content=content, dst_node_id=7, message_type="train", group_id=group)


def test_a_node_serves_only_its_own_partitions():
    assert message_partition(message_for(""), node(1)) == 1  # no group id: the node's own
    assert message_partition(message_for("1"), node(1)) == 1
    assert message_partition(message_for("5"), node(1, total=2, share=True)) == 5
    with pytest.raises(ValueError, match="one SuperNode per client"):
        message_partition(message_for("3"), node(1, total=2, share=False))
    with pytest.raises(ValueError, match="does not serve partition 4"):
        message_partition(message_for("4"), node(1, total=2, share=True))
    with pytest.raises(ValueError, match="not a partition id"):
        message_partition(message_for("x"), node(1, total=2, share=True))


def test_partitions_are_spread_over_nodes_that_share_and_refused_otherwise():
    grid = InProcessGrid(client_app, 2, node_config={"share-partitions": True})
    assert discover_nodes(grid, 5, timeout=5) == {0: 2, 1: 3, 2: 2, 3: 3, 4: 2}
    grid = InProcessGrid(client_app, 2, node_config={"share-partitions": False})
    with pytest.raises(RuntimeError, match="one SuperNode per client"):
        discover_nodes(grid, 5, timeout=5)
    grid = InProcessGrid(client_app, 6, node_config={"share-partitions": False})
    assert discover_nodes(grid, 4, timeout=5) == {0: 2, 1: 3, 2: 4, 3: 5}


def test_a_reply_for_a_partition_its_node_does_not_serve_is_dropped(tmp_path):
    cfg = load_experiment(ROOT / "conf/default.yaml", [*TINY, f"output_dir={tmp_path}"])
    model = new_model(cfg, load_bundle(cfg.data))
    strategy = strategy_class("fedavg")(cfg, {0: 2, 1: 3, 2: 2, 3: 3}, model)
    TaskIdentity.run_id = TaskIdentity.task_id = TaskIdentity.node_id = 1
    [to_two] = strategy.messages_to(RecordDict(), [2], "train")
    assert to_two.metadata.dst_node_id == 2 and to_two.metadata.group_id == "2"
    reply = Message(RecordDict(), reply_to=to_two)
    reply.metadata.__dict__["_src_node_id"] = 2
    assert strategy.pid_of(reply) == 2
    reply.metadata.__dict__["_src_node_id"] = 3  # node 3 does not serve partition 2
    assert strategy.pid_of(reply) == -1
