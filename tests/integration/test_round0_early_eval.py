"""Round 0's evaluation, begun while the ServerApp waits for its nodes (issue 53): the row it
gives is the row an evaluation at round 0 gives, and arrays other than the evaluated ones are
evaluated again (:class:`fedgo_flwr.records.recorder.EarlyEvaluation`)."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord
from helpers import rows_of, tiny_config, without_timing

import fedgo_app.server_app as server_app
from fedgo_app.inprocess import run_inprocess
from fedgo_flwr.learning.task import load_bundle, new_model
from fedgo_flwr.records import recorder as recorder_module
from fedgo_flwr.records.recorder import EarlyEvaluation, Row, RunRecorder

CPU = torch.device("cpu")


@pytest.fixture
def setting(tmp_path):
    cfg = tiny_config(tmp_path / "a")
    bundle = load_bundle(cfg.data)
    return cfg, bundle, new_model(cfg, bundle)


def _round0(cfg, out, model, test, arrays, early=None):
    """Round 0's row of ``arrays`` by a fresh recorder writing to ``out``."""
    import dataclasses

    cfg = dataclasses.replace(cfg, output_dir=str(out))
    recorder = RunRecorder.create(cfg)
    recorder.attach(model, test, CPU, early=early)
    recorder.record(0, arrays, Row())
    return rows_of(out)[0]


def _no_evaluation(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("round 0 was evaluated again")

    monkeypatch.setattr(recorder_module, "evaluate", refuse)


def test_round_0_takes_the_early_evaluation_and_its_numbers_are_the_same(
    setting, tmp_path, monkeypatch
):
    cfg, bundle, model = setting
    arrays = ArrayRecord(model.state_dict())
    plain = _round0(cfg, tmp_path / "plain", model, bundle.test, arrays)
    early = EarlyEvaluation(model, bundle.test, cfg.eval.batch_size, CPU)
    early.thread.join()
    _no_evaluation(monkeypatch)  # the row must come from the thread's evaluation
    row = _round0(cfg, tmp_path / "early", model, bundle.test, arrays, early)
    assert row["test_accuracy"] == plain["test_accuracy"]
    assert row["test_loss"] == plain["test_loss"]
    assert row["eval_time"] > 0


def test_arrays_other_than_the_evaluated_ones_are_evaluated_again(setting, tmp_path):
    cfg, bundle, model = setting
    early = EarlyEvaluation(model, bundle.test, cfg.eval.batch_size, CPU)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    first = next(k for k, v in state.items() if v.is_floating_point())
    state[first] = state[first] * 0.5  # e.g. a strategy's set-up changed the model
    changed = ArrayRecord(state)
    row = _round0(cfg, tmp_path / "early", model, bundle.test, changed, early)
    model.load_state_dict(state)
    plain = _round0(cfg, tmp_path / "plain", model, bundle.test, changed)
    assert (row["test_accuracy"], row["test_loss"]) == (
        plain["test_accuracy"],
        plain["test_loss"],
    )
    # and the early evaluation's own numbers (the unchanged model's) differ from those
    unchanged = EarlyEvaluation(new_model(cfg, bundle), bundle.test, cfg.eval.batch_size, CPU)
    unchanged.thread.join()
    assert unchanged.result is not None and unchanged.result[0] != row["test_loss"]


def test_a_failed_early_evaluation_is_done_again_at_round_0(setting, tmp_path, monkeypatch):
    cfg, bundle, model = setting
    arrays = ArrayRecord(model.state_dict())
    real = recorder_module.evaluate
    monkeypatch.setattr(recorder_module, "evaluate", lambda *a: 1 / 0)
    early = EarlyEvaluation(model, bundle.test, cfg.eval.batch_size, CPU)
    early.thread.join()
    monkeypatch.setattr(recorder_module, "evaluate", real)
    row = _round0(cfg, tmp_path / "early", model, bundle.test, arrays, early)
    plain = _round0(cfg, tmp_path / "plain", model, bundle.test, arrays)
    assert row["test_accuracy"] == plain["test_accuracy"]


def test_a_run_evaluates_round_0_early_and_writes_the_same_rows(tmp_path, monkeypatch):
    taken = []
    real_take = EarlyEvaluation.take

    def spy(self, arrays):
        result = real_take(self, arrays)
        taken.append(result)
        return result

    monkeypatch.setattr(EarlyEvaluation, "take", spy)
    run_inprocess(tiny_config(tmp_path / "early"))
    assert len(taken) == 1 and taken[0] is not None  # round 0 came from the early evaluation

    monkeypatch.setattr(server_app.profiling, "enabled", lambda: True)  # no early evaluation
    run_inprocess(tiny_config(tmp_path / "late"))
    assert len(taken) == 1
    assert without_timing(rows_of(tmp_path / "early")) == without_timing(rows_of(tmp_path / "late"))
