"""Command-line helpers used by ``run.sh`` (``python -m fedgo_app.cli ...``).

``prepare CONFIG [k=v ...] --run-toml PATH [--supernodes N]``: validate the experiment (fail
fast, exit 2 with one message naming key, value and file), decide its output folder (a new
one unless ``output_dir`` is set: :func:`fedgo_flwr.records.recorder.decide_output_dir`), write
the Flower run config (``config`` + ``overrides``, the last of them that ``output_dir``; and
``launch``, the command line and start time ``run.sh`` passed in ``$FEDGO_COMMAND`` and
``$FEDGO_STARTED``: :class:`~fedgo_flwr.records.provenance.Launch`) to PATH,
and print the Flower federation config (``num-supernodes``: N, default ``data.num_clients``;
client resources) on stdout for ``flwr run --federation-config``, then the output directory.
With ``--stage DIR``, also link the app's files into DIR, which ``flwr run`` then bundles
(:mod:`fedgo_app.staging`: the same FAB, without walking ``.venv/``).
With fewer SuperNodes than clients, each simulated node serves several clients in turn.

``python -m fedgo_app.inprocess CONFIG [k=v ...]`` (``./run.sh --local``) runs an experiment
in one process instead (:mod:`fedgo_app.inprocess`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import torch

from fedgo_app.cluster import check_cluster, cluster_address
from fedgo_app.staging import stage_app
from fedgo_flwr.config.experiment import (
    ConfigError,
    DataConfig,
    ExperimentConfig,
    config_and_overrides,
    resolve_config_path,
)
from fedgo_flwr.config.names import dataset_entry
from fedgo_flwr.config.schema import Checker
from fedgo_flwr.learning.task import make_partition
from fedgo_flwr.records.provenance import LAUNCH_KEY, Launch
from fedgo_flwr.records.recorder import decide_output_dir, resolve_output_dir
from strategies import available, load_experiment, require_resolved, strategy_class


def _prepare(args: argparse.Namespace) -> int:
    config, given = config_and_overrides(args.config, args.overrides)
    try:
        cfg = load_experiment(config, given)
        config_path = resolve_config_path(config)
        preflight(cfg)
        check_simulation_devices(cfg)
        supernodes = args.supernodes or cfg.data.num_clients
        if supernodes < 1:
            print("fedgo-flwr: --supernodes must be >= 1", file=sys.stderr)
            return 2
        # The run's folder, last: a new one unless output_dir is set; an earlier run there is
        # kept (refused before anything starts). The ServerApp gets it as the last override.
        cfg = decide_output_dir(cfg)
    except ConfigError as exc:
        print(f"fedgo-flwr: invalid configuration: {exc}", file=sys.stderr)
        return 2
    overrides = [*given, f"output_dir={json.dumps(cfg.output_dir)}"]
    toml = (
        f"config = {json.dumps(str(config_path))}\n"
        f"overrides = {json.dumps(' '.join(_quote(o) for o in overrides))}\n"
    )
    launch = Launch.from_environ()  # run.sh's command line and start, for the ServerApp
    if launch != Launch():
        toml += f"{LAUNCH_KEY} = {json.dumps(launch.to_json())}\n"
    Path(args.run_toml).parent.mkdir(parents=True, exist_ok=True)
    Path(args.run_toml).write_text(toml)
    print(
        f"fedgo-flwr: {cfg.name}: {cfg.strategy.name} on {cfg.data.dataset}, "
        f"{cfg.data.num_clients} clients (alpha {cfg.data.alpha}), {cfg.rounds} rounds, "
        f"{cfg.clients_per_round} clients/round -> {resolve_output_dir(cfg.output_dir)}",
        file=sys.stderr,
    )
    gpus = cfg.resources.client_gpus
    print(
        f"num-supernodes={supernodes} "
        f"client-resources-num-cpus={cfg.resources.client_cpus} "
        f"client-resources-num-gpus={float(gpus)}"
    )
    print(resolve_output_dir(cfg.output_dir))
    if args.stage:
        stage_app(Path.cwd(), Path(args.stage))  # the folder `flwr run .` would bundle
    return 0


def preflight(cfg: ExperimentConfig) -> None:
    """Checks of the machine and the files rather than the schema, before anything starts.

    Run by ``prepare`` (so ``run.sh`` stops with exit 2) and by the ServerApp (so a plain
    ``flwr run`` or a deployment stops before it writes anything); a problem raises one
    :class:`ConfigError` naming the key, the value and where it was set:

    - local data must be there: the folder of the dataset's entry
      (:data:`fedgo_flwr.config.names.DATASETS`: ``imagefolder``'s ``train/``, CIFAR's
      torchvision folder when ``data.download`` is off);
    - every ``path`` key of the strategy's parameters (``strategy.generator.path``,
      ``strategy.discriminator.path``) must name an existing file;
    - ``device: cuda:N`` needs a CUDA device N on this machine, ``mps`` Apple's MPS;
    - ``logging.tensorboard`` and ``logging.mlflow`` need their package;
    - what the strategy needs of the whole experiment (:meth:`Strategy.preflight`, e.g. FedDF's
      and FedGO's server data, ``data.server_fraction > 0``);
    - with ``data.partition`` other than the default ``dirichlet``, that the split exists: it is
      drawn here (it needs the dataset's labels; cached, so the ServerApp does not draw it
      again), e.g. ``data.classes_per_client`` no larger than the dataset's number of classes.
    """
    require_resolved(cfg, "preflight")
    c = Checker(cfg.strategy.sources)
    _check_data(cfg.data, c.at("data.", cfg.data))
    if cfg.data.partition != "dirichlet":
        make_partition(cfg)
    _check_device(cfg.device, c.at("", cfg))
    if cfg.logging.tensorboard:
        c.at("logging.", cfg.logging).require(
            "tensorboard",
            importlib.util.find_spec("tensorboard") is not None,
            "the tensorboard package is not installed: pip install -e '.[tensorboard]'",
        )
    if cfg.logging.mlflow:
        c.at("logging.", cfg.logging).require(
            "mlflow",
            importlib.util.find_spec("mlflow") is not None,
            "the mlflow package is not installed: pip install -e '.[mlflow]'",
        )
    _check_paths(cfg.strategy.params, c.at("strategy.", cfg.strategy.params))
    cls = strategy_class(cfg.strategy.name)
    if cfg.data.public_path is not None:
        c.at("data.", cfg.data).require(
            "public_path",
            cls.uses_public_data,
            f"strategy {cfg.strategy.name} does not distil on a public set; only "
            + ", ".join(n for n in available() if strategy_class(n).uses_public_data)
            + " do",
        )
    cls.preflight(cfg, c)


def _check_data(data: DataConfig, c: Checker) -> None:
    if data.public_path is not None:
        found = Path(data.public_path).expanduser().is_dir()
        c.require("public_path", found, "no such folder (on the machine that runs the server)")
    entry = dataset_entry(data.dataset)
    if entry is None or entry.folder is None or (entry.download and data.download):
        return
    folder = entry.folder
    root = Path(data.path or entry.default_path or "").expanduser()
    if not entry.download:
        c.require("path", (root / folder).is_dir(), f"no {folder}/ folder there")
    else:
        c.require(
            "path",
            (root / folder).is_dir(),
            f"no {folder}/ folder under {str(root)!r} and data.download is false: set "
            f"data.download: true, or data.path to the folder that holds {folder}/",
        )


def check_simulation_devices(cfg: ExperimentConfig) -> None:
    """The clients' device against the simulation's GPU share (``prepare``, i.e. ``run.sh``).

    Ray hides every GPU from a client that was given none (``resources.client_gpus: 0``), so
    ``client_device: cuda`` would make every client fail: refused, naming both keys. With a GPU
    here and ``client_gpus: 0``, the clients train on the CPU: said on stderr.

    With ``$RAY_ADDRESS`` set the simulation joins that Ray cluster: the clients' GPUs are
    the cluster's, not this machine's, so the cluster's nodes are read instead and a share
    that fits on none of them is refused (:func:`fedgo_app.cluster.check_cluster`).
    """
    c = Checker(cfg.strategy.sources).at("", cfg)
    gpus = cfg.resources.client_gpus
    address = cluster_address()
    if cfg.client_device.startswith("cuda"):
        c.require(
            "client_device",
            gpus > 0,
            "needs resources.client_gpus > 0 in a simulation (Ray hides the GPU from clients "
            "given none); e.g. resources.client_gpus=0.25 puts 4 clients on each GPU",
        )
        if address is None:
            _check_device(cfg.client_device, c, key="client_device")
    if address is not None:
        check_cluster(address, cfg.resources.client_cpus, gpus)
        return
    elif gpus == 0 and torch.cuda.is_available() and cfg.client_device == "auto":
        print(
            "fedgo-flwr: note: this machine has a GPU but resources.client_gpus is 0: the "
            "clients train on the CPU (set resources.client_gpus, e.g. 0.25, to use it)",
            file=sys.stderr,
        )


def _check_device(device: str, c: Checker, key: str = "device") -> None:
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        c.require(
            key,
            index < count,
            f"no CUDA device {index} on this machine (it has {count}); use auto or cpu",
        )
    if device == "mps":
        mps = getattr(torch.backends, "mps", None)
        c.require(key, bool(mps and mps.is_available()), "MPS is not available here")


def _check_paths(section: Any, c: Checker) -> None:
    """Every ``path`` field of ``section`` (a dataclass) and of its subsections: a file."""
    if not dataclasses.is_dataclass(section):
        return
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if f.name == "path" and isinstance(value, str):
            found = Path(value).expanduser().is_file()
            c.require("path", found, "file not found (on the machine that runs the server)")
        elif dataclasses.is_dataclass(value):
            _check_paths(value, c.at(f"{c.prefix}{f.name}.", value))


def _quote(item: str) -> str:
    import shlex

    return shlex.quote(item)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedgo_app.cli")
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="validate a config and write the Flower run config")
    prep.add_argument("config", help="the YAML file (a first key=value: conf/default.yaml's)")
    prep.add_argument("overrides", nargs="*", help="dotted.key=value")
    prep.add_argument("--run-toml", required=True)
    prep.add_argument(
        "--supernodes", type=int, default=0, help="simulated nodes (default: data.num_clients)"
    )
    prep.add_argument(
        "--stage",
        default="",
        help="link the app's files into this new folder, for `flwr run` (fedgo_app.staging)",
    )
    prep.set_defaults(func=_prepare)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
