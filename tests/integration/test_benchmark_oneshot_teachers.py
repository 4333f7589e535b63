"""benchmarks/oneshot_teachers.py trains the one-shot clients as the one-shot round does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import ONESHOT_TINY

from benchmarks import oneshot_teachers
from fedgo_app.inprocess import run_inprocess
from fedgo_flwr.runtime.kernels import channels_last, use_channels_last
from strategies import load_experiment

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "conf/coboosting.yaml"
TINY = [*ONESHOT_TINY, "strategy.name=oneshot", "strategy.aggregation.rule=mean", "seed=3"]


@pytest.fixture(autouse=True)
def default_format():
    """The runs here set the process's channels-last switch; the next test starts without it."""
    yield
    use_channels_last(False)


@pytest.mark.parametrize("formats", [[], ["resources.channels_last=true"]])
def test_milestones_are_the_one_shot_uploads_and_a_stopped_run_goes_on(tmp_path, formats):
    """The model after 2 epochs, trained to 1 epoch, stopped and resumed, is client k's upload of
    a one-shot run with ``train.local_epochs=2`` bit for bit, and the ensembles measured at that
    milestone are the strategy's own (FedENS and DW-FedENS, and the parameter average's); in the
    channels-last format too, against a one-shot run in that format."""
    run = tmp_path / "run"
    tiny = [*TINY, *formats]
    run_inprocess(load_experiment(ROOT / CONFIG, [*tiny, f"output_dir={run}"]))
    use_channels_last(False)  # the script sets the format itself
    work, out = tmp_path / "work", tmp_path / "out"
    args = ["--config", CONFIG, "--seeds", "3", "--work", str(work), "--out", str(out), *tiny]
    assert oneshot_teachers.main(["--epochs", "1", *args]) == 0
    first = json.loads((work / "seed3" / "milestones.json").read_text())
    assert [r["epochs"] for r in first] == [1]
    assert oneshot_teachers.main(["--epochs", "1", "2", *args]) == 0
    assert channels_last() == bool(formats)
    uploads = torch.load(run / "client_models.pt", weights_only=False)["clients"]
    assert sorted(int(k) for k in uploads) == [0, 1, 2, 3]
    for k, upload in uploads.items():
        mine = torch.load(work / "seed3" / f"client{k}-e2.pt")["model"]
        assert all(torch.equal(mine[name], upload["state"][name]) for name in mine), k
    summary = json.loads((run / "summary.json").read_text())
    report = json.loads((out / "summary.json").read_text())["seeds"]["3"]
    assert [r["epochs"] for r in report] == [1, 2] and report[0] == first[0]
    last = report[1]
    assert last["fedens"] == pytest.approx(100 * summary["ensemble_accuracy_uniform"], abs=1e-4)
    assert last["dw_fedens"] == pytest.approx(
        100 * summary["ensemble_accuracy_data_size"], abs=1e-4
    )
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert last["fedavg"] == pytest.approx(100 * rows[-1]["test_accuracy"], abs=1e-4)
    assert len(last["clients"]) == 4 and last["train_seconds"] > 0
    # The milestone's uploads seed a server method as the one-shot run's own would.
    dense = tmp_path / "dense"
    overrides = [*tiny, "strategy.name=dense", "strategy.epochs=1", f"output_dir={dense}"]
    teachers = f"strategy.teachers_from={work / 'seed3' / 'e2'}"
    run_inprocess(load_experiment(ROOT / CONFIG, [*overrides, teachers]))
    reused = json.loads((dense / "summary.json").read_text())
    assert reused["ensemble_accuracy_uniform"] == summary["ensemble_accuracy_uniform"]
    row1 = [json.loads(x) for x in (dense / "metrics.jsonl").read_text().splitlines()][1]
    assert row1["round"] == 1 and row1["uploads_reused"] == 1  # no client trained
    with pytest.raises(ValueError, match="train differ"):  # made for 2 epochs, not 1
        run_inprocess(
            load_experiment(ROOT / CONFIG, [*overrides, teachers, "train.local_epochs=1"])
        )
    table = (out / "table.md").read_text()
    assert f"| 2 | 3 | {last['clients_mean']:.2f} (" in table
    assert f"| {last['fedavg']:.2f} | {last['fedens']:.2f} | {last['dw_fedens']:.2f} |" in table


def test_state_of_other_settings_is_refused_naming_the_file(tmp_path, capsys):
    work = tmp_path / "work"
    args = ["--config", CONFIG, "--seeds", "3", "--epochs", "1", "--work", str(work)]
    args += ["--out", str(tmp_path / "out"), *TINY]
    assert oneshot_teachers.main(args) == 0
    (work / "seed3" / "milestones.json").unlink()  # measure again: the clients' state is read
    for other in ("train.lr=0.02", "resources.channels_last=true"):
        assert oneshot_teachers.main([*args, other]) == 2
        err = capsys.readouterr().err
        assert f"{work / 'seed3' / 'client0.pt'}: saved under other settings" in err, other
