"""Flower's run config (``[tool.flwr.app.config]``, ``flwr run --run-config``) names the
experiment, checked as YAML and overrides are."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict
from flwr.common.config import flatten_dict, fuse_dicts, parse_config_args

from fedgo_app.server_app import (
    RUN_CONFIG_FILE_KEYS,
    config_from_context,
    run_config_overrides,
)
from fedgo_flwr.config.experiment import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def declared() -> dict:
    app = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    return flatten_dict(app["config"])


def context(run_config: dict) -> Context:
    return Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=run_config)


def flwr_run_config(text: str) -> dict:
    """What ``flwr run . --run-config TEXT`` gives the ServerApp: Flower's own parsing and
    merging into the declared defaults (unknown keys are Flower's error)."""
    return fuse_dicts(declared(), parse_config_args([text]))


def test_the_declared_defaults_run_the_default_experiment():
    cfg = config_from_context(context(declared()))
    assert run_config_overrides(declared()) == []
    assert cfg.name == "default" and cfg.data.num_clients == 20


def test_run_config_keys_in_flowers_syntax_change_the_experiment():
    run_config = flwr_run_config("rounds=5 seed=3 strategy.name='fedgo' data.alpha=0.05")
    cfg = config_from_context(context(run_config))
    assert (cfg.rounds, cfg.seed, cfg.strategy.name, cfg.data.alpha) == (5, 3, "fedgo", 0.05)
    # `overrides` comes last: it wins over a main key.
    run_config = flwr_run_config("rounds=5 overrides='rounds=7 train.local_epochs=1'")
    cfg = config_from_context(context(run_config))
    assert (cfg.rounds, cfg.train.local_epochs) == (7, 1)
    with pytest.raises(ValueError, match="not present"):
        flwr_run_config("strategy.nmae='fedgo'")  # a misspelt key: Flower refuses it


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("rounds=-1", "rounds"),
        ("strategy.name='fedgoo'", "strategy.name"),
        ("data.alpha='many'", "data.alpha"),
        ("client_device='gpu'", "client_device"),
    ],
)
def test_bad_run_config_values_are_refused_naming_the_key(text, key):
    with pytest.raises(ConfigError) as err:
        config_from_context(context(flwr_run_config(text)))
    assert err.value.key == key


def test_every_declared_key_is_an_experiment_key():
    cfg = config_from_context(context(declared())).to_dict()
    for key in declared():
        if key in RUN_CONFIG_FILE_KEYS:
            continue
        node = cfg
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, key
            node = node[part]
