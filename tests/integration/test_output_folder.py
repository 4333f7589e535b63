"""A run's output folder (issue 12): nothing is lost or silently replaced.

- a run folder holding an earlier run is refused (``cli prepare`` and the ServerApp) unless
  ``resume`` or ``overwrite`` (``run.sh``'s side: ``tests/e2e/test_run_sh.py``);
- ``model.pt`` before ``summary.json``, both atomic; strict JSON (no ``Infinity``).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch
from flwr.app import ArrayRecord
from helpers import log_messages, rows_of, tiny_config

from fedgo_app import cli
from fedgo_app.inprocess import run_inprocess
from fedgo_flwr.config.experiment import ConfigError
from fedgo_flwr.records.checkpoint import (
    CHECKPOINT_FILE,
    PREVIOUS_FILE,
)
from fedgo_flwr.records.recorder import Row, RunRecorder

# -- the run folder ------------------------------------------------------------------------


def test_a_second_run_into_a_used_folder_is_refused_and_the_first_is_kept(tmp_path):
    run_inprocess(tiny_config(tmp_path))
    before = {f.name: f.read_bytes() for f in tmp_path.iterdir() if f.is_file()}
    assert {"metrics.jsonl", "summary.json", "model.pt"} <= set(before)
    with pytest.raises(ConfigError, match=r"output_dir = .*holds an earlier run.*overwrite=true"):
        run_inprocess(tiny_config(tmp_path, "seed=1"))
    after = {f.name: f.read_bytes() for f in tmp_path.iterdir() if f.is_file()}
    assert after == before


def test_overwrite_replaces_the_earlier_run(tmp_path):
    run_inprocess(tiny_config(tmp_path, "rounds=2"))
    assert (tmp_path / PREVIOUS_FILE).exists()
    run_inprocess(tiny_config(tmp_path, "overwrite=true", "checkpoint=false", "seed=1"))
    assert [r["round"] for r in rows_of(tmp_path)] == [0, 1]
    assert json.loads((tmp_path / "summary.json").read_text())["rounds"] == 1
    # The old run's checkpoints are gone: a later resume=true cannot pick up the old run.
    assert not (tmp_path / CHECKPOINT_FILE).exists() and not (tmp_path / PREVIOUS_FILE).exists()


def test_resume_without_a_checkpoint_does_not_replace_a_run(tmp_path):
    run_inprocess(tiny_config(tmp_path, "checkpoint=false"))
    before = (tmp_path / "metrics.jsonl").read_bytes()
    with pytest.raises(ConfigError, match="no checkpoint to resume from"):
        run_inprocess(tiny_config(tmp_path, "checkpoint=false", "resume=true", "rounds=2"))
    assert (tmp_path / "metrics.jsonl").read_bytes() == before


def test_resume_restarts_a_run_stopped_before_its_first_checkpoint(tmp_path):
    """Nothing to continue and nothing finished (e.g. a FedGO run stopped in its pre-FL
    stage): resume=true starts it again instead of refusing, so a sweep can go on."""
    (tmp_path / "metrics.jsonl").write_text('{"round": 0}\n')
    (tmp_path / "prefl.json").write_text("{}")
    run_inprocess(tiny_config(tmp_path, "resume=true", "rounds=1"))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1]
    assert (tmp_path / "summary.json").exists()


def test_prepare_refuses_a_used_folder_with_exit_2(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"round": 0}\n')
    run_toml = tmp_path / "flwr" / "run.toml"
    argv = ["prepare", "conf/default.yaml", f"output_dir={tmp_path}", "--run-toml", str(run_toml)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "output_dir" in err and "metrics.jsonl" in err and "resume=true" in err
    assert not run_toml.exists()
    assert (tmp_path / "metrics.jsonl").read_text() == '{"round": 0}\n'
    assert cli.main([*argv[:3], "overwrite=true", *argv[3:]]) == 0


# -- the order and atomicity of the final files --------------------------------------------


def test_no_summary_without_its_model(tmp_path, monkeypatch):
    def full_disk(*args, **kwargs):
        raise OSError("no space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError, match="no space left"):
        run_inprocess(tiny_config(tmp_path, "checkpoint=false"))
    assert not (tmp_path / "summary.json").exists()


def test_a_crash_while_writing_the_summary_leaves_none(tmp_path, monkeypatch):
    real_replace = os.replace

    def crash_on_summary(src, dst):
        if Path(dst).name == "summary.json":
            raise KeyboardInterrupt  # killed between writing and renaming
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_summary)
    with pytest.raises(KeyboardInterrupt):
        run_inprocess(tiny_config(tmp_path))
    monkeypatch.undo()
    assert not (tmp_path / "summary.json").exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    torch.load(tmp_path / "model.pt", weights_only=True)  # complete, written first


def test_infinite_metrics_are_written_as_null(tmp_path):
    cfg = tiny_config(tmp_path, "eval.every=5", "rounds=3")
    fields = {"train_loss": float("inf"), "distill_loss": float("-inf"), "x": [1.0]}
    recorder = RunRecorder.create(cfg)
    recorder.attach(None, None, None)
    # not an evaluation round: no model needed
    recorder.record(1, ArrayRecord(), Row(fields=fields))

    def strict(name):
        raise ValueError(f"not JSON: {name}")

    row = json.loads((tmp_path / "metrics.jsonl").read_text(), parse_constant=strict)
    assert row["train_loss"] is None and row["distill_loss"] is None
    assert row["test_accuracy"] is None


def test_the_recorder_writes_what_the_row_says(tmp_path, flwr_log):
    """The recorder knows a row only by the :class:`Row` it is handed: its ``fields`` are the
    line's figures, ``finished`` and ``due`` evaluate a row ``eval.every`` would skip, an empty
    model is never evaluated, ``label`` names the row in the log, and the strategy's ``report``
    joins the summary."""
    from fedgo_flwr.learning.task import load_bundle, new_model

    flwr_log.set_level(logging.INFO, logger="flwr")
    cfg = tiny_config(tmp_path, "eval.every=5", "rounds=6")
    bundle = load_bundle(cfg.data)
    model = new_model(cfg, bundle)
    arrays = ArrayRecord(model.state_dict())
    recorder = RunRecorder.create(cfg)
    recorder.attach(model, bundle.test, torch.device("cpu"))
    recorder.record(1, arrays, Row(fields={"clients_replied": 2}))  # not due: no evaluation
    recorder.record(2, arrays, Row(finished=True))
    recorder.record(3, arrays, Row(due=True, label="server epoch 2/9"))
    recorder.record(4, ArrayRecord(), Row(due=True))  # no model this row
    recorder.record(5, arrays, Row())  # eval.every
    rows = rows_of(tmp_path)
    evaluated = [r["round"] for r in rows if r["test_accuracy"] is not None]
    assert evaluated == [2, 3, 5]
    assert rows[0]["clients_replied"] == 2 and "clients_replied" not in rows[1]
    assert any(
        m.startswith(f"[{cfg.name}] server epoch 2/9  test_acc") for m in log_messages(flwr_log)
    )
    assert any(m.startswith(f"[{cfg.name}] round 5/6  test_acc") for m in log_messages(flwr_log))
    summary = recorder.finish(arrays, {"cohorts": 3})
    assert summary["cohorts"] == 3 == json.loads((tmp_path / "summary.json").read_text())["cohorts"]
