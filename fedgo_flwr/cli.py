"""Command-line helpers used by ``run.sh`` (``python -m fedgo_flwr.cli ...``).

``prepare CONFIG [k=v ...] --run-toml PATH``: validate the experiment (fail fast, exit 2 with
one message naming key, value and file), write the Flower run config (``config`` + ``overrides``)
to PATH, and print the Flower federation config (``num-supernodes`` = ``data.num_clients``,
client resources) on stdout for ``flwr run --federation-config``, then the output directory.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fedgo_flwr.config import ConfigError, ExperimentConfig, resolve_config_path
from fedgo_flwr.recorder import check_output_dir, resolve_output_dir
from strategies import load_experiment


def _prepare(args: argparse.Namespace) -> int:
    try:
        cfg = load_experiment(args.config, args.overrides)
        config_path = resolve_config_path(args.config)
        preflight(cfg)
        check_output_dir(cfg)  # an earlier run there is kept: refused before anything starts
    except ConfigError as exc:
        print(f"fedgo-flwr: invalid configuration: {exc}", file=sys.stderr)
        return 2
    toml = (
        f"config = {json.dumps(str(config_path))}\n"
        f"overrides = {json.dumps(' '.join(_quote(o) for o in args.overrides))}\n"
    )
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
        f"num-supernodes={cfg.data.num_clients} "
        f"client-resources-num-cpus={cfg.resources.client_cpus} "
        f"client-resources-num-gpus={float(gpus)}"
    )
    print(resolve_output_dir(cfg.output_dir))
    return 0


def preflight(cfg: ExperimentConfig) -> None:
    """Checks of the machine rather than the schema: local data paths must exist."""
    if cfg.data.dataset == "imagefolder":
        root = Path(cfg.data.path or "").expanduser()
        if not (root / "train").is_dir():
            raise ConfigError("data.path", cfg.data.path, "no train/ folder there")


def _quote(item: str) -> str:
    import shlex

    return shlex.quote(item)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedgo_flwr.cli")
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="validate a config and write the Flower run config")
    prep.add_argument("config")
    prep.add_argument("overrides", nargs="*", help="dotted.key=value")
    prep.add_argument("--run-toml", required=True)
    prep.set_defaults(func=_prepare)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
