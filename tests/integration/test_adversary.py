"""One client with a *well-formed* reply inside every bound: it must not freeze or own a run.

Each test lets the clients train honestly and edits one client's reply on its way to the
server, as an attacker who knows the bounds would: the reply passes every check of the intake,
so what stops it is the default consensus rule (each array of an update weighed by its cosine
with the round's median update and clipped to ``consensus_clip`` times the round's median norm
of that array), under ``rule: mean`` the round-relative clipping of updates
(``strategy.aggregation.clip_factor``), and, where a bad model got through anyway, the round
loop's rollback.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, RecordDict
from helpers import rows_of

from fedgo_app.inprocess import InProcessGrid, run_inprocess
from fedgo_flwr.learning.task import sample_clients
from fedgo_flwr.runtime import messages as msgs
from strategies import load_experiment

ROOT = Path(__file__).resolve().parents[2]
TINY = ["data.num_clients=4", "fraction=0.5", "train.local_epochs=1"]
TINY += ["data.train_subset=400", "data.test_subset=120"]
BAD = sample_clients(0, 1, 4, 2)[0]  # a client sampled in round 1 (seed 0, K=4, m=2)
OTHER = sample_clients(0, 1, 4, 2)[1]


def attack(monkeypatch, edit, rounds=(1,), pid: int = BAD) -> None:
    """``edit(content, sent)`` client ``pid``'s training reply of each round in ``rounds``,
    ``sent`` being the model the server sent it."""
    original = InProcessGrid.stream

    def stream(self, messages, *, timeout=None):
        messages = list(messages)
        sent = None
        rnd = -1
        for m in messages:
            if m.metadata.message_type == "train" and msgs.ARRAYS in m.content:
                sent = {k: v.numpy() for k, v in m.content[msgs.ARRAYS].items()}
                rnd = int(m.content[msgs.CONFIG][msgs.SERVER_ROUND])
        for reply in original(self, messages, timeout=timeout):
            if (
                rnd in rounds
                and reply.metadata.src_node_id == pid + 2
                and not reply.has_error()
                and reply.metadata.message_type == "train"
            ):
                edit(reply.content, sent)
            yield reply

    monkeypatch.setattr(InProcessGrid, "stream", stream)


def scaled_away(factor: float):
    """``y = x - factor * x``: an update ``factor`` times the model's own norm, inside
    ``update_bound`` (50) for ``factor`` below it."""

    def edit(content: RecordDict, sent) -> None:
        arrays = {
            k: (x - factor * x).astype(x.dtype) if x.dtype.kind == "f" else x
            for k, x in sent.items()
        }
        content[msgs.ARRAYS] = ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()})

    return edit


def run(tmp_path: Path, *overrides: str) -> list[dict]:
    cfg = load_experiment(ROOT / "conf/default.yaml", [*TINY, f"output_dir={tmp_path}", *overrides])
    run_inprocess(cfg)
    return rows_of(tmp_path)


MEAN = "strategy.aggregation.rule=mean"  # FedAvg's mean (the default rule is consensus)


def test_under_the_default_rule_an_update_49x_the_model_is_clipped_and_named(tmp_path, monkeypatch):
    """Two clients a round: their median update is their mean, which the attacker's points
    along, so it is trusted; its radial part (all of it) is clipped to 8 times the honest
    client's (``radial_clip``), which leaves it shorter than the honest update in some array,
    where the honest update is then clipped to twice it (the lower median of two is the
    smaller): both are counted as clipped, and the next rounds train from a usable model."""
    attack(monkeypatch, scaled_away(49.0))
    rows = run(tmp_path, "rounds=3")
    assert rows[1]["clients_replied"] == 2  # inside every bound of the intake
    assert rows[1]["clients_clipped_relative"] == 2
    assert rows[1]["update_ratio_client"] == BAD and rows[1]["update_ratio_max"] > 100
    for row in rows[2:]:
        assert row["clients_failed"] == 0 and row["rolled_back"] == 0
        assert np.isfinite(row["train_loss"])


def test_an_update_49x_the_model_is_clipped_to_the_round_and_named(tmp_path, monkeypatch, caplog):
    attack(monkeypatch, scaled_away(49.0))
    with caplog.at_level(logging.WARNING):
        rows = run(tmp_path, "rounds=3", MEAN)
    assert rows[1]["clients_replied"] == 2  # inside every bound of the intake
    assert rows[1]["clients_clipped_relative"] == 1
    assert rows[1]["update_ratio_client"] == BAD and rows[1]["update_ratio_max"] > 100
    clipped = [m for m in caplog.messages if "clip_factor" in m]
    assert len(clipped) == 1 and f"client {BAD}" in clipped[0], clipped
    for row in rows[2:]:  # the next rounds train from a usable model
        assert row["clients_failed"] == 0 and row["rolled_back"] == 0
        assert np.isfinite(row["train_loss"])


def test_without_clipping_the_broken_model_is_rolled_back_not_kept(tmp_path, monkeypatch, caplog):
    """The freeze: the 49x update makes the next model diverge, every honest reply of round 2
    has a NaN training loss and is refused; without the rollback every later round would
    be the same (0 usable replies, the model kept for good)."""
    attack(monkeypatch, scaled_away(49.0))
    with caplog.at_level(logging.WARNING):
        rows = run(tmp_path, "rounds=4", MEAN, "strategy.aggregation.clip_factor=null")
    assert rows[1]["clients_replied"] == 2 and rows[1]["rolled_back"] == 0
    assert rows[1]["update_ratio_client"] == BAD
    back = [r["round"] for r in rows[1:] if r["rolled_back"]]
    assert len(back) == 1, rows  # once, then the run trains again
    warning = [m for m in caplog.messages if "rolling back" in m]
    assert len(warning) == 1, warning
    assert "replies refused because of the model sent" in warning[0]
    assert (
        f"the model after round 1's was the first with faults (round 1's largest update came "
        f"from client {BAD}" in warning[0]
    )
    # The row that rolled back evaluated the model round 1 started from: the initial model.
    assert rows[back[0]]["test_accuracy"] == rows[0]["test_accuracy"]
    for row in rows[back[0] + 1 :]:
        assert row["clients_replied"] == 2 and row["rolled_back"] == 0
        assert np.isfinite(row["train_loss"])


def test_one_client_with_a_nan_loss_does_not_roll_a_round_back(tmp_path, monkeypatch):
    """One reply of two pointing at the model is no majority: the client is dropped, the
    round's model stands."""

    def nan_loss(content: RecordDict, sent) -> None:
        metrics = dict(content[msgs.METRICS])
        metrics["train_loss"] = float("nan")
        content[msgs.METRICS] = type(content[msgs.METRICS])(metrics)

    attack(monkeypatch, nan_loss, rounds=(2,), pid=sample_clients(0, 2, 4, 2)[0])
    rows = run(tmp_path, "rounds=2")
    assert rows[2]["clients_replied"] == 1 and rows[2]["rolled_back"] == 0


@pytest.mark.parametrize("name", ["fedprox", "scaffold", "feddisco", "feddf"])
def test_the_clip_holds_for_every_averaging_strategy(tmp_path, monkeypatch, name):
    """As under FedAvg: both of round 1's two updates clipped (the attacker's radial part, then
    the honest update to twice what is left of it), the next round trains from a usable
    model."""
    extra = ["strategy.distill.epochs=1"] if name == "feddf" else []
    attack(monkeypatch, scaled_away(49.0))
    rows = run(tmp_path, "rounds=2", f"strategy.name={name}", *extra)
    assert rows[1]["clients_clipped_relative"] == 2, rows[1]
    assert rows[1]["update_ratio_client"] == BAD
    assert rows[2]["clients_failed"] == 0 and np.isfinite(rows[2]["train_loss"])


def one_class_bias(factor: float):
    """The model sent, with ``factor`` times its norm added to class 0's bias of the last
    layer: inside ``update_bound`` (50) for ``factor`` below it, and a logit scale the
    teacher bound rescales but cannot tell from a confident model."""

    def edit(content: RecordDict, sent) -> None:
        bias = [k for k, x in sent.items() if k.endswith("bias") and x.dtype.kind == "f"][-1]
        size = float(np.sqrt(sum(np.square(x.astype(np.float64)).sum() for x in sent.values())))
        arrays = {k: np.array(x, copy=True) for k, x in sent.items()}
        arrays[bias][0] += factor * size
        content[msgs.ARRAYS] = ArrayRecord({k: Array(v) for k, v in arrays.items()})

    return edit


def test_a_teacher_with_an_array_far_beyond_the_round_is_left_out_of_the_ensemble(
    tmp_path, monkeypatch, caplog
):
    """FedDF under the default rule, every client every round: the model with 49x its norm
    on one class's bias is left out of the ensemble (named, counted) in every round; its model
    still goes into the consensus average, which bounds it. The other teachers stay. With two
    clients a round nothing is left out: either sets the lower median of two."""
    attack(monkeypatch, one_class_bias(49.0), rounds=(1, 2))
    feddf = ["rounds=2", "strategy.name=feddf", "strategy.distill.epochs=1"]
    with caplog.at_level(logging.WARNING):
        rows = run(tmp_path, *feddf, "fraction=1.0")
    for r in (1, 2):
        assert rows[r]["teachers_left_out"] == 1 and rows[r]["clients_replied"] == 4, rows[r]
    named = [m for m in caplog.messages if "left out of the ensemble" in m]
    assert len(named) == 2, named
    assert all(f"the model of client {BAD}: its update of " in m for m in named), named
    assert all("bias is " in m for m in named), named  # the array it moved
    two = run(tmp_path / "two", *feddf)
    assert all(r.get("teachers_left_out", 0) == 0 for r in two)
    mean = run(tmp_path / "mean", *feddf, "fraction=1.0", MEAN)  # the mean keeps no models
    assert all("teachers_left_out" not in r for r in mean)
