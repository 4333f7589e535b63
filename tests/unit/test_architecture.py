"""The shape of the code: one-way dependencies, algorithms found by name, defaults in one place."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import clients
import strategies
from fedgo_flwr.config.experiment import OPTIMIZERS, ExperimentConfig
from fedgo_flwr.config.names import MODEL_NAMES, PARTITION_SCHEMES, dataset_names
from fedgo_flwr.config.schema import ConfigError
from fedgo_flwr.protocol import EmptyConfig, declaration
from fedgo_flwr.protocol.scalars import SCALAR_ALGORITHMS
from fedgo_flwr.runtime.plugins import client_algorithms
from strategies import load_experiment

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("fedgo_app", "fedgo_flwr", "strategies", "clients")
LAYERS = ("config", "library", "records", "algorithms", "app")
"""Bottom to top: a module imports modules of its own layer or of a layer below it. Each layer
is a package of its own: ``fedgo_flwr.config``, ``fedgo_flwr.records``, ``strategies`` and
``clients``, and the composition root ``fedgo_app``; the library is the rest of ``fedgo_flwr``."""


def layer_of(module: str) -> str:
    """``app`` (``fedgo_app/`` and the package root), ``algorithms`` (``strategies/``,
    ``clients/``), ``records`` (``fedgo_flwr/records/``: what a run writes), ``config``
    (``fedgo_flwr/config/``: standard library and YAML only) or ``library`` (the rest of
    ``fedgo_flwr``)."""
    top = module.split(".")[0]
    if module == "fedgo_flwr" or top == "fedgo_app":
        return "app"  # fedgo_flwr's root: the Python API's names, imported on first use
    if top in ("strategies", "clients"):
        return "algorithms"
    package = module.split(".")[1]
    return package if package in ("records", "config") else "library"


def config_layer() -> list[str]:
    """The configuration layer's modules."""
    return sorted(m for m in project_imports() if layer_of(m) == "config")


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
    """app -> (strategies, clients) -> records -> library -> config: a module imports only its
    own layer and the layers below it (:func:`layer_of`). Only ``fedgo_app/`` imports
    strategies or clients; strategies and clients never import each other (what both need, the
    protocol, lives in ``fedgo_flwr``); the configuration layer imports no library."""
    graph = project_imports()
    assert "fedgo_flwr.config.experiment" in graph and "strategies.base" in graph
    assert "fedgo_flwr.protocol.fedgo" in graph and "fedgo_app.server_app" in graph
    assert {layer_of(m) for m in graph} == set(LAYERS)
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    for module, imported in graph.items():
        above = {m for m in imported if rank[layer_of(m)] > rank[layer_of(module)]}
        assert not above, f"{module} ({layer_of(module)}) imports {sorted(above)}"
        top = module.split(".")[0]
        if top in ("strategies", "clients"):
            other = "clients" if top == "strategies" else "strategies"
            bad = {m for m in imported if m.split(".")[0] == other}
            assert not bad, f"{module} imports {sorted(bad)}"
    assert graph["fedgo_flwr.config.schema"] == set(), "the schema builder must stay a leaf"
    # Importing a config module runs these packages' __init__: they import nothing (the root
    # imports the API's modules only inside __getattr__: test_the_package_import_is_cheap).
    assert graph["fedgo_flwr.config"] == set()
    client_side = {m for m in graph["fedgo_app.client_app"] if m.startswith("strategies")}
    assert not client_side, "a client must not import server strategies"


def test_the_config_layer_imports_the_standard_library_and_yaml_only():
    allowed = set(sys.stdlib_module_names) | {"yaml", "fedgo_flwr"}
    for module in config_layer():
        base = ROOT / module.replace(".", "/")
        path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            outside = {n for n in names if n.split(".")[0] not in allowed}
            assert not outside, f"{module} imports {sorted(outside)}"


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


def test_the_package_import_is_cheap():
    """``import fedgo_flwr`` (which every submodule's import runs) imports no other module of
    the project, nor torch, Flower or NumPy: the root's imports are all inside functions (its
    ``__getattr__`` imports the API on first use), and a fresh interpreter shows it."""
    tree = ast.parse((ROOT / "fedgo_flwr" / "__init__.py").read_text())
    top_level = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    names = [getattr(n, "module", None) for n in top_level]
    assert names == ["__future__"], names  # no `import x` either (module None)
    code = (
        "import sys; import fedgo_flwr; "
        "tops = ('strategies', 'clients', 'torch', 'numpy', 'flwr', 'yaml'); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in tops "
        "or m.startswith('fedgo_flwr.')))"
    )
    out = python_says(code)
    assert out.stdout.strip() == "[]"
    code = "import fedgo_flwr as f; print(f.load_experiment.__module__, f.ConfigError.__name__)"
    out = python_says(code)
    assert out.stdout.split() == ["fedgo_app.api", "ConfigError"]


def python_says(code: str) -> subprocess.CompletedProcess:
    """``code`` run by a fresh interpreter in the repository's folder (what it printed)."""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )


def test_checking_a_config_does_not_import_any_strategy():
    """Nor the library: reading and checking a config imports neither torch nor NumPy."""
    code = (
        "import sys; from fedgo_flwr.config.experiment import load_config; "
        "load_config('conf/fedgo.yaml'); "
        "tops = ('strategies', 'clients', 'torch', 'numpy'); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in tops))"
    )
    out = python_says(code)
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


MAX_PROJECT_CLASSES = 4
"""The most project classes a strategy's class chain may hold (its MRO less Flower's classes
and ``object``): a round must stay readable in a few files (``tools/class_chains.py`` prints
the chains)."""
MAX_MODULE_LINES = 700


def class_chains():
    """``tools/class_chains.py`` (not a package: loaded from its file)."""
    spec = importlib.util.spec_from_file_location("class_chains", ROOT / "tools/class_chains.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


def test_no_strategy_has_a_long_class_chain():
    """Every strategy's chain is at most :data:`MAX_PROJECT_CLASSES` project classes, and the
    count is what it says: FedAvg is itself and ``Strategy`` (its parts are owned objects, not
    parents)."""
    chain = class_chains().chain
    fedavg = chain(strategies.strategy_class("fedavg"))
    assert fedavg.classes == ("strategies.fedavg.FedAvg", "strategies.base.Strategy")
    assert fedavg.overridden == 0 and fedavg.methods > 10
    # CPFL's cohorts and its stage 2 are parts it owns (self.cohorts, self.distillation)
    cpfl = chain(strategies.strategy_class("cpfl"))
    assert cpfl.classes == ("strategies.cpfl.CPFL", "strategies.base.Strategy")
    long = {}
    for name in strategies.available():
        found = chain(strategies.strategy_class(name))
        if len(found.classes) > MAX_PROJECT_CLASSES:
            long[name] = [c.rsplit(".", 1)[-1] for c in found.classes]
    assert not long, f"more than {MAX_PROJECT_CLASSES} project classes: {long}"


def test_no_module_is_longer_than_the_limit():
    """Every module of the project is at most :data:`MAX_MODULE_LINES` lines."""
    long = {
        str(p.relative_to(ROOT)): n
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, long


def test_every_protocol_module_declares_a_client_algorithm():
    """``fedgo_flwr/protocol/<name>.py`` declares client algorithm ``name`` (a module of
    ``clients/``); a client's parameters are its declaration's, one class for both sides."""
    from fedgo_flwr.protocol import _MACHINERY as machinery  # the modules that are no algorithm

    modules = sorted(
        p.stem
        for p in (ROOT / "fedgo_flwr" / "protocol").glob("*.py")
        if p.stem != "__init__" and p.stem not in machinery
    )
    assert {"cpfl", "fedgo", "scaffold"} <= set(modules)
    for name in modules:
        assert name in clients.available(), f"fedgo_flwr/protocol/{name}.py: no clients/{name}.py"
        assert declaration(name).name == name, f"fedgo_flwr/protocol/{name}.py: PROTOCOL.name"
    # A client algorithm with only scalar parameters is an entry of SCALAR_ALGORITHMS instead
    # (one place: never also a module)
    assert {"fedprox", "feduv"} <= set(SCALAR_ALGORITHMS)
    for name, entry in SCALAR_ALGORITHMS.items():
        assert name in clients.available(), f"SCALAR_ALGORITHMS[{name!r}]: no clients/{name}.py"
        assert name not in modules, f"{name}: both fedgo_flwr/protocol/{name}.py and an entry"
        assert entry.name == name and declaration(name) is entry
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
        "import sys; from fedgo_flwr.runtime.plugins import client_algorithms; "
        "names = client_algorithms(); "
        "print('clients' in sys.modules, 'fedavg' in names, 'base' in names)"
    )
    out = python_says(code)
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
    assert choices(r"^\s+dataset: \w+") == {*dataset_names(), "hf:<id>"}
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
