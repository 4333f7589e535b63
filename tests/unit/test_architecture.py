"""The shape of the code: one-way dependencies, algorithms found by name, defaults in one place."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
import pkgutil
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

import clients
import strategies
from fedgo_flwr import protocol
from fedgo_flwr.config import OPTIMIZERS, ExperimentConfig
from fedgo_flwr.data import DATASET_NAMES
from fedgo_flwr.inprocess import run_inprocess
from fedgo_flwr.models import MODEL_NAMES
from fedgo_flwr.partition import PARTITION_SCHEMES
from fedgo_flwr.plugins import client_algorithms
from fedgo_flwr.protocol import EmptyConfig, declaration
from fedgo_flwr.schema import ConfigError
from strategies import load_experiment

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("fedgo_flwr", "strategies", "clients")
APPS = {"fedgo_flwr.server_app", "fedgo_flwr.client_app", "fedgo_flwr.inprocess", "fedgo_flwr.cli"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_imports() -> dict[str, set[str]]:
    """Module -> project modules it imports (anywhere in the file, functions included)."""
    modules = {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            found |= {t for t in targets if t in modules and t != name}
        graph[name] = found
    return graph


def test_dependencies_point_one_way():
    """Core modules never import strategies or clients; strategies and clients never import
    each other (what both need, the protocol, lives in ``fedgo_flwr``)."""
    graph = project_imports()
    assert "fedgo_flwr.config" in graph and "strategies.base" in graph
    assert "fedgo_flwr.protocol.fedgo" in graph
    forbidden = {"strategies": {"clients"}, "clients": {"strategies"}}
    for module, imported in graph.items():
        top = module.split(".")[0]
        never = {"strategies", "clients"} if module not in APPS else set()
        never = forbidden.get(top, never)
        bad = {m for m in imported if m.split(".")[0] in never}
        assert not bad, f"{module} imports {sorted(bad)}"
    assert graph["fedgo_flwr.schema"] == set(), "the schema builder must stay a leaf"
    client_side = {m for m in graph["fedgo_flwr.client_app"] if m.startswith("strategies")}
    assert not client_side, "a client must not import server strategies"


def test_no_import_cycles():
    graph = project_imports()
    # A package imports its own submodules through its __init__: that edge is not a cycle.
    edges = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in graph.items()}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt) :] + [nxt] if nxt in path else [node, nxt]
                pytest.fail(f"import cycle: {' -> '.join(cycle)}")
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])


REEXPORTING = ("fedgo_flwr.datafree", "fedgo_flwr.gan", "fedgo_flwr.weighting")
"""Library packages whose ``__init__`` re-exports the public API of their modules."""


@pytest.mark.parametrize("package", REEXPORTING)
def test_a_package_reexports_the_public_api_of_its_modules(package):
    """The package's ``__init__`` re-exports exactly the names its modules list in ``__all__``
    (the same objects): ``from fedgo_flwr.gan import build_generator`` works."""
    pkg = importlib.import_module(package)
    modules = [
        importlib.import_module(f"{package}.{info.name}")
        for info in pkgutil.iter_modules(pkg.__path__)
    ]
    assert set(pkg.__all__) == set().union(*(m.__all__ for m in modules))
    for name in pkg.__all__:
        owner = next(m for m in modules if name in m.__all__)
        assert getattr(pkg, name) is getattr(owner, name), (package, name)


def test_checking_a_config_does_not_import_any_strategy():
    code = (
        "import sys; from fedgo_flwr.config import load_config; "
        "load_config('conf/fedgo.yaml'); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('strategies', 'clients')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_every_algorithm_module_is_found_by_name():
    assert strategies.available() == [
        "central",
        "coboosting",
        "coboosting_fedgo",
        "cpfl",
        "dafkd",
        "dense",
        "fadi",
        "fedavg",
        "feddf",
        "feddisco",
        "fedgkd",
        "fedgkd_plus",
        "fedgo",
        "fedprox",
        "fedtgp",
        "feduv",
        "oneshot",
        "scaffold",
    ]
    assert clients.available() == [
        "cpfl",
        "dafkd",
        "fedavg",
        "fedgkd",
        "fedgo",
        "fedprox",
        "fedtgp",
        "feduv",
        "oneshot_fedgo",
        "scaffold",
    ]
    for name in strategies.available():
        cls = strategies.strategy_class(name)
        assert cls.name == name and cls.__module__ == f"strategies.{name}"
        assert clients.client_class(cls.client_algorithm).name == cls.client_algorithm
    with pytest.raises(
        ValueError, match="unknown strategy 'fedfoo'; choose one of central, coboosting"
    ):
        strategies.strategy_class("fedfoo")


def test_every_protocol_module_declares_a_client_algorithm():
    """``fedgo_flwr/protocol/<name>.py`` declares client algorithm ``name`` (a module of
    ``clients/``); a client's parameters are its declaration's, one class for both sides."""
    machinery = {"spec", "intake"}
    modules = sorted(
        p.stem
        for p in (ROOT / "fedgo_flwr" / "protocol").glob("*.py")
        if p.stem != "__init__" and p.stem not in machinery
    )
    assert {"cpfl", "fedgo", "fedprox", "scaffold"} <= set(modules)
    for name in modules:
        assert name in clients.available(), f"fedgo_flwr/protocol/{name}.py: no clients/{name}.py"
        assert declaration(name).name == name, f"fedgo_flwr/protocol/{name}.py: PROTOCOL.name"
    for name in clients.available():
        cls = clients.client_class(name)
        assert cls.Config is declaration(name).Config, f"clients/{name}.py: Config"
        assert not hasattr(cls, "needs_server_state"), "server_state is the declaration's"
    assert declaration("fedavg").Config is EmptyConfig and not declaration("fedavg").server_state
    stateful = {name for name in clients.available() if declaration(name).server_state}
    assert stateful == {
        "cpfl",
        "dafkd",
        "fedgkd",
        "fedgo",
        "fedtgp",
        "oneshot_fedgo",
        "scaffold",
    }


def test_the_client_algorithms_are_listed_without_importing_them():
    assert client_algorithms() == clients.available()
    code = (
        "import sys; from fedgo_flwr.plugins import client_algorithms; "
        "names = client_algorithms(); "
        "print('clients' in sys.modules, 'fedavg' in names, 'base' in names)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False True False"


def test_base_yaml_holds_the_dataclass_defaults():
    text = (ROOT / "conf" / "base.yaml").read_text()
    assert yaml.safe_load(text) == ExperimentConfig().to_dict()

    def choices(pattern: str) -> set[str]:
        """The ``a | b | c`` comment of the line that ``pattern`` finds."""
        found = re.search(pattern + r"\s+# (.*)$", text, re.M)
        assert found is not None, pattern
        return {choice.strip() for choice in found.group(1).split("|")}

    assert choices(r"^strategy:\n\s+name: \w+") == set(strategies.available())
    assert choices(r"^model:\n\s+name: \w+") == set(MODEL_NAMES)
    assert choices(r"^\s+dataset: \w+") == {*DATASET_NAMES, "hf:<id>"}
    assert choices(r"^\s+optimizer: \w+") == set(OPTIMIZERS)
    assert choices(r"^\s+partition: \w+") == set(PARTITION_SCHEMES)


@pytest.mark.parametrize(
    "override, key",
    [
        ("strategy.generator.gp_lambda=-1", "strategy.generator.gp_lambda"),
        ("strategy.discriminator.batch_size=0", "strategy.discriminator.batch_size"),
        ("strategy.distill.temperature=-1", "strategy.distill.temperature"),
        ("data.num_clients=0", "data.num_clients"),
        ("strategy.weighting_params.entropy.temperature=0", "strategy.weighting_params.entropy"),
        ("strategy.weighting_params.foo.temperature=1", "strategy.weighting_params.foo"),
    ],
)
def test_errors_name_the_field_that_is_wrong(override, key):
    with pytest.raises(ConfigError) as info:
        load_experiment(ROOT / "conf" / "fedgo.yaml", [override])
    assert info.value.key == key


# An algorithm written from scratch as its four files (the server's, the client's, what both
# exchange, and its YAML), in folders added to the packages' search paths: nothing else is
# edited, and it runs end to end with its own parameters and extra message.
TOY_STRATEGY = '''
import json
from dataclasses import dataclass
import numpy as np
from flwr.app import RecordDict
from fedgo_flwr.messages import CONFIG, METRICS
from fedgo_flwr.schema import Checker
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
    from fedgo_flwr import client_app

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
