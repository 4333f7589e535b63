"""A folder per run: ``outputs/<name>/<date-time>`` unless ``output_dir`` is set.

Runs without ``output_dir`` each get a new folder and ``outputs/<name>/latest`` names the newest;
``resume: true`` continues it; a folder named by ``output_dir`` is still never overwritten; a
configuration error in the ServerApp is one log line, without Flower's traceback.
"""

from __future__ import annotations

import json
import logging
import os
import tomllib
from pathlib import Path

import pytest
from flwr.supercore import log
from helpers import ROOT, rows_of, run_context

from fedgo_app import cli, inprocess, server_app
from fedgo_app.client_app import app as client_app
from fedgo_app.inprocess import InProcessGrid, run_inprocess
from fedgo_flwr.config.experiment import ConfigError, split_overrides
from fedgo_flwr.records.recorder import decide_output_dir
from fedgo_flwr.records.report import find_runs, load_run
from fedgo_flwr.records.runfolders import LATEST, is_run_stamp, new_run_folder, point_latest
from strategies import load_experiment

TINY = ["rounds=1", "data.num_clients=4", "fraction=0.5", "train.local_epochs=1"]
TINY += ["data.train_subset=400", "data.test_subset=120"]  # digits cut as TINY_RUN


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """Relative folders (``outputs/...``) resolve in ``tmp_path``."""
    monkeypatch.setenv("FEDGO_WORKDIR", str(tmp_path))
    return tmp_path


def config(*overrides: str):
    return load_experiment(ROOT / "conf/default.yaml", [*TINY, *overrides])


def runs_of(parent: Path) -> list[Path]:
    return sorted(p for p in parent.iterdir() if not p.is_symlink())


def test_two_runs_without_output_dir_get_two_folders_and_latest_names_the_second(workdir):
    first = run_inprocess(config())
    second = run_inprocess(config())
    parent = workdir / "outputs" / "default"
    a, b = runs_of(parent)
    assert all(is_run_stamp(p.name) for p in (a, b))
    assert (parent / LATEST).is_symlink() and os.readlink(parent / LATEST) == b.name
    assert (a / "summary.json").is_file() and (b / "summary.json").is_file()
    assert first["final_accuracy"] == second["final_accuracy"]  # the same seed, the same run


def test_runs_started_in_the_same_second_get_a_suffix(tmp_path):
    import datetime

    now = datetime.datetime(2026, 1, 2, 3, 4, 5)
    names = [new_run_folder(tmp_path, now).name for _ in range(3)]
    assert names == ["2026-01-02_03-04-05", "2026-01-02_03-04-05-1", "2026-01-02_03-04-05-2"]
    assert all(is_run_stamp(n) for n in names)


def test_an_explicit_output_dir_holding_a_run_is_still_refused(workdir, capsys):
    out = workdir / "mine"
    run_inprocess(config(f"output_dir={out}", "checkpoint=false"))
    with pytest.raises(ConfigError, match=r"output_dir = .*holds an earlier run"):
        decide_output_dir(config(f"output_dir={out}"))
    # ./run.sh --local and ./run.sh (cli prepare) stop with exit 2 before anything starts.
    assert inprocess.main([str(ROOT / "conf/default.yaml"), *TINY, f"output_dir={out}"]) == 2
    argv = ["prepare", str(ROOT / "conf/default.yaml"), *TINY, f"output_dir={out}"]
    assert cli.main([*argv, "--run-toml", str(workdir / "run.toml")]) == 2
    assert "holds an earlier run" in capsys.readouterr().err
    assert not (workdir / "outputs").exists()  # no folder was made instead


def test_resume_continues_the_latest_run(workdir):
    run_inprocess(config())
    parent = workdir / "outputs" / "default"
    [folder] = runs_of(parent)
    run_inprocess(config("resume=true", "rounds=2"))
    assert runs_of(parent) == [folder]  # no new folder: the same run, continued
    assert [r["round"] for r in rows_of(folder)] == [0, 1, 2]
    assert json.loads((folder / "summary.json").read_text())["rounds"] == 2


def test_resume_without_an_earlier_run_starts_a_new_one(workdir):
    cfg = decide_output_dir(config("resume=true"))
    folder = Path(cfg.output_dir)
    assert folder.parent == workdir / "outputs" / "default" and is_run_stamp(folder.name)
    assert (folder.parent / LATEST).resolve() == folder


def test_resume_of_a_finished_run_without_checkpoint_is_refused(workdir):
    run_inprocess(config("checkpoint=false"))
    with pytest.raises(ConfigError, match="no checkpoint to resume from"):
        decide_output_dir(config("resume=true"))


def test_prepare_decides_the_folder_once_and_hands_it_to_the_server_app(workdir, capsys):
    """``run.sh`` twice: two folders; the run config ends in the folder's ``output_dir``."""
    outs = []
    for n in range(2):
        toml = workdir / f"run-{n}.toml"
        argv = ["prepare", str(ROOT / "conf/fedavg.yaml"), *TINY, "--run-toml", str(toml)]
        assert cli.main(argv) == 0
        out = Path(capsys.readouterr().out.splitlines()[1])
        overrides = tomllib.loads(toml.read_text())["overrides"]
        assert split_overrides(overrides)[-1] == f"output_dir={json.dumps(str(out))}"
        outs.append(out)
    assert outs[0] != outs[1] and {p.parent for p in outs} == {workdir / "outputs" / "fedavg"}
    assert (workdir / "outputs" / "fedavg" / LATEST).resolve() == outs[1]


def test_a_name_that_cannot_name_a_folder_is_refused_without_output_dir(workdir):
    with pytest.raises(ConfigError, match="name = '../x'"):
        config("name=../x")
    config("name=../x", f"output_dir={workdir / 'x'}")  # with output_dir the name is free


@pytest.mark.parametrize("resume", ["false", "true"])
@pytest.mark.parametrize("kind", ["folder", "file"])
def test_a_latest_that_is_not_a_link_is_refused_and_kept(workdir, capsys, kind, resume):
    """``outputs/<name>/latest`` made by someone else (a folder or a file) is never replaced:
    one error naming it, exit 2 from ``run.sh``'s check, no run folder made beside it."""
    parent = workdir / "outputs" / "default"
    parent.mkdir(parents=True)
    latest = parent / LATEST
    if kind == "folder":
        latest.mkdir()
        (latest / "mine.txt").write_text("kept\n")
    else:
        latest.write_text("kept\n")
    with pytest.raises(ConfigError, match=f"output_dir = None: {latest} is a {kind}, not the"):
        decide_output_dir(config(f"resume={resume}"))
    argv = ["prepare", str(ROOT / "conf/default.yaml"), *TINY, f"resume={resume}"]
    assert cli.main([*argv, "--run-toml", str(workdir / "run.toml")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"{latest} is a {kind}" in err
    assert sorted(p.name for p in parent.iterdir()) == [LATEST]  # no dated folder left behind
    kept = latest / "mine.txt" if kind == "folder" else latest
    assert kept.read_text() == "kept\n"
    with pytest.raises(FileExistsError, match=f"{latest} is a {kind}"):
        point_latest(new_run_folder(parent))  # the last guard refuses it too


def test_the_report_reads_an_experiments_runs_once_each_as_one_group(workdir):
    run_inprocess(config())
    run_inprocess(config("seed=1"))
    parent = workdir / "outputs" / "default"
    found = find_runs([parent])
    assert found == runs_of(parent)  # latest is not a third run
    runs = [load_run(p) for p in found]
    assert {r.label for r in runs} == {"default"} and {r.seed for r in runs} == {0, 1}
    latest = load_run(parent / LATEST)
    assert latest.label == "default" and latest.path == found[1]


# -- a configuration error in the ServerApp ----------------------------------------------------
@pytest.mark.parametrize("problem", ["bad key", "earlier run"])
def test_a_config_error_in_the_server_app_is_one_log_line(workdir, caplog, problem):
    """What Flower logs of the exception that ends the ServerApp (``<entity> raised an
    exception`` with its traceback) is left out: one ERROR line says it all."""
    out = workdir / "earlier"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    overrides = "data.alpha=-1" if problem == "bad key" else f"output_dir={out}"
    logger = logging.getLogger("flwr")
    old, logger.propagate = logger.propagate, True
    caplog.set_level(logging.DEBUG, logger="flwr")
    try:
        with pytest.raises(ConfigError) as err:
            server_app.main(InProcessGrid(client_app, 4), run_context(overrides=overrides))
        # As Flower's simulation and ServerApp runners report an exception that ends the app:
        log(logging.ERROR, "%s raised an exception", "ServerApp", exc_info=err.value)
    finally:
        logger.propagate = old
    # One emitted record may reach caplog twice when an earlier test in this process left a
    # second capturing handler on a logger (seen under pytest-xdist): count records, not copies.
    errors = list({id(r): r for r in caplog.records if r.levelno >= logging.ERROR}.values())
    assert len(errors) == 1 and errors[0].exc_info is None
    line = errors[0].getMessage()
    assert line == f"fedgo-flwr: {err.value}" and "\n" not in line
    key = "data.alpha" if problem == "bad key" else "output_dir"
    assert f"{key} = " in line
    assert not (workdir / "outputs").exists()  # refused before a folder was made
