"""The experiment of ``benchmarks/peers_speed.py``, defined once, and its translation per framework.

:class:`Experiment` is one FedAvg experiment (CIFAR-10 JPEGs, the project's ``cnn``, a
Dirichlet split, clients per round, local epochs, batch, learning rate, rounds, threads); the
shapes of issue 53 are :data:`SHAPES` (``cross-device``: 100 small clients, 10 a round;
``cross-silo``: 5 large ones, all every round; ``tiny``: a smoke test, 4 clients on 1,000
images). A YAML file of the
same keys (:func:`load_experiment`) defines any other.

:func:`export_shared` writes what every framework reads, once per experiment, computed by this
project's own code from the same config the project's runs get (:func:`project_overrides`):
``data.npz`` (the training images the split indexes and the test split, ``uint8``),
``partition.json`` (each client's indices into them, ``data.partition: dirichlet``, and the
``schedule``: the clients the project's ``sample_clients`` draws each round), ``init.pt`` (the
initial weights of ``cnn``, which every runner loads) and ``experiment.json``. The project
therefore trains on exactly these clients by construction; the peers read the files. pfl,
FLGo and FedLab train the schedule's clients each round through their own sampler's extension
point (their config says so: :data:`FOLLOW_SCHEDULE`); the Flower app, quickstart style, keeps
Flower's sampler. Every runner records each round's clients and training images.

:func:`translate` writes one framework's own config into a run folder and returns the command
that runs it (:class:`Launch`): the project's ``./run.sh`` (simulation), ``./run.sh --local``
and ``deploy/local-federation.sh`` get dotted overrides of ``conf/fedavg.yaml``; the peers get
their own config file (a Flower app's ``pyproject.toml``, FLGo's ``option``, pfl's and FedLab's
arguments) read by their runner under ``benchmarks/peers/``. Nothing here imports a peer.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent  # the repository
PEERS_DIR = Path(__file__).resolve().parent / "peers"  # the runners the peers' venvs run
PROJECT_CONFIG = "conf/fedavg.yaml"

PROJECT_MODES = ("fedgo-flwr", "fedgo-flwr-local", "fedgo-flwr-deploy")
"""This project's three ways to run one experiment: ``./run.sh`` (a Flower simulation, the
baseline of the table), ``./run.sh --local`` (no Ray: its clients side by side in
:func:`local_workers` processes) and a deployment on 127.0.0.1."""
PEERS = ("flower", "pfl", "flgo", "fedlab")
"""The other simulators: a plain Flower app (quickstart-pytorch style), pfl-research, FLGo and
FedLab."""
FRAMEWORKS = PROJECT_MODES + PEERS
FOLLOW_SCHEDULE = PROJECT_MODES + ("pfl", "flgo", "fedlab")
"""The frameworks that train ``partition.json``'s ``schedule`` each round: the project (its
``sample_clients`` made the schedule) and the peers whose runners hand it to their sampler."""


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One FedAvg experiment, the same for every framework.

    ``train_subset`` / ``test_subset``: stratified subsets of CIFAR-10's 50,000 / 10,000
    images (``None``: all); ``threads``: torch threads of every process (also OMP and MKL) and
    the CPUs a simulated client reserves in the Ray simulations (``./run.sh``, the Flower app);
    evaluation is central, on the test split, before round 1 and after the last round.
    """

    data: str = ".cache/cifar10-jpg"
    train_subset: int | None = None
    test_subset: int | None = 2000
    num_clients: int = 100
    clients_per_round: int = 10
    alpha: float = 0.5
    rounds: int = 20
    local_epochs: int = 1
    batch_size: int = 32
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    eval_batch_size: int = 64
    seed: int = 0
    threads: int = 1

    def __post_init__(self) -> None:
        problems = []
        for key in ("num_clients", "clients_per_round", "rounds", "local_epochs", "batch_size"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{key} must be a whole number >= 1, got {value!r}")
        for key in ("eval_batch_size", "threads"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{key} must be a whole number >= 1, got {value!r}")
        if isinstance(self.clients_per_round, int) and isinstance(self.num_clients, int):
            if self.clients_per_round > self.num_clients:
                problems.append(
                    f"clients_per_round ({self.clients_per_round}) exceeds num_clients "
                    f"({self.num_clients})"
                )
        for key in ("train_subset", "test_subset"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or value < 1):
                problems.append(f"{key} must be null or a whole number >= 1, got {value!r}")
        if not (isinstance(self.alpha, (int, float)) and self.alpha > 0):
            problems.append(f"alpha must be > 0, got {self.alpha!r}")
        if not (isinstance(self.lr, (int, float)) and self.lr > 0):
            problems.append(f"lr must be > 0, got {self.lr!r}")
        if problems:
            raise ValueError("experiment: " + "; ".join(problems))

    @property
    def fraction(self) -> float:
        """Share of clients per round that every framework turns back into ``m`` by flooring
        ``f * K``: ``(m + 1/2) / K`` (1 when ``m = K``), since ``m / K`` itself floors to
        ``m - 1`` for some ``m, K`` (15 of 22)."""
        m, k = self.clients_per_round, self.num_clients
        return 1.0 if m == k else (m + 0.5) / k


SHAPES: dict[str, Experiment] = {
    "cross-device": Experiment(num_clients=100, clients_per_round=10, rounds=20),
    # 2,000 images a silo: a round trains 10,000, twice a cross-device round (10 clients of ~500)
    "cross-silo": Experiment(num_clients=5, clients_per_round=5, rounds=10, train_subset=10000),
    "tiny": Experiment(
        num_clients=4,
        clients_per_round=4,
        rounds=3,
        local_epochs=2,
        train_subset=1000,
        test_subset=500,
    ),
}


def load_experiment(source: str, overrides: Sequence[str] = ()) -> Experiment:
    """A shape of :data:`SHAPES` or a YAML file of :class:`Experiment`'s keys, with
    ``key=value`` overrides (YAML values). Raises ``ValueError`` naming an unknown key or a
    bad value."""
    import yaml

    if source in SHAPES:
        raw: dict[str, Any] = dataclasses.asdict(SHAPES[source])
    else:
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"no shape or file {source!r} (shapes: {', '.join(SHAPES)})")
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{source}: not a mapping of experiment keys")
        raw = loaded
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"override {item!r} is not key=value")
        raw[key.strip()] = yaml.safe_load(value)
    known = {f.name for f in dataclasses.fields(Experiment)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"unknown experiment keys {unknown} (known: {sorted(known)})")
    return Experiment(**raw)


# ------------------------------------------------------------------------------------------
# This project: the config the three modes run, and the files every peer reads
# ------------------------------------------------------------------------------------------


def project_overrides(exp: Experiment, data_path: str | Path) -> list[str]:
    """Dotted overrides of :data:`PROJECT_CONFIG` for ``exp``: all training images go to the
    clients (``data.server_fraction=0``: FedAvg has no server data), no augmentation, no
    checkpoints, evaluation before round 1 and after the last round (``eval.every=rounds``),
    and FedAvg's own aggregation, the ``n_k``-weighted mean the peers compute (the project's
    default rule, ``consensus``, is a robust rule: another algorithm, docs/running.md)."""

    def null(value: int | None) -> str:
        return "null" if value is None else str(value)

    return [
        "name=peers-fedavg",
        f"seed={exp.seed}",
        f"rounds={exp.rounds}",
        f"fraction={exp.fraction!r}",
        "min_clients=1",
        "checkpoint=false",
        "data.dataset=imagefolder",
        f"data.path={data_path}",
        f"data.num_clients={exp.num_clients}",
        f"data.alpha={exp.alpha!r}",
        "data.partition=dirichlet",
        "data.server_fraction=0.0",
        "data.min_client_size=2",
        "data.augment=false",
        f"data.train_subset={null(exp.train_subset)}",
        f"data.test_subset={null(exp.test_subset)}",
        "model.name=cnn",
        f"train.local_epochs={exp.local_epochs}",
        f"train.batch_size={exp.batch_size}",
        "train.optimizer=sgd",
        f"train.lr={exp.lr!r}",
        f"train.momentum={exp.momentum!r}",
        f"train.weight_decay={exp.weight_decay!r}",
        f"eval.batch_size={exp.eval_batch_size}",
        f"eval.every={exp.rounds}",
        "strategy.name=fedavg",
        "strategy.aggregation.rule=mean",
        f"resources.client_cpus={exp.threads}",
        f"resources.server_cpus={exp.threads}",
        "device=cpu",
        "client_device=cpu",
    ]


def export_shared(exp: Experiment, data_path: Path, shared: Path) -> dict[str, Any]:
    """Write ``data.npz``, ``partition.json``, ``init.pt`` and ``experiment.json`` into
    ``shared`` from the project's own loader, partition, model and sampler (the config of
    :func:`project_overrides`); return the partition record."""
    import numpy as np
    import torch

    from benchmarks.sweep import load_config
    from fedgo_flwr.learning.task import load_bundle, make_partition, new_model, sample_clients

    cfg = load_config(PROJECT_CONFIG, project_overrides(exp, data_path))
    bundle = load_bundle(cfg.data)
    partition = make_partition(cfg)
    shared.mkdir(parents=True, exist_ok=True)
    np.savez(
        shared / "data.npz",
        train_x=np.asarray(bundle.train.x),
        train_y=np.asarray(bundle.train.y),
        test_x=np.asarray(bundle.test.x),
        test_y=np.asarray(bundle.test.y),
    )
    per_round = cfg.clients_per_round
    if per_round != exp.clients_per_round:  # fraction's floor must give m back exactly
        raise ValueError(
            f"fraction {exp.fraction!r} gives {per_round} clients a round, not "
            f"{exp.clients_per_round}"
        )
    record = {
        "num_classes": int(bundle.train.num_classes),
        "clients": [c.tolist() for c in partition.clients],
        "schedule": [
            sample_clients(cfg.seed, r, exp.num_clients, per_round)
            for r in range(1, exp.rounds + 1)
        ],
    }
    (shared / "partition.json").write_text(json.dumps(record) + "\n")
    torch.save(new_model(cfg, bundle).state_dict(), shared / "init.pt")
    (shared / "experiment.json").write_text(json.dumps(dataclasses.asdict(exp), indent=1) + "\n")
    return record


# ------------------------------------------------------------------------------------------
# Translations: one framework's config in a run folder, and the command that runs it
# ------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Launch:
    """How to start one run: the command, extra environment, and where the project writes its
    records (``output_dir``; ``None`` for a peer, whose runner writes ``rounds.jsonl`` and
    ``result.json`` into the run folder)."""

    command: tuple[str, ...]
    env: dict[str, str]
    output_dir: Path | None = None


class Unsupported(ValueError):
    """The framework cannot run this experiment (a setting it cannot express, or a shape that
    does not fit the machine); the message goes into the table's row."""


DEPLOY_MAX_NODES = 20
"""A deployment runs one SuperNode process per client (about 0.3 GB each with torch): more
than this many do not fit beside the rest on the machines this was written for."""


def _null(value: int | None) -> str:
    return "null" if value is None else str(value)


def _setting(run_dir: Path, exp: Experiment, shared: Path, config: dict[str, Any]) -> None:
    """``setting.json``, which every peer runner reads (``benchmarks/peers/common.py``)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    setting = {"experiment": dataclasses.asdict(exp), "shared": str(shared), "config": config}
    (run_dir / "setting.json").write_text(json.dumps(setting, indent=1) + "\n")


def local_workers(exp: Experiment, cpus: int | None = None) -> int:
    """``--local``'s worker processes (``resources.local_workers``): one per ``threads`` of the
    ``cpus`` (default: the CPUs this process may run on), as many clients side by side as the
    Ray simulations train."""
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cpus or 1) // exp.threads)


def _project(framework: str, exp: Experiment, run_dir: Path, python: Path | None) -> Launch:
    data = Path(exp.data) if Path(exp.data).is_absolute() else ROOT / exp.data
    out = run_dir / "out"
    overrides = [*project_overrides(exp, data), f"output_dir={out}"]
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "overrides.txt").write_text("\n".join(overrides) + "\n")
    venv = str(python.parent.parent) if python is not None else None
    env = {"FEDGO_VENV": venv} if venv else {}
    if framework == "fedgo-flwr":
        command = [str(ROOT / "run.sh"), PROJECT_CONFIG, *overrides]
        env["FEDGO_FLWR_HOMES"] = str(run_dir / "flwr")
    elif framework == "fedgo-flwr-local":
        workers = f"resources.local_workers={local_workers(exp)}"
        command = [str(ROOT / "run.sh"), "--local", PROJECT_CONFIG, *overrides, workers]
    else:
        if exp.num_clients > DEPLOY_MAX_NODES:
            raise Unsupported(
                f"a deployment starts one SuperNode process per client; {exp.num_clients} "
                f"clients > {DEPLOY_MAX_NODES} (DEPLOY_MAX_NODES) do not fit in memory here"
            )
        command = [str(ROOT / "deploy" / "local-federation.sh"), PROJECT_CONFIG, *overrides]
        env["FEDGO_DEPLOY_DIR"] = str(run_dir / "deploy")
    return Launch(tuple(command), env, out)


FLOWER_PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "peers-flower"
version = "1.0.0"
dependencies = ["flwr[simulation]==1.42.0", "torch==2.14.1"]

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "peers"

[tool.flwr.app.components]
serverapp = "flower_peer:server"
clientapp = "flower_peer:client"

[tool.flwr.app.config]
run-dir = {run_dir}
"""


def _flower(exp: Experiment, shared: Path, run_dir: Path) -> dict[str, Any]:
    app = run_dir / "flower_app"
    app.mkdir(parents=True, exist_ok=True)
    for name in ("flower_peer.py", "common.py"):
        shutil.copyfile(PEERS_DIR / name, app / name)
    (app / "pyproject.toml").write_text(FLOWER_PYPROJECT.format(run_dir=json.dumps(str(run_dir))))
    return {
        "fraction_fit": exp.fraction,
        "min_fit_clients": exp.clients_per_round,
        "min_available_clients": exp.num_clients,
        "federation_config": (
            f"num-supernodes={exp.num_clients} client-resources-num-cpus={exp.threads} "
            "client-resources-num-gpus=0.0"
        ),
    }


def _pfl(exp: Experiment) -> dict[str, Any]:
    return {
        "central_num_iterations": exp.rounds,
        "evaluation_frequency": exp.rounds,
        "train_cohort_size": exp.clients_per_round,
        "val_cohort_size": None,
        "local_learning_rate": exp.lr,
        "local_num_epochs": exp.local_epochs,
        "local_batch_size": exp.batch_size,
        "local_momentum": exp.momentum,
        "local_weight_decay": exp.weight_decay,
        "user_sampler": "schedule",  # common.ScheduleSampler: partition.json's schedule
    }


def _flgo(exp: Experiment) -> dict[str, Any]:
    return {
        "num_rounds": exp.rounds,
        "proportion": exp.fraction,
        "sample": "uniform",  # FLGo's own sampler, replaced by the schedule's (runner)
        "schedule": True,  # the runner's Server.sample returns partition.json's schedule
        "aggregate": "other",
        "num_epochs": exp.local_epochs,
        "num_steps": -1,
        "learning_rate": exp.lr,
        "batch_size": exp.batch_size,
        "optimizer": "SGD",
        "momentum": exp.momentum,
        "weight_decay": exp.weight_decay,
        "train_holdout": 0.0,
        "test_holdout": 0.0,
        "eval_interval": exp.rounds,
        "test_batch_size": exp.eval_batch_size,
        "torch_num_threads": exp.threads,
        "num_parallels": 1,
        "num_workers": 0,
        "seed": exp.seed,
        "gpu": [],
        "no_tqdm": True,
        "log_level": "WARNING",
    }


def _fedlab(exp: Experiment) -> dict[str, Any]:
    if exp.momentum or exp.weight_decay:
        raise Unsupported(
            "FedLab's SGDSerialClientTrainer.setup_optim takes epochs, batch size and lr only "
            f"(momentum {exp.momentum}, weight_decay {exp.weight_decay} asked)"
        )
    return {
        "num_clients": exp.num_clients,
        "sample_ratio": exp.fraction,
        "schedule": True,  # the runner's handler samples partition.json's schedule
        "global_round": exp.rounds,
        "epochs": exp.local_epochs,
        "batch_size": exp.batch_size,
        "lr": exp.lr,
    }


RUNNERS = {
    "flower": "flower_launch.py",
    "pfl": "pfl_runner.py",
    "flgo": "flgo_runner.py",
    "fedlab": "fedlab_runner.py",
}


def translate(
    framework: str, exp: Experiment, shared: Path, run_dir: Path, python: Path | None = None
) -> Launch:
    """Write ``framework``'s config for ``exp`` into ``run_dir`` and return how to run it;
    ``python``: the peer venv's interpreter (for the project's modes: the venv ``run.sh`` is
    given as ``$FEDGO_VENV``; ``None``: its default). Raises :class:`Unsupported`."""
    if framework in PROJECT_MODES:
        return _project(framework, exp, run_dir, python)
    if framework not in PEERS:
        raise ValueError(f"unknown framework {framework!r} (known: {', '.join(FRAMEWORKS)})")
    run_dir.mkdir(parents=True, exist_ok=True)
    if framework == "flower":
        config = _flower(exp, shared, run_dir)
    else:
        config = {"pfl": _pfl, "flgo": _flgo, "fedlab": _fedlab}[framework](exp)
    _setting(run_dir, exp, shared, config)
    command = (str(python or "python"), str(PEERS_DIR / RUNNERS[framework]), str(run_dir))
    return Launch(command, {})
