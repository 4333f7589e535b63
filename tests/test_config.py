"""Config loading, overrides and validation: a bad value stops with key, value and source."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedgo_flwr.cli import main as cli_main
from fedgo_flwr.config import ConfigError, ExperimentConfig
from strategies import load_experiment, resolve

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
MEAN = {"aggregation": {"rule": "mean", "trim_fraction": 0.2, "clip_norm": None}}
"""The shared ``strategy.aggregation`` section at its defaults (every averaging strategy)."""


def write(tmp_path: Path, text: str, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_every_shipped_config_is_valid():
    files = sorted(CONF.rglob("*.yaml"))
    assert files, "conf/ holds no YAML files"
    for path in files:
        cfg = load_experiment(path)
        assert cfg.rounds >= 1, path


def test_base_chain_and_overrides(tmp_path):
    base = write(tmp_path, "rounds: 3\ndata: {alpha: 0.5, num_clients: 4}\n", "base.yaml")
    child = write(
        tmp_path, f"base: {base.name}\ndata: {{alpha: 0.2}}\nstrategy: {{name: fedprox}}\n"
    )
    cfg = load_experiment(child, ["seed=3", "strategy.mu=0.1", "data.num_clients=5"])
    assert (cfg.rounds, cfg.seed) == (3, 3)
    assert (cfg.data.alpha, cfg.data.num_clients) == (0.2, 5)
    assert cfg.strategy.name == "fedprox" and cfg.strategy.raw_params == {"mu": 0.1, **MEAN}


def test_swapping_strategy_is_one_override():
    cfg = load_experiment(CONF / "default.yaml", "strategy.name=scaffold data.alpha=0.05 seed=3")
    assert cfg.strategy.name == "scaffold"
    assert cfg.strategy.raw_params == {"global_lr": 1.0, "weighted": False, **MEAN}  # defaults
    assert cfg.data.alpha == 0.05


def test_roundtrip_through_json():
    cfg = load_experiment(CONF / "fedprox.yaml")
    again = ExperimentConfig.from_json(cfg.to_json())
    assert again.strategy.params == {"mu": 0.01, **MEAN}  # the core config leaves them untyped
    assert again.to_dict() == cfg.to_dict()
    assert resolve(again) == cfg


@pytest.mark.parametrize(
    "override, key, fragment",
    [
        ("data.alpha=0", "data.alpha", "must be > 0"),
        ("data.alpha=-1", "data.alpha", "must be > 0"),
        ("fraction=1.5", "fraction", "(0, 1]"),
        ("strategy.name=fedfoo", "strategy.name", "unknown"),
        ("data.dataset=mnist3", "data.dataset", "unknown"),
        ("model.name=resnet7", "model.name", "unknown"),
        ("rounds=ten", "rounds", "must be int"),
        ("data.alph=0.1", "data.alph", "did you mean 'data.alpha'"),
        ("strategy.muu=0.1", "strategy.muu", "not a parameter of fedavg"),
        ("train.optimizer=rmsprop", "train.optimizer", "unknown"),
        ("min_clients=50", "min_clients", "<= data.num_clients"),
        ("device=gpu0", "device", "auto, cpu"),
    ],
)
def test_bad_override_names_key_value_and_source(override, key, fragment):
    with pytest.raises(ConfigError) as info:
        load_experiment(CONF / "default.yaml", [override])
    err = info.value
    assert err.key == key
    assert fragment in str(err)
    assert f"override '{override}'" in str(err)


def test_bad_value_in_file_names_the_file(tmp_path):
    path = write(tmp_path, "base: " + str(CONF / "base.yaml") + "\ndata:\n  alpha: -0.5\n")
    with pytest.raises(ConfigError) as info:
        load_experiment(path)
    assert str(path) in str(info.value) and "data.alpha = -0.5" in str(info.value)


def test_strategy_param_range_is_checked(tmp_path):
    path = write(tmp_path, "strategy: {name: fedprox, mu: -1}\n")
    with pytest.raises(ConfigError, match=r"strategy.mu = -1.0: must be >= 0"):
        load_experiment(path)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_experiment(tmp_path / "nope.yaml")
    bad = write(tmp_path, "rounds: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_experiment(bad)
    with pytest.raises(ConfigError, match="expected dotted.key=value"):
        load_experiment(None, ["rounds"])


def test_cli_prepare_fails_fast_with_exit_2(tmp_path, capsys):
    code = cli_main(
        ["prepare", str(CONF / "default.yaml"), "data.alpha=-1", "--run-toml", str(tmp_path / "r")]
    )
    assert code == 2
    assert "data.alpha = -1" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_cli_prepare_writes_run_config(tmp_path, capsys):
    run_toml = tmp_path / "run.toml"
    code = cli_main(["prepare", str(CONF / "default.yaml"), "seed=4", "--run-toml", str(run_toml)])
    assert code == 0
    out = capsys.readouterr().out.strip()
    assert "num-supernodes=20" in out and "client-resources-num-cpus=1" in out
    import tomllib

    run = tomllib.loads(run_toml.read_text())
    assert load_experiment(run["config"], run["overrides"]).seed == 4


def test_swapping_strategy_drops_other_strategies_params(caplog):
    cfg = load_experiment(CONF / "fedgo.yaml", ["strategy.name=fedavg"])
    assert cfg.strategy.name == "fedavg" and cfg.strategy.raw_params == MEAN
    assert "strategy.distill ignored" in caplog.text
    overrides = ["strategy.name=feddf", "strategy.weighting=entropy"]
    cfg = load_experiment(CONF / "fedgo.yaml", overrides)
    assert cfg.strategy.params.distill.epochs == 5  # shared parameters are kept
    assert "generator" not in cfg.strategy.raw_params
