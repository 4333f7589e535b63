"""Plain Flower use: fewer simulated nodes than clients, Flower's run config, the in-process
entry point and the clients' device (issue 17)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedgo_flwr import cli
from fedgo_flwr import messages as msgs
from fedgo_flwr.client_app import app as client_app
from fedgo_flwr.client_app import message_partition
from fedgo_flwr.inprocess import InProcessGrid, run_inprocess
from fedgo_flwr.inprocess import main as inprocess_main
from fedgo_flwr.server_app import discover_nodes
from fedgo_flwr.task import load_bundle, new_model, sample_clients
from strategies import load_experiment, strategy_class

ROOT = Path(__file__).resolve().parents[2]
TINY = ["rounds=3", "data.num_clients=4", "fraction=0.5", "train.local_epochs=1"]


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


def test_local_entry_point_runs_an_experiment_in_this_process(tmp_path, capsys):
    out = tmp_path / "run"
    code = inprocess_main([str(ROOT / "conf/default.yaml"), *TINY, f"output_dir={out}"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (
        json.loads(capsys.readouterr().out.strip().splitlines()[-1])["final_accuracy"]
        == (summary["final_accuracy"])
    )
    code = inprocess_main([str(ROOT / "conf/default.yaml"), "data.num_clients=0"])
    assert code == 2


def test_prepare_spreads_clients_over_fewer_supernodes_and_checks_client_devices(tmp_path, capsys):
    def prepare(*args: str) -> int:
        config = [str(ROOT / "conf/default.yaml"), f"output_dir={tmp_path / 'o'}"]
        return cli.main(["prepare", *config, *args, "--run-toml", str(tmp_path / "run.toml")])

    assert prepare("--supernodes", "2") == 0
    assert "num-supernodes=2 " in capsys.readouterr().out
    assert prepare() == 0
    assert "num-supernodes=20 " in capsys.readouterr().out
    assert prepare("client_device=cuda") == 2
    err = capsys.readouterr().err
    assert "client_device" in err and "resources.client_gpus" in err
    assert prepare("client_device=gpu") == 2
    assert "client_device" in capsys.readouterr().err


def test_tensorboard_gets_the_rounds_metrics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "tb"
    cfg = load_experiment(
        ROOT / "conf/default.yaml", [*TINY, f"output_dir={out}", "logging.tensorboard=true"]
    )
    run_inprocess(cfg)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    scalars = events.Scalars("accuracy/test_accuracy")
    assert [e.step for e in scalars] == [r["round"] for r in rows]
    assert [e.value for e in scalars] == pytest.approx([r["test_accuracy"] for r in rows])
    assert [e.step for e in events.Scalars("traffic/bytes_up")] == [r["round"] for r in rows]


def test_tensorboard_without_its_package_is_refused_before_the_run(tmp_path, monkeypatch):
    import importlib.util

    from fedgo_flwr.config import ConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name)
    )
    cfg = load_experiment(ROOT / "conf/default.yaml", ["logging.tensorboard=true"])
    with pytest.raises(ConfigError) as err:
        cli.preflight(cfg)
    assert err.value.key == "logging.tensorboard"
