"""What a run folder records of the run itself: run.log, the command line the user typed
(env.json) and the run's time by stage (summary.json's stage_times, total_time)."""

from __future__ import annotations

import json
import os
import time
import tomllib
from pathlib import Path

import pytest
from helpers import SMALL_GAN, TINY_RUN, rows_of, run_context

from fedgo_app import cli, server_app
from fedgo_app.client_app import app as client_app
from fedgo_app.inprocess import InProcessGrid, run_inprocess
from fedgo_app.inprocess import main as inprocess_main
from fedgo_flwr.records.provenance import COMMAND_VAR, LAUNCH_KEY, STARTED_VAR, Launch
from strategies import load_experiment

ROOT = Path(__file__).resolve().parents[2]
CONF = str(ROOT / "conf/default.yaml")


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def _adds_up(summary: dict) -> None:
    stages = summary["stage_times"]
    assert all(v >= 0 for v in stages.values()), stages
    assert sum(stages.values()) == pytest.approx(summary["total_time"], abs=0.05)


def test_local_run_records_the_users_command_its_launch_and_its_log(tmp_path, monkeypatch):
    """``./run.sh --local`` exports what the user typed and when: env.json says the command,
    the summary counts the time before this process's run started as ``launch``, the stages add
    up to total_time, and run.log holds the run's lines down to the done line."""
    out = tmp_path / "run"
    typed = f"./run.sh --local conf/default.yaml rounds=1 output_dir={out}"
    monkeypatch.setenv(COMMAND_VAR, typed.replace("rounds=1", "'rounds=1'"))
    monkeypatch.setenv(STARTED_VAR, str(time.time() - 5.0))
    assert inprocess_main([CONF, *TINY_RUN, f"output_dir={out}"]) == 0
    assert COMMAND_VAR not in os.environ and STARTED_VAR not in os.environ  # not inherited
    env = json.loads((out / "env.json").read_text())
    assert env["command"] == typed.split()
    assert env["process"] != env["command"]  # this process's own arguments, kept too
    summary = _summary(out)
    stages = summary["stage_times"]
    assert list(stages) == ["launch", "startup", "setup", "rounds", "finish"]
    assert 5.0 <= stages["launch"] < 5.0 + summary["total_time"]
    _adds_up(summary)
    rows = rows_of(out)
    # elapsed counts from the run's start: round 0's includes the launch and the start-up
    assert rows[0]["elapsed"] >= stages["launch"] + stages["startup"]
    assert rows[-1]["elapsed"] <= summary["total_time"]
    log = (out / "run.log").read_text().splitlines()
    assert any("fedgo-flwr: ServerApp start-up" in line for line in log)  # held, then written
    assert " INFO: [default] done: final accuracy" in log[-1]
    assert f"{summary['total_time']:.1f}s" in log[-1]


def test_fedgo_counts_its_generator_and_discriminators_and_a_resume_its_earlier_time(tmp_path):
    """FedGO's pre-FL stage has stages of its own; a resumed run counts the earlier process's
    time (up to its checkpoint) as ``earlier`` and appends to run.log."""
    out = tmp_path / "fedgo"
    base = [
        *TINY_RUN,
        *SMALL_GAN,
        "strategy.name=fedgo",
        "strategy.generator.steps=5",
        "strategy.discriminator.epochs=1",
        f"output_dir={out}",
    ]
    first = run_inprocess(load_experiment(CONF, base))
    stages = first["stage_times"]
    assert list(stages) == [
        "startup",
        "generator",
        "discriminators",
        "setup",
        "rounds",
        "finish",
    ]
    prefl = json.loads((out / "prefl.json").read_text())
    assert stages["generator"] == pytest.approx(prefl["generator_time"])
    _adds_up(first)
    elapsed = rows_of(out)[-1]["elapsed"]
    assert elapsed > stages["generator"] + stages["discriminators"]
    second = run_inprocess(load_experiment(CONF, [*base, "rounds=2", "resume=true"]))
    assert second["stage_times"]["earlier"] == pytest.approx(elapsed)
    assert "generator" in second["stage_times"]  # loaded from the run's own generator.pt
    _adds_up(second)
    assert second["total_time"] > elapsed
    log = (out / "run.log").read_text()
    assert log.count("done: final accuracy") == 2  # the resumed run appended its lines


def test_a_failed_run_writes_its_error_to_run_log(tmp_path, monkeypatch):
    out = tmp_path / "bad"
    cfg = load_experiment(CONF, [*TINY_RUN, f"output_dir={out}"])

    def broken(self, grid):
        raise RuntimeError("set-up broke")

    monkeypatch.setattr("strategies.base.Strategy.setup", broken)
    with pytest.raises(RuntimeError):
        run_inprocess(cfg)
    log = (out / "run.log").read_text()
    assert "ERROR: run failed: Traceback" in log and "RuntimeError: set-up broke" in log
    assert not (out / "summary.json").exists()


def test_prepare_hands_the_launch_to_the_server_app_in_the_run_config(tmp_path, monkeypatch):
    """``run.sh`` runs ``cli prepare`` with the launch in its environment; the run config it
    writes carries it (``launch``) to the ServerApp, whose env.json then records the command the
    user typed and whose summary counts the launch; without it there is no such key."""
    toml = tmp_path / "run.toml"
    out = tmp_path / "o"
    args = ["prepare", CONF, *TINY_RUN, f"output_dir={out}", "--run-toml", str(toml)]
    monkeypatch.setenv(COMMAND_VAR, "./run.sh conf/default.yaml 'name=a b'")
    started = time.time() - 3.0
    monkeypatch.setenv(STARTED_VAR, repr(started))
    assert cli.main(args) == 0
    run_config = tomllib.loads(toml.read_text())
    launch = Launch.from_json(run_config[LAUNCH_KEY])
    assert launch == Launch(("./run.sh", "conf/default.yaml", "name=a b"), started)
    server_app.main(InProcessGrid(client_app, 4), run_context(**run_config))
    assert json.loads((out / "env.json").read_text())["command"] == list(launch.command)
    assert _summary(out)["stage_times"]["launch"] >= 3.0
    assert cli.main(["prepare", CONF, f"output_dir={tmp_path / 'p'}", "--run-toml", str(toml)]) == 0
    assert LAUNCH_KEY not in tomllib.loads(toml.read_text())  # the variables were taken
