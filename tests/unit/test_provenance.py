"""A config's fingerprint and a run folder's env.json (fedgo_flwr.records.provenance)."""

import json

import yaml

from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.records.provenance import (
    config_differences,
    config_fingerprint,
    environment,
    write_environment,
)


def _config(**changes):
    raw = ExperimentConfig().to_dict()
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        section = raw
        for key in path:
            section = section[key]
        section[last] = value
    return raw


def test_seed_and_output_keys_leave_the_fingerprint_alone():
    base = config_fingerprint(_config())
    assert config_fingerprint(_config(seed=7, name="other", output_dir="x", resume=True)) == base
    assert config_fingerprint(_config(logging__tensorboard=True, checkpoint=False)) == base


def test_every_result_key_changes_the_fingerprint():
    base = config_fingerprint(_config())
    for change in ({"rounds": 3}, {"data__alpha": 0.5}, {"train__lr": 0.01}):
        assert config_fingerprint(_config(**change)) != base, change
    mu = _config()
    mu["strategy"]["mu"] = 0.01
    assert config_fingerprint(mu) != base


def test_fingerprint_survives_the_yaml_a_run_writes():
    cfg = ExperimentConfig()
    assert config_fingerprint(yaml.safe_load(cfg.to_yaml())) == config_fingerprint(cfg.to_dict())


def test_differences_name_the_dotted_keys():
    a = _config()
    b = _config(rounds=3, data__alpha=1.0, seed=5)
    b["strategy"]["mu"] = 0.1
    assert config_differences(a, b) == ["data.alpha", "rounds", "strategy.mu"]
    assert config_differences(a, _config(seed=9)) == []


def test_environment_records_code_and_command(tmp_path):
    env = environment(_config(), argv=["run.sh", "conf/x.yaml"])
    assert env["command"] == ["run.sh", "conf/x.yaml"]
    assert env["config_fingerprint"] == config_fingerprint(_config())
    assert env["packages"]["torch"] and env["python"]
    assert set(env["git"]) == {"commit", "dirty"}
    first = write_environment(tmp_path, _config())
    second = write_environment(tmp_path, _config(), resumed=True)
    stored = json.loads((tmp_path / "env.json").read_text())
    assert stored["earlier"] == [json.loads(json.dumps(first))]
    assert stored["started"] == second["started"]


def test_launch_from_run_sh_environment_is_taken_out_of_it():
    from fedgo_flwr.records.provenance import Launch

    env = {"FEDGO_COMMAND": "./run.sh conf/a\\ b.yaml 'name=x y' ", "FEDGO_STARTED": "100.5"}
    launch = Launch.from_environ(env)
    assert launch == Launch(("./run.sh", "conf/a b.yaml", "name=x y"), 100.5)
    assert env == {}  # a process started later does not inherit them
    assert Launch.from_json(launch.to_json()) == launch
    assert Launch.from_environ({}) == Launch() == Launch.from_json("")
    # an unbalanced quote is kept as typed; a start that is no number is unknown
    odd = Launch.from_environ({"FEDGO_COMMAND": "./run.sh 'x", "FEDGO_STARTED": "soon"})
    assert odd == Launch(("./run.sh 'x",), None)
    assert Launch.from_json('{"command": [1], "started": "nan"}') == Launch()
    assert Launch.from_json("[") == Launch()


def test_launch_seconds_are_believed_only_when_plausible():
    from fedgo_flwr.records.provenance import Launch

    assert Launch(started=100.0).seconds_before(now=112.5) == 12.5
    assert Launch(started=100.0).seconds_before(now=90.0) == 0.0  # in the future
    assert Launch(started=100.0).seconds_before(now=100.0 + 2 * 86400) == 0.0  # left over
    assert Launch().seconds_before() == 0.0


def test_environment_keeps_the_process_arguments_beside_the_users_command(tmp_path):
    env = write_environment(tmp_path, _config(), command=["./run.sh", "conf/x.yaml"])
    assert env["command"] == ["./run.sh", "conf/x.yaml"] and "process" in env
    assert json.loads((tmp_path / "env.json").read_text())["command"] == env["command"]
    assert "process" not in environment(_config())
