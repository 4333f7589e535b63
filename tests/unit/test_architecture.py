"""The shape of the code: one-way dependencies, algorithms found by name, defaults in one place."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import clients
import strategies
from fedgo_flwr.config import OPTIMIZERS, ExperimentConfig
from fedgo_flwr.data import DATASET_NAMES
from fedgo_flwr.models import MODEL_NAMES
from fedgo_flwr.partition import PARTITION_SCHEMES
from fedgo_flwr.plugins import client_algorithms
from fedgo_flwr.protocol import EmptyConfig, declaration
from fedgo_flwr.schema import ConfigError
from strategies import load_experiment

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("fedgo_flwr", "strategies", "clients")
APPS = {
    "fedgo_flwr.server_app",
    "fedgo_flwr.client_app",
    "fedgo_flwr.inprocess",
    "fedgo_flwr.cli",
    "fedgo_flwr.sweep.runner",
}


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


def modules_in(folder: str) -> list[str]:
    """The public modules of ``folder`` (not ``__init__``, ``base`` or a ``_private`` one)."""
    files = (ROOT / folder).glob("*.py")
    return sorted(p.stem for p in files if p.stem != "base" and not p.stem.startswith("_"))


def test_every_algorithm_module_is_found_by_name():
    """Every module of ``strategies/`` (and of ``clients/``) is an algorithm found by name: no
    list to keep, a new file is found."""
    assert "fedavg" in strategies.available() and "scaffold" in clients.available()
    assert strategies.available() == modules_in("strategies")
    assert clients.available() == modules_in("clients")
    for name in strategies.available():
        cls = strategies.strategy_class(name)
        assert cls.name == name and cls.__module__ == f"strategies.{name}"
        assert clients.client_class(cls.client_algorithm).name == cls.client_algorithm
    first_two = ", ".join(strategies.available()[:2])
    with pytest.raises(ValueError, match=f"unknown strategy 'fedfoo'; choose one of {first_two}"):
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
