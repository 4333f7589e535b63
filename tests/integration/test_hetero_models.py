"""Clients of different architectures (``model.client_models``): assignment, refusals, a round.

Co-Boosting's model market (Dai et al., ICLR 2024; digest part B.1, B.8) has clients whose
architectures differ. The platform lets each client build its own architecture; only a
strategy declaring ``supports_heterogeneous_models`` may run such a configuration.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord

import clients.base
import strategies
from fedgo_app.inprocess import InProcessGrid, run_inprocess
from fedgo_flwr.config.experiment import ConfigError, load_config
from fedgo_flwr.learning.task import client_model_name, load_bundle, make_partition, new_model
from fedgo_flwr.models.classifiers import build_model
from fedgo_flwr.runtime.messages import ARRAYS, to_record
from fedgo_flwr.runtime.rng import derive_seed
from strategies import available, load_experiment, strategy_class
from strategies.base import ServerResources

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
TINY = [
    "rounds=1",
    "data.num_clients=4",
    "data.train_subset=400",
    "data.test_subset=120",
    "train.local_epochs=1",
    "checkpoint=false",
]


def experiment(tmp_path: Path, *overrides: str, conf: str = "default.yaml"):
    return load_experiment(CONF / conf, [*TINY, f"output_dir={tmp_path / 'out'}", *overrides])


def rows_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# -- assignment ----------------------------------------------------------------------------------
def test_a_short_list_is_repeated_over_partition_ids():
    # The core config only (the default strategy, FedAvg, would refuse other architectures).
    cfg = load_config(
        CONF / "default.yaml", ["data.num_clients=5", "model.client_models=[cnn, mlp]"]
    )
    assert [client_model_name(cfg, k) for k in range(5)] == ["cnn", "mlp", "cnn", "mlp", "cnn"]
    full = load_config(CONF / "default.yaml", ["model.client_models=[mlp, cnn, gn_lenet, cnn]"])
    assert [client_model_name(full, k) for k in range(4)] == ["mlp", "cnn", "gn_lenet", "cnn"]


def test_without_client_models_every_client_trains_model_name(tmp_path):
    cfg = experiment(tmp_path, "model.name=cnn_bn")
    assert cfg.model.client_models == []
    assert {client_model_name(cfg, k) for k in range(4)} == {"cnn_bn"}


# -- refusals ------------------------------------------------------------------------------------
HETEROGENEOUS = ["coboosting", "coboosting_fedgo", "dense", "fadi", "feddf", "fedgo"]  # logits meet


def test_which_strategies_take_other_architectures():
    assert [n for n in available() if strategy_class(n).supports_heterogeneous_models] == (
        HETEROGENEOUS
    )


@pytest.mark.parametrize("name", [n for n in available() if n not in HETEROGENEOUS])
def test_every_averaging_strategy_refuses_other_architectures(tmp_path, name):
    """Parameter averaging needs one architecture: refused before the run starts."""
    assert not strategy_class(name).supports_heterogeneous_models
    with pytest.raises(ConfigError) as info:
        experiment(tmp_path, f"strategy.name={name}", "model.client_models=[cnn, mlp]")
    assert info.value.key == "model.client_models"
    assert name in str(info.value) and "override 'model.client_models" in str(info.value)


def test_client_models_equal_to_model_name_are_a_homogeneous_run(tmp_path):
    """A list that names only ``model.name`` changes nothing, for every strategy."""
    plain = experiment(tmp_path / "a")
    same = experiment(tmp_path / "b", "model.client_models=[cnn, cnn]")
    run_inprocess(plain)
    run_inprocess(same)
    a, b = rows_of(tmp_path / "a" / "out"), rows_of(tmp_path / "b" / "out")
    assert [r["test_loss"] for r in a] == [r["test_loss"] for r in b]


def test_the_strategy_itself_refuses_other_architectures(tmp_path):
    """A config changed after it was checked is still refused when the strategy is built."""
    cfg = experiment(tmp_path)
    cfg.model.client_models = ["cnn", "mlp"]
    bundle = load_bundle(cfg.data)
    resources = ServerResources(bundle, make_partition(cfg), torch.device("cpu"), tmp_path)
    nodes = {k: k + 2 for k in range(4)}
    with pytest.raises(ValueError, match=r"model.client_models.*fedavg"):
        strategy_class("fedavg")(cfg, nodes, new_model(cfg, bundle), resources)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (("model.name=resnet8",), "model.name"),
        (("model.name=mlp", "model.client_models=[mlp, resnet8]"), "model.client_models[1]"),
    ],
)
def test_a_model_that_cannot_take_the_inputs_is_refused_by_key(tmp_path, overrides, key):
    """four_gaussians holds 2-D vectors; a ResNet needs images (C, H, W)."""
    strategy = ["strategy.name=hetero_probe"] if "client_models" in key else []
    with probe_strategy(tmp_path):
        cfg = experiment(tmp_path, "data.dataset=four_gaussians", *overrides, *strategy)
        with pytest.raises(ConfigError) as info:
            run_inprocess(cfg)
    assert info.value.key == key and "resnet8" in str(info.value)
    assert not (tmp_path / "out").exists()  # refused before anything is written


# -- one round with two architectures --------------------------------------------------------------
PROBE = '''
import json
from strategies.base import Strategy


class HeteroProbe(Strategy):
    """Accepts clients of any architecture; averages those of the server's, records all."""

    name = "hetero_probe"
    supports_heterogeneous_models = True

    def begin_round(self, server_round):
        super().begin_round(server_round)
        self.seen = []

    def absorb(self, server_round, reply):
        arch = self.architectures.of(reply.partition_id)
        self.seen.append([reply.partition_id, arch, sorted(reply.arrays)])
        if arch == self.cfg.model.name:
            super().absorb(server_round, reply)

    def aggregate(self, server_round, replies):
        (self.resources.out_dir / "seen.json").write_text(json.dumps(self.seen))
        return self.averaged()
'''


class probe_strategy:
    """Context: ``strategies/hetero_probe.py`` (the module above) is on the strategies path."""

    def __init__(self, tmp_path: Path) -> None:
        self.folder = tmp_path / "strategies"
        self.folder.mkdir(exist_ok=True)
        (self.folder / "hetero_probe.py").write_text(textwrap.dedent(PROBE))

    def __enter__(self):
        self.patch = pytest.MonkeyPatch()
        self.patch.setattr(strategies, "__path__", [*strategies.__path__, str(self.folder)])
        return self

    def __exit__(self, *exc):
        self.patch.undo()


def test_one_round_with_two_architectures(tmp_path, monkeypatch, flwr_log):
    """Clients 0, 2 train cnn and 1, 3 mlp; each reply is checked against its own
    architecture: client 3 replying cnn-shaped arrays is dropped, naming its partition."""
    started: dict[int, dict[str, np.ndarray]] = {}
    original = clients.base.ClientAlgorithm.train

    def train(self, job):
        started[job.partition_id] = {k: v.clone() for k, v in job.model.state_dict().items()}
        out = original(self, job)
        if job.partition_id == 3:  # an mlp client that replies with the server's architecture
            job.model = build_model("cnn", job.data.input_shape, job.data.num_classes)
        return out

    monkeypatch.setattr(clients.base.ClientAlgorithm, "train", train)
    with probe_strategy(tmp_path):
        cfg = experiment(
            tmp_path, "strategy.name=hetero_probe", "fraction=1", "model.client_models=[cnn, mlp]"
        )
        run_inprocess(cfg)
    out = tmp_path / "out"
    seen = json.loads((out / "seen.json").read_text())
    bundle = load_bundle(cfg.data)
    shape, classes = bundle.train.input_shape, bundle.train.num_classes
    keys = {n: sorted(build_model(n, shape, classes).state_dict()) for n in ("cnn", "mlp")}
    assert seen == [[0, "cnn", keys["cnn"]], [1, "mlp", keys["mlp"]], [2, "cnn", keys["cnn"]]]
    last = rows_of(out)[-1]
    assert (last["clients_replied"], last["clients_failed"]) == (3, 1)
    dropped = [r.getMessage() for r in flwr_log.records if "Dropping reply" in r.getMessage()]
    assert len(dropped) == 1 and "client 3 (node 5)" in dropped[0], dropped
    assert "model 'mlp'" in dropped[0]
    # The mlp clients started from one seeded initial mlp, the cnn clients from the global model.
    torch.manual_seed(derive_seed(cfg.seed, "model-init", "mlp"))
    mlp0 = build_model("mlp", shape, classes).state_dict()
    global0 = new_model(cfg, bundle).state_dict()
    for pid, expected in ((0, global0), (1, mlp0), (2, global0), (3, mlp0)):
        assert started[pid].keys() == expected.keys()
        assert all(torch.equal(started[pid][k], expected[k]) for k in expected), pid


def test_the_server_sends_each_architecture_its_own_arrays(tmp_path):
    """configure_train: one record per architecture, in partition order, none rebuilt."""
    with probe_strategy(tmp_path):
        cfg = experiment(
            tmp_path, "strategy.name=hetero_probe", "fraction=1", "model.client_models=[mlp, cnn]"
        )
        bundle = load_bundle(cfg.data)
        model = new_model(cfg, bundle)
        resources = ServerResources(bundle, make_partition(cfg), torch.device("cpu"), tmp_path)
        grid = InProcessGrid(lambda m, c: m, 4)  # sets Flower's task identity
        nodes = {k: k + 2 for k in range(4)}
        strategy = strategy_class("hetero_probe")(cfg, nodes, model, resources)
        arrays = to_record({k: v.numpy() for k, v in model.state_dict().items()})
        messages = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    assert [m.metadata.dst_node_id for m in messages] == [2, 3, 4, 5]
    sent = [m.content[ARRAYS] for m in messages]
    assert sent[1] is arrays and sent[3] is arrays  # cnn = model.name: the global model
    assert sent[0] is sent[2]  # mlp: one record, built once
    assert sorted(sent[0].keys()) == sorted(build_model("mlp", (1, 8, 8), 10).state_dict())
