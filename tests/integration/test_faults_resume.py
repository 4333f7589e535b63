"""Faults injected through the config, round timeouts, and resuming from a checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import test_golden_runs as golden
import torch
from helpers import rows_of, without_timing

from fedgo_app.inprocess import run_inprocess
from fedgo_flwr.config.experiment import ConfigError
from fedgo_flwr.learning.task import sample_clients
from fedgo_flwr.records.checkpoint import CheckpointError, load_checkpoint
from strategies import available, load_experiment, strategy_class
from strategies.base import Strategy
from strategies.oneshot import OneShot

ROOT = Path(__file__).resolve().parents[2]
TINY = [*golden.DATA, "fraction=0.5", "train.local_epochs=1"]  # digits cut to 400/120


def config(tmp_path: Path, *overrides: str):
    return load_experiment(
        ROOT / "conf/default.yaml", ["rounds=2", *TINY, f"output_dir={tmp_path}", *overrides]
    )


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("crash", "injected fault: client"),
        ("nan", "non-finite"),
        ("shape", "shape"),
    ],
)
def test_a_faulty_client_is_dropped_and_named(tmp_path, flwr_log, kind, reason):
    bad = sample_clients(0, 2, 4, 2)[0]
    cfg = config(
        tmp_path,
        "strategy.name=feddf",
        *golden.KNOBS["feddf"],
        f"faults=[{{partition: {bad}, round: 2, kind: {kind}}}]",
    )
    run_inprocess(cfg)
    rows = rows_of(tmp_path)
    assert rows[1]["clients_replied"] == 2 and rows[1]["clients_failed"] == 0
    assert rows[2]["clients_replied"] == 1 and rows[2]["clients_failed"] == 1
    assert np.isfinite(rows[2]["test_accuracy"])  # the bad reply was not averaged in
    dropped = [r.getMessage() for r in flwr_log.records if "Dropping reply" in r.getMessage()]
    assert len(dropped) == 1
    assert f"client {bad} " in dropped[0] and reason in dropped[0]


def test_a_client_that_hangs_past_the_timeout_is_left_out(tmp_path, flwr_log):
    bad = sample_clients(0, 1, 4, 2)[1]
    cfg = config(
        tmp_path,
        "rounds=1",
        "round_timeout=3",  # the healthy client's round takes well under a second
        f"faults=[{{partition: {bad}, round: 1, kind: hang, seconds: 4.0}}]",
    )
    run_inprocess(cfg)
    row = rows_of(tmp_path)[1]
    assert row["clients_replied"] == 1 and row["clients_failed"] == 1
    silent = [r.getMessage() for r in flwr_log.records if "no reply" in r.getMessage()]
    assert len(silent) == 1 and f"client {bad} " in silent[0]


def test_too_few_replies_keep_the_model(tmp_path):
    pids = sample_clients(0, 1, 4, 2)
    faults = ", ".join(f"{{partition: {p}, round: 1, kind: crash}}" for p in pids)
    run_inprocess(config(tmp_path, "rounds=1", "min_clients=1", f"faults=[{faults}]"))
    rows = rows_of(tmp_path)
    assert rows[1]["clients_replied"] == 0 and rows[1]["clients_failed"] == 2
    assert rows[1]["test_accuracy"] == rows[0]["test_accuracy"]


def test_fault_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"faults\[0\].kind = 'boom'"):
        load_experiment(ROOT / "conf/default.yaml", ["faults=[{partition: 1, kind: boom}]"])
    with pytest.raises(ConfigError, match=r"faults\[0\].partition = 20: must be < data.num"):
        load_experiment(ROOT / "conf/default.yaml", ["faults=[{partition: 20}]"])


class Interrupted(Exception):
    pass


AGGREGATIONS = ("aggregate_cohorts", "aggregate_train")
"""Where a round's replies are aggregated: CPFL's cohorts, every other strategy's round."""


def interrupted_then_resumed(out: Path, monkeypatch, stop_round: int, load):
    """Run ``load(out, *overrides)`` until ``stop_round`` raises mid-aggregation, then resume;
    return the resumed run's rows and final model."""
    cfg = load(out)
    cls = strategy_class(cfg.strategy.name)  # the class whose aggregation runs
    owner, hook = next((c, h) for c in cls.__mro__ for h in AGGREGATIONS if h in vars(c))
    original = getattr(owner, hook)

    def dying(self, server_round, replies):
        if server_round == stop_round:
            raise Interrupted
        return original(self, server_round, replies)

    with monkeypatch.context() as m:
        m.setattr(owner, hook, dying)
        with pytest.raises(Interrupted):
            run_inprocess(cfg)
    ckpt = load_checkpoint(out)
    assert ckpt is not None and ckpt.round == stop_round - 1
    assert not (out / "summary.json").exists()
    run_inprocess(load(out, "resume=true"))
    return rows_of(out), torch.load(out / "model.pt")


RESUMED = {
    # Settings whose state only a resume can lose: the student starts from the previous
    # global model, FedGKD+'s distillation term is on.
    "feddf": ["strategy.init=previous"],
    "fedgkd_plus": ["strategy.gamma=1.0", "strategy.init=previous"],
}
"""Per strategy, overrides besides its golden case's."""

RESUME_ROUNDS, STOP_ROUND = 3, 2
"""Each resume case: the checkpoint of round 1, then rounds 2 and 3 from it."""


def resume_cases() -> list:
    """The golden case (tests/integration/test_golden_runs.py: digits cut to 400/120, the
    strategy's expensive knobs cut) of every round-based strategy found by name, and FedDF on
    two client architectures. One-shot strategies have one round: nothing to resume."""
    names = [n for n in available() if not issubclass(strategy_class(n), OneShot)]
    mixed = golden.Case("feddf_mixed_models", *golden.SCENARIOS["feddf_mixed_models"])
    return [*map(golden.strategy_case, names), mixed]


@pytest.mark.parametrize("case", resume_cases(), ids=lambda case: case.id)
def test_resume_ends_with_the_same_metrics(tmp_path, monkeypatch, case):
    """An uninterrupted run and one stopped in round 2 and resumed end the same: metrics, the
    final model and the summary (the golden test covers each strategy's clean run)."""
    name = next(o.split("=", 1)[1] for o in case.overrides if o.startswith("strategy.name="))

    def load(out: Path, *overrides: str):
        extra = [f"rounds={RESUME_ROUNDS}", *RESUMED.get(name, []), *overrides]
        return load_experiment(ROOT / case.path, [*case.all_overrides, *extra, f"output_dir={out}"])

    run_inprocess(load(tmp_path / "straight"))
    straight = rows_of(tmp_path / "straight")
    resumed, model = interrupted_then_resumed(tmp_path / "resumed", monkeypatch, STOP_ROUND, load)
    assert [r["round"] for r in resumed] == [r["round"] for r in straight]
    assert len(straight) > STOP_ROUND  # the stop came before the end (CPFL may end early)
    assert without_timing(resumed) == without_timing(straight)
    reference = torch.load(tmp_path / "straight" / "model.pt")
    for key, value in reference.items():
        assert torch.equal(model[key], value), key
    summaries = [
        json.loads((tmp_path / r / "summary.json").read_text()) for r in ("straight", "resumed")
    ]
    assert summaries[1]["rounds"] == summaries[0]["rounds"]


def test_scaffold_resume_needs_the_clients_saved_controls(tmp_path, monkeypatch):
    """Without the clients' c_i files the resumed SCAFFOLD run diverges: they matter."""
    run_inprocess(config(tmp_path / "straight", "rounds=4", "strategy.name=scaffold"))
    straight = rows_of(tmp_path / "straight")
    cfg = config(tmp_path / "lost", "rounds=4", "strategy.name=scaffold")
    original = Strategy.aggregate_train

    def dying(self, server_round, replies):
        if server_round == 3:
            raise Interrupted
        return original(self, server_round, replies)

    monkeypatch.setattr(Strategy, "aggregate_train", dying)
    with pytest.raises(Interrupted):
        run_inprocess(cfg)
    monkeypatch.undo()
    import shutil

    shutil.rmtree(tmp_path / "lost" / "client-state")
    run_inprocess(config(tmp_path / "lost", "rounds=4", "resume=true", "strategy.name=scaffold"))
    lost = rows_of(tmp_path / "lost")
    assert without_timing(lost)[:3] == without_timing(straight)[:3]
    assert [r["test_loss"] for r in lost[3:]] != [r["test_loss"] for r in straight[3:]]


@pytest.fixture
def clean_stop():
    from fedgo_flwr.runtime import shutdown

    shutdown.reset()
    yield shutdown
    shutdown.reset()


def test_a_client_killed_by_the_stop_makes_no_round(tmp_path, monkeypatch, clean_stop):
    """Ctrl-C kills the clients and the server together: the round whose client died with the
    stop is not recorded (no metrics row, no checkpoint), so the resumed run matches an
    uninterrupted one. Without the stop, the same failure is an ordinary dropped client."""
    import fedgo_app.client_app as client_app
    from fedgo_flwr.runtime.shutdown import RunStopped

    scaffold = ["rounds=4", "strategy.name=scaffold"]
    run_inprocess(config(tmp_path / "straight", *scaffold))
    original = client_app.inject_fault
    with_stop = [True]

    def killed_in_round_3(cfg, pid, server_round, stage):
        if server_round == 3 and stage == "before" and pid == sample_clients(0, 3, 4, 2)[0]:
            if with_stop[0]:
                clean_stop.request_stop()  # what Flower's exit handler does on TERM
            raise RuntimeError("worker killed")
        return original(cfg, pid, server_round, stage)

    monkeypatch.setattr(client_app, "inject_fault", killed_in_round_3)
    with pytest.raises(RunStopped, match="round 3 not recorded"):
        run_inprocess(config(tmp_path / "killed", *scaffold))
    assert load_checkpoint(tmp_path / "killed").round == 2
    assert [r["round"] for r in rows_of(tmp_path / "killed")] == [0, 1, 2]

    clean_stop.reset()  # no stop this time: the same death is a dropped client
    with_stop[0] = False
    run_inprocess(config(tmp_path / "dropped", *scaffold))
    assert rows_of(tmp_path / "dropped")[3]["clients_failed"] == 1

    monkeypatch.undo()
    run_inprocess(config(tmp_path / "killed", *scaffold, "resume=true"))
    straight = without_timing(rows_of(tmp_path / "straight"))
    assert without_timing(rows_of(tmp_path / "killed")) == straight


def test_resume_refuses_a_changed_config(tmp_path):
    run_inprocess(config(tmp_path, "rounds=1"))
    with pytest.raises(ValueError, match=r"configuration differs .* data.alpha \(0.1 -> 0.5\)"):
        run_inprocess(config(tmp_path, "rounds=2", "resume=true", "data.alpha=0.5"))


def test_resume_without_checkpoint_starts_over(tmp_path):
    run_inprocess(config(tmp_path, "rounds=1", "resume=true"))
    assert [r["round"] for r in rows_of(tmp_path)] == [0, 1]


def test_resume_extends_a_finished_run(tmp_path):
    run_inprocess(config(tmp_path / "two", "rounds=2"))
    run_inprocess(config(tmp_path / "two", "rounds=3", "resume=true"))
    run_inprocess(config(tmp_path / "three", "rounds=3"))
    assert without_timing(rows_of(tmp_path / "two")) == without_timing(rows_of(tmp_path / "three"))


def test_resuming_a_run_its_strategy_ended_offers_no_more_rounds(tmp_path):
    """CPFL ends with stage 2, so raising ``rounds`` cannot extend it: resuming it (summary.json
    there) is refused with one message that says to overwrite, and changes nothing."""
    case = golden.strategy_case("cpfl")
    run_inprocess(case.config(tmp_path))
    before = (tmp_path / "summary.json").read_bytes()
    more = load_experiment(
        ROOT / case.path, [*case.all_overrides, f"output_dir={tmp_path}", "resume=true", "rounds=9"]
    )
    with pytest.raises(CheckpointError, match="the end of the finished run") as info:
        run_inprocess(more)
    assert "nothing to resume; set overwrite=true to run it again" in str(info.value)
    assert (tmp_path / "summary.json").read_bytes() == before
