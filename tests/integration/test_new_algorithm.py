"""An algorithm is four new files (the server's, the client's, what both exchange, and its YAML):
nothing else is edited, and it runs end to end through the in-process grid with its own
parameters and extra message (``tests/unit/test_architecture.py`` checks the shape of the code).
One whose own parts are a few scalar parameters is three files and one entry of
``fedgo_flwr/protocol/scalars.py``; without a golden run it passes the golden test, skipped."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest

import clients
import strategies
from fedgo_app.inprocess import run_inprocess
from fedgo_flwr import protocol
from fedgo_flwr.config.schema import ConfigError, build_section
from fedgo_flwr.protocol import Declaration
from fedgo_flwr.protocol.scalars import SCALAR_ALGORITHMS, Param, parameters
from strategies import load_experiment

ROOT = Path(__file__).resolve().parents[2]


# An algorithm written from scratch as its four files (the server's, the client's, what both
# exchange, and its YAML), in folders added to the packages' search paths: nothing else is
# edited, and it runs end to end with its own parameters and extra message.
TOY_STRATEGY = '''
import json
from dataclasses import dataclass
import numpy as np
from flwr.app import RecordDict
from fedgo_flwr.runtime.messages import CONFIG, METRICS
from fedgo_flwr.config.schema import Checker
from strategies.fedavg import FedAvg
from strategies.base import Reply


@dataclass
class ToyConfig:
    scale: float = 1.0
    server_step: float = 1.0

    def check(self, c: Checker) -> None:
        c.require("server_step", 0 < self.server_step <= 1, "must be in (0, 1]")


class Toy(FedAvg):
    """FedAvg whose server step is damped; clients scale their learning rate."""

    name = "toy"
    client_algorithm = "toy"
    Config = ToyConfig

    def setup(self, grid):
        content = RecordDict({CONFIG: self.message_config(server_round=0)})
        hello = self.messages_to(content, self.node_ids, "train.hello")
        replies = grid.send_and_receive(hello)
        greetings = sorted(int(r.content[METRICS]["greeting"]) for r in replies)
        (self.resources.out_dir / "greetings.json").write_text(json.dumps(greetings))

    def aggregate(self, server_round, replies: list[Reply]):
        avg = super().aggregate(server_round, replies)
        step = self.params.server_step
        return {k: (self.global_arrays[k] + step * (v - self.global_arrays[k])).astype(v.dtype)
                for k, v in avg.items()}
'''

TOY_PROTOCOL = """
from dataclasses import dataclass
from fedgo_flwr.protocol import TRAIN, Declaration
from fedgo_flwr.protocol.spec import COMMON_METRICS, ReplySpec, Scalar


@dataclass
class ToyClientConfig:
    scale: float = 1.0


HELLO_REPLY = ReplySpec(arrays=(), metrics={**COMMON_METRICS, "greeting": Scalar(whole=True)})
PROTOCOL = Declaration(
    "toy", {TRAIN: ReplySpec(), "train.hello": HELLO_REPLY}, Config=ToyClientConfig
)
"""

TOY_CLIENT = """
from dataclasses import replace
from clients.base import ClientAlgorithm
from fedgo_flwr.protocol.toy import PROTOCOL


class ToyClient(ClientAlgorithm):
    name = "toy"
    Config = PROTOCOL.Config
    messages = {"train.hello": "hello"}

    def train(self, job):
        job.cfg.train = replace(job.cfg.train, lr=job.cfg.train.lr * job.params.scale)
        return super().train(job)

    def hello(self, job):
        return {}, {"greeting": 100 + job.partition_id}
"""


def test_an_algorithm_is_four_new_files(tmp_path, monkeypatch):
    for folder, text in (("s", TOY_STRATEGY), ("c", TOY_CLIENT), ("p", TOY_PROTOCOL)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "toy.py").write_text(textwrap.dedent(text))
    (tmp_path / "toy.yaml").write_text(
        f"base: {ROOT / 'conf' / 'base.yaml'}\nrounds: 2\ndata: {{num_clients: 4}}\n"
        f"output_dir: {tmp_path / 'out'}\ncheckpoint: false\n"
        "strategy: {name: toy, scale: 0.0, server_step: 0.5}\n"
    )
    monkeypatch.setattr(strategies, "__path__", [*strategies.__path__, str(tmp_path / "s")])
    monkeypatch.setattr(clients, "__path__", [*clients.__path__, str(tmp_path / "c")])
    monkeypatch.setattr(protocol, "__path__", [*protocol.__path__, str(tmp_path / "p")])
    from fedgo_app import client_app

    client_app.register_client_messages()

    with pytest.raises(ConfigError, match="strategy.server_step = 2.0: must be in"):
        load_experiment(tmp_path / "toy.yaml", ["strategy.server_step=2"])
    cfg = load_experiment(tmp_path / "toy.yaml")
    assert dataclasses.asdict(cfg.strategy.params) == {"scale": 0.0, "server_step": 0.5}
    summary = run_inprocess(cfg)
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").open()]
    # scale 0: the clients' learning rate is 0, so their models (and the server's) never move.
    assert [r["test_accuracy"] for r in rows] == [rows[0]["test_accuracy"]] * 3
    assert summary["strategy"] == "toy"
    greetings = json.loads((tmp_path / "out" / "greetings.json").read_text())
    assert greetings == [100, 101, 102, 103]  # every node answered the toy's own message


# A client algorithm with one scalar parameter: FedAvg whose clients scale their learning rate.
# Its server and client files, and one entry (SLOW below) of SCALAR_ALGORITHMS.
SLOW_STRATEGY = """
from dataclasses import dataclass
from fedgo_flwr.protocol import declaration
from strategies.base import BaseConfig
from strategies.fedavg import FedAvg


@dataclass
class SlowConfig(declaration("slow").Config, BaseConfig):
    \"\"\"The client's ``scale`` and the shared ``aggregation`` section.\"\"\"


class Slow(FedAvg):
    name = "slow"
    client_algorithm = "slow"
    Config = SlowConfig
"""

SLOW_CLIENT = """
from dataclasses import replace
from clients.base import ClientAlgorithm
from fedgo_flwr.protocol import declaration


class SlowClient(ClientAlgorithm):
    name = "slow"
    Config = declaration("slow").Config

    def train(self, job):
        job.cfg.train = replace(job.cfg.train, lr=job.cfg.train.lr * job.params.scale)
        return super().train(job)
"""

SLOW = Declaration(
    "slow",
    Config=parameters(
        "SlowClientConfig",
        "The clients' learning-rate factor.",
        scale=Param(0.0, "Factor of the clients' learning rate.", at_least=0),
    ),
)


def load_golden_test(monkeypatch):
    """tests/integration/test_golden_runs.py as a module of its own (its cases listed now)."""
    path = ROOT / "tests" / "integration" / "test_golden_runs.py"
    spec = importlib.util.spec_from_file_location("golden_runs_of_new_algorithm", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look themselves up
    spec.loader.exec_module(module)
    return module


def test_a_scalar_algorithm_is_three_files_and_one_entry(tmp_path, monkeypatch):
    for folder, text in (("s", SLOW_STRATEGY), ("c", SLOW_CLIENT)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "slow.py").write_text(textwrap.dedent(text))
    monkeypatch.setattr(strategies, "__path__", [*strategies.__path__, str(tmp_path / "s")])
    monkeypatch.setattr(clients, "__path__", [*clients.__path__, str(tmp_path / "c")])
    monkeypatch.setitem(SCALAR_ALGORITHMS, "slow", SLOW)
    monkeypatch.delenv("FEDGO_WRITE_GOLDEN", raising=False)

    with pytest.raises(ConfigError, match="strategy.scale = -1.0: must be >= 0"):
        load_experiment(ROOT / "conf" / "default.yaml", ["strategy.name=slow", "strategy.scale=-1"])
    # the client checks what it is sent as the server does
    with pytest.raises(ConfigError, match="strategy.scale = -2.0: must be >= 0"):
        build_section(SLOW.Config, {"scale": -2.0}, "strategy.", owner="slow")
    # the golden test runs the new strategy's case end to end, then skips: it has no record
    golden = load_golden_test(monkeypatch)
    assert "slow" in [c.id for c in golden.CASES]
    golden.test_every_golden_run_is_a_case()
    with pytest.raises(pytest.skip.Exception, match="'slow' has no golden run yet"):
        golden.test_golden_run(golden.strategy_case("slow"), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "slow" / "metrics.jsonl").open()]
    # scale 0 (the default): the clients' learning rate is 0, the model never moves
    assert len(rows) == 3 and len({r["test_accuracy"] for r in rows}) == 1
    summary = json.loads((tmp_path / "slow" / "summary.json").read_text())
    assert summary["strategy"] == "slow"
