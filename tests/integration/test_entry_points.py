"""The in-process entry point (``python -m fedgo_app.inprocess``, ``run.sh --local``) and
``cli prepare``'s spread of the clients over fewer SuperNodes and its check of the clients'
device (issue 17)."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import TINY_RUN

from fedgo_app import cli
from fedgo_app.inprocess import main as inprocess_main

ROOT = Path(__file__).resolve().parents[2]
TINY = [*TINY_RUN, "rounds=3"]


def test_local_entry_point_runs_an_experiment_in_this_process(tmp_path, capsys):
    out = tmp_path / "run"
    code = inprocess_main([str(ROOT / "conf/default.yaml"), *TINY, f"output_dir={out}"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (
        json.loads(capsys.readouterr().out.strip().splitlines()[-1])["final_accuracy"]
        == (summary["final_accuracy"])
    )
    code = inprocess_main([str(ROOT / "conf/default.yaml"), "data.num_clients=0"])
    assert code == 2
    capsys.readouterr()
    # A check of the machine (the run's own preflight), not of the schema: also exit 2.
    code = inprocess_main([str(ROOT / "conf/default.yaml"), "device=cuda:99", f"output_dir={out}2"])
    assert code == 2 and "no CUDA device 99" in capsys.readouterr().err
    assert not (tmp_path / "run2").exists()


def test_prepare_spreads_clients_over_fewer_supernodes_and_checks_client_devices(tmp_path, capsys):
    def prepare(*args: str) -> int:
        config = [str(ROOT / "conf/default.yaml"), f"output_dir={tmp_path / 'o'}"]
        return cli.main(["prepare", *config, *args, "--run-toml", str(tmp_path / "run.toml")])

    assert prepare("--supernodes", "2") == 0
    assert "num-supernodes=2 " in capsys.readouterr().out
    assert prepare() == 0
    assert "num-supernodes=20 " in capsys.readouterr().out
    assert prepare("client_device=cuda") == 2
    err = capsys.readouterr().err
    assert "client_device" in err and "resources.client_gpus" in err
    assert prepare("client_device=gpu") == 2
    assert "client_device" in capsys.readouterr().err
