"""What a user sees when a config or a command line is wrong, ``strict: true`` and ``--help``.

The table of refused configurations is ``tests/unit/test_config.py``'s ``REFUSED``; here are
the exact messages of the common mistakes and what the command line makes of its words.
"""

from __future__ import annotations

import logging
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from fedgo_app.cli import main as cli_main
from fedgo_flwr.config.experiment import DEFAULT_CONFIG, ConfigError, config_and_overrides
from strategies import available, load_experiment

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"


def test_an_unknown_strategy_echoes_the_name_typed_and_the_closest():
    with pytest.raises(ConfigError) as info:
        load_experiment(CONF / "default.yaml", ["strategy.name=fedgoo"])
    known = ", ".join(available())
    assert str(info.value) == (
        "override 'strategy.name=fedgoo': strategy.name = 'fedgoo': unknown; choose one of "
        f"{known} (did you mean 'fedgo'?)"
    )
    with pytest.raises(ConfigError) as info:  # nothing close: no guess
        load_experiment(CONF / "default.yaml", ["strategy.name=zzz"])
    assert str(info.value).endswith(f"strategy.name = 'zzz': unknown; choose one of {known}")


def test_a_broken_yaml_file_is_named_with_its_line(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("rounds: 3\ndata:\n  alpha: 0.1\n   num_clients: 5\n")
    with pytest.raises(ConfigError) as info:
        load_experiment(path)
    assert str(info.value) == (
        f"config = '{path}': not valid YAML at line 4, column 15 ('num_clients: 5'): "
        "mapping values are not allowed here"
    )
    path.write_text('name: "unclosed\nrounds: 3\n')  # what the parser was reading, and where
    with pytest.raises(ConfigError, match=r"while scanning a quoted scalar at line 1, column 7"):
        load_experiment(path)


def test_a_base_file_that_is_missing_is_named_with_the_file_that_names_it(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("base: nothere.yaml\n")
    with pytest.raises(ConfigError) as info:
        load_experiment(path)
    assert str(info.value) == f"{path}: base = '{tmp_path / 'nothere.yaml'}': file not found"


def test_a_word_without_equals_sign_says_what_an_override_is():
    with pytest.raises(ConfigError) as info:
        load_experiment(CONF / "default.yaml", ["conf/fedgo.yaml"])
    assert str(info.value) == (
        "command line: override = 'conf/fedgo.yaml': expected dotted.key=value (only the first "
        "argument names a config file)"
    )


@pytest.mark.parametrize(
    "words, expected",
    [
        ([], (DEFAULT_CONFIG, [])),
        (["rounds=3"], (DEFAULT_CONFIG, ["rounds=3"])),
        (["rounds=3", "seed=1"], (DEFAULT_CONFIG, ["rounds=3", "seed=1"])),
        (["conf/fedgo.yaml", "rounds=3"], ("conf/fedgo.yaml", ["rounds=3"])),
        (["a b=c"], ("a b=c", [])),  # no key: a file name, refused as not found
    ],
)
def test_a_first_word_that_is_an_override_means_the_default_config(words, expected):
    first = words[0] if words else None
    assert config_and_overrides(first, words[1:]) == expected


def test_a_file_whose_name_has_an_equals_sign_stays_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("x=1.yaml").write_text("rounds: 2\n")
    assert config_and_overrides("x=1.yaml", ["seed=2"]) == ("x=1.yaml", ["seed=2"])


def test_prepare_runs_the_default_config_for_a_first_override(tmp_path, monkeypatch, capsys):
    """``./run.sh rounds=2`` (run.sh hands ``rounds=2`` to prepare as the config)."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("FEDGO_WORKDIR", str(tmp_path))
    run_toml = tmp_path / "run.toml"
    assert cli_main(["prepare", "rounds=2", "seed=5", "--run-toml", str(run_toml)]) == 0
    assert "2 rounds" in capsys.readouterr().err
    run = tomllib.loads(run_toml.read_text())
    assert Path(run["config"]) == CONF / "default.yaml"
    cfg = load_experiment(run["config"], run["overrides"])
    assert (cfg.rounds, cfg.seed) == (2, 5)


# -- strict: true -----------------------------------------------------------------------------


def test_another_strategys_key_warns_by_default_and_strict_refuses_it(caplog, tmp_path):
    with caplog.at_level(logging.WARNING, logger="fedgo_flwr"):
        cfg = load_experiment(CONF / "default.yaml", ["strategy.mu=0.1"])
    assert cfg.strategy.name == "fedavg" and "mu" not in cfg.strategy.raw_params
    assert "strategy.mu ignored: a parameter of fedprox, not of fedavg" in caplog.text
    assert "strict: true makes this an error" in caplog.text
    with pytest.raises(ConfigError) as info:
        load_experiment(CONF / "default.yaml", ["strict=true", "strategy.mu=0.1"])
    assert info.value.key == "strategy.mu" and info.value.value == 0.1
    assert str(info.value) == (
        "override 'strategy.mu=0.1': strategy.mu = 0.1: a parameter of fedprox, not of fedavg "
        "(strict: true refuses it)"
    )
    path = tmp_path / "exp.yaml"  # from a file, naming the file
    path.write_text("base: {}\nstrict: true\nstrategy: {{mu: 0.1}}\n".format(CONF / "base.yaml"))
    with pytest.raises(ConfigError, match=re.escape(f"{path}: strategy.mu = 0.1: a parameter")):
        load_experiment(path)


def test_strict_refuses_a_key_set_that_the_strategy_ignores(caplog):
    """DaFKD trains no generator at the server: a ``strategy.generator.steps`` the config sets
    warns, and with strict is refused; the inherited default (not set) is no error."""
    overrides = ["strategy.name=dafkd", "strategy.generator.steps=5"]
    with caplog.at_level(logging.WARNING):
        load_experiment(CONF / "default.yaml", overrides)
    assert "strategy.generator.steps ignored: dafkd trains no generator" in caplog.text
    with pytest.raises(ConfigError) as info:
        load_experiment(CONF / "default.yaml", [*overrides, "strict=true"])
    assert info.value.key == "strategy.generator.steps" and info.value.value == 5
    assert str(info.value).endswith("strict: true refuses it")
    cfg = load_experiment(CONF / "default.yaml", ["strategy.name=dafkd", "strict=true"])
    assert cfg.strategy.params.generator.steps > 0  # the default, not set: warned only


def test_a_folder_named_as_config_is_said_to_be_one(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_experiment(tmp_path)
    assert str(info.value) == f"config = '{tmp_path}': a folder, not a YAML file"


def test_strict_accepts_a_config_whose_keys_are_all_used():
    for name in ("default", "fedgo", "fedprox", "scaffold", "feddf", "dafkd"):
        cfg = load_experiment(CONF / f"{name}.yaml", ["strict=true"])
        assert cfg.strict
    assert not load_experiment(CONF / "default.yaml").strict  # opt-in


def test_strict_is_no_setting_of_what_runs():
    """It changes neither the config's fingerprint nor whether a checkpoint may be resumed."""
    from fedgo_flwr.records.checkpoint import RESUMABLE_CHANGES
    from fedgo_flwr.records.provenance import config_fingerprint

    plain = load_experiment(CONF / "default.yaml").to_dict()
    strict = load_experiment(CONF / "default.yaml", ["strict=true"]).to_dict()
    assert config_fingerprint(plain) == config_fingerprint(strict)
    del plain["strict"]  # a run folder of a version without the key
    assert config_fingerprint(plain) == config_fingerprint(strict)
    assert "strict" in RESUMABLE_CHANGES


# -- ./run.sh --help ----------------------------------------------------------------------------


def _help() -> str:
    out = subprocess.run(
        ["bash", str(ROOT / "run.sh"), "--help"], capture_output=True, text=True, check=True
    )
    return out.stdout


def test_run_sh_help_names_every_mode_and_environment_variable():
    """Every ``--mode)`` of run.sh's ``case``, and every environment variable that run.sh or the
    Python code reads (``FEDGO_*``, ``PYTHON``, ``RAY_ADDRESS``), is in ``--help``; the text
    ends with a full stop (it once stopped mid-sentence)."""
    text = _help()
    script = (ROOT / "run.sh").read_text()
    modes = set(re.findall(r"^  (--[a-z]+)(?:\|[^)]*)?\)$", script, re.M))
    assert {"--setup", "--tests", "--report", "--sweep", "--local"} <= modes
    for mode in modes:
        assert f"./run.sh {mode}" in text, mode
    code = "\n".join(
        p.read_text() for pkg in ("fedgo_flwr", "fedgo_app") for p in (ROOT / pkg).rglob("*.py")
    )
    variables = set(re.findall(r"\bFEDGO_[A-Z_]+\b", script + code))
    variables -= {"FEDGO_DEPLOY_DIR"}  # deploy/'s scripts (deployment.md), not run.sh's
    variables |= {"PYTHON", "RAY_ADDRESS"}
    for name in variables:
        assert re.search(rf"^  {name}=", text, re.M), name
    assert text.rstrip().endswith(".") and "\n#" not in text


def test_run_sh_refuses_an_unknown_option():
    out = subprocess.run(
        ["bash", str(ROOT / "run.sh"), "--rounds=3"], capture_output=True, text=True
    )
    assert out.returncode == 2
    assert (
        out.stderr.strip()
        == "fedgo-flwr: unknown option --rounds=3 (./run.sh --help lists the modes)"
    )


def test_a_checkpoint_from_before_a_strategy_key_existed_resumes_at_its_default():
    """A strategy parameter added after a checkpoint was written (Co-Boosting's ``share_cap``)
    is no change while the run keeps its default (the behaviour the checkpoint ran with), and
    is one when set otherwise; a core key likewise."""
    from fedgo_flwr.records.checkpoint import config_differences

    cfg = load_experiment(CONF / "coboosting.yaml")
    saved = cfg.to_dict()
    del saved["strategy"]["share_cap"]
    assert config_differences(saved, cfg) == []
    off = load_experiment(CONF / "coboosting.yaml", ["strategy.share_cap=false"])
    assert config_differences(saved, off) == ["strategy.share_cap (None -> False)"]
    saved["strategy"]["epochs"] = cfg.strategy.params.epochs + 1  # a key both have
    assert config_differences(saved, cfg) == [
        f"strategy.epochs ({cfg.strategy.params.epochs + 1} -> {cfg.strategy.params.epochs})"
    ]
    del saved["strict"]
    assert config_differences(saved, cfg)[0].startswith("strategy.epochs")
