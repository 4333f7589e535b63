"""CPFL's stopping signal against untrusted cohort members (paper 003, Sec. 4.1).

Each member reports the received model's validation loss; the cohort's signal is their median
after clipping any above 10 x it (:func:`fedgo_flwr.learning.cohorts.cohort_loss`; the paper's
mean is an option). A member that lies about its loss --
extreme, NaN, a list, a loss without a validation split -- must neither crash the run nor stop or
stall its cohort. The whole-run tests edit the liars' replies on their way to the server, every
round, through the in-process grid (as ``tests/integration/test_tampered_replies.py`` does for
one round).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
from flwr.app import MetricRecord
from helpers import rows_of, without_timing

from fedgo_app.inprocess import InProcessGrid, run_inprocess
from fedgo_flwr.config.experiment import ConfigError
from fedgo_flwr.learning.cohorts import LOSS_BOUND, PlateauStopper, cohort_loss, random_cohorts
from fedgo_flwr.runtime import messages as msgs
from strategies import load_experiment

ROOT = Path(__file__).resolve().parents[2]
HUGE = 1.7e308  # the mean of two of them overflows


# -- the reduction -----------------------------------------------------------------------------


def test_the_mean_keeps_the_papers_float_operations_where_nothing_is_clipped():
    losses = [0.1, 0.7, 0.2, 1e-3, 1.9]  # 1.9 / 0.2 = 9.5: inside the bound
    value, clipped = cohort_loss(losses, "mean")
    assert value == float(np.mean(losses)) and clipped == []
    assert cohort_loss(losses, "mean", bound=None) == (value, [])
    assert cohort_loss(losses) == (0.2, [])  # the default: the median
    assert cohort_loss([]) == (None, [])
    assert cohort_loss([2.5]) == (2.5, [])


def test_a_loss_above_the_bound_times_the_median_is_clipped_to_it():
    value, clipped = cohort_loss([0.4, HUGE, 0.5, 0.6], "mean")
    median = (0.5 + 0.6) / 2  # of the four reports
    assert clipped == [1] and value == pytest.approx(np.mean([0.4, LOSS_BOUND * median, 0.5, 0.6]))
    assert cohort_loss([0.4, HUGE, 0.5, 0.6]) == (median, [1])  # the median does not move
    # The bound: LOSS_BOUND x the median (0.5); at the bound the loss is kept.
    assert cohort_loss([0.4, 0.45, 0.5, 0.6, LOSS_BOUND * 0.5])[1] == []
    assert cohort_loss([0.4, 0.45, 0.5, 0.6, 1.001 * LOSS_BOUND * 0.5])[1] == [4]
    # median 0.6: 30 -> 1.8
    assert cohort_loss([0.4, 30.0, 0.6], "mean", bound=3.0) == (pytest.approx(2.8 / 3), [1])
    assert cohort_loss([0.4, 30.0, 0.6], "mean", bound=None) == (np.mean([0.4, 30.0, 0.6]), [])
    # With two losses the median is their midpoint: a liar is not told apart (the bound >= 2
    # never binds), but the signal stays finite.
    assert cohort_loss([0.5, HUGE]) == (pytest.approx(HUGE / 2), [])
    # A zero is not bounded: most of the members at 0 make a zero median, the rest clipped.
    assert cohort_loss([0.0, 0.0, 0.7], "mean") == (0.0, [2])


def test_the_mean_does_not_overflow():
    value, left_out = cohort_loss([HUGE, HUGE, HUGE], bound=None)
    assert value == HUGE and left_out == []
    value, _ = cohort_loss([1e308, 1e308, 0.5, 0.5], "mean")  # the median is no member's
    assert math.isfinite(value) and value == pytest.approx(5e307)
    assert math.isfinite(cohort_loss([1.7976931348623157e308] * 7, "trimmed_mean")[0])


def test_median_and_trimmed_mean():
    losses = [0.9, 0.1, 0.3, 0.5]
    assert cohort_loss(losses, "median") == (pytest.approx(0.4), [])
    assert cohort_loss([0.9, 0.1, 0.3], "median") == (0.3, [])
    assert cohort_loss(losses, "trimmed_mean") == (pytest.approx(0.4), [])  # 0.1, 0.9 cut
    twenty = [float(v) for v in range(1, 21)]
    assert cohort_loss(twenty, "trimmed_mean", None)[0] == pytest.approx(np.mean(twenty[2:-2]))
    assert cohort_loss([0.2, 0.4], "trimmed_mean")[0] == pytest.approx(0.3)  # too few to cut
    # One member low or high cannot move the median or the trimmed mean much.
    for reduce in ("median", "trimmed_mean"):
        clean = cohort_loss([0.4, 0.5, 0.6, 0.55, 0.45], reduce)[0]
        for lie in (0.0, 499.0):
            lied = cohort_loss([0.4, 0.5, 0.6, 0.55, lie], reduce)[0]
            assert abs(lied - clean) <= 0.1, (reduce, lie)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -0.1])
def test_a_bad_loss_is_refused(bad):
    with pytest.raises(ValueError, match="finite and >= 0"):
        cohort_loss([0.5, bad])
    with pytest.raises(ValueError, match="loss reduction"):
        cohort_loss([0.5], "mode")
    with pytest.raises(ValueError, match="bound must be > 1"):
        cohort_loss([0.5], bound=1.0)


def test_the_stopper_averages_huge_losses_without_overflow():
    stopper = PlateauStopper(window=5, patience=2)
    for _ in range(5):
        stopper.observe(1e308)
    assert stopper.smoothed == pytest.approx(1e308)


@pytest.mark.parametrize(
    ("overrides", "key", "problem"),
    [
        (["strategy.loss_reduce=mode"], "strategy.loss_reduce", "trimmed_mean"),
        (["strategy.loss_bound=1"], "strategy.loss_bound", "must be > 1"),
        (["strategy.loss_bound=0.5"], "strategy.loss_bound", "must be > 1"),
        (["strategy.loss_bound=.inf"], "strategy.loss_bound", "finite"),
    ],
)
def test_bad_loss_options_are_refused_naming_the_key(tmp_path, overrides, key, problem):
    with pytest.raises(ConfigError) as err:
        load_experiment(ROOT / "conf/cpfl.yaml", [f"output_dir={tmp_path}", *overrides])
    assert err.value.key == key and problem in str(err.value)


def test_the_loss_options_are_read(tmp_path):
    cfg = load_experiment(
        ROOT / "conf/cpfl.yaml",
        [f"output_dir={tmp_path}", "strategy.loss_reduce=median", "strategy.loss_bound=null"],
    )
    assert cfg.strategy.params.loss_reduce == "median" and cfg.strategy.params.loss_bound is None
    default = load_experiment(ROOT / "conf/cpfl.yaml", [f"output_dir={tmp_path}"])
    assert default.strategy.params.loss_reduce == "median"
    assert default.strategy.params.loss_bound == LOSS_BOUND


# -- whole runs: liars among a cohort's members ------------------------------------------------


class Times(float):
    """A lie of this many times the member's honest loss (:func:`lie`)."""


def lie(monkeypatch, liars: dict[int, object]) -> None:
    """Client ``pid``'s training replies carry ``val_loss = liars[pid]`` (a :class:`Times`:
    that many times its honest loss), every round (the in-process grid's node id of partition
    ``pid`` is ``pid + 2``)."""
    original = InProcessGrid.stream

    def stream(self, messages, *, timeout=None):
        for reply in original(self, messages, timeout=timeout):
            pid = reply.metadata.src_node_id - 2
            if pid in liars and not reply.has_error() and reply.metadata.message_type == "train":
                metrics = dict(reply.content[msgs.METRICS])
                value = liars[pid]
                if isinstance(value, Times):
                    value = float(metrics["val_loss"]) * value
                reply.content[msgs.METRICS] = MetricRecord({**metrics, "val_loss": value})
            yield reply

    monkeypatch.setattr(InProcessGrid, "stream", stream)


def run(out: Path, *overrides: str) -> dict:
    run_inprocess(
        load_experiment(
            ROOT / "conf/cpfl.yaml",
            [
                f"output_dir={out}",
                "checkpoint=false",
                "strategy.cohort_eval_every=0",
                "strategy.distill.epochs=1",
                *overrides,
            ],
        )
    )
    return json.loads((out / "summary.json").read_text())


# Two cohorts of 5 (near-IID, so that one member's loss is not the signal) that converge by
# themselves in about 30 rounds.
STOPPING = [
    "rounds=40",
    "data.num_clients=10",
    "data.alpha=10",
    "train.lr=0.1",
    "strategy.cohorts=2",
    "strategy.window=2",
    "strategy.patience=3",
    "strategy.aggregation.rule=mean",  # the paper's per-cohort FedAvg: the signal under test
]
TOLERANCE = 3  # rounds (the patience): a lie costs the signal its liar's honest loss


def test_one_liar_cannot_stop_its_cohort_early(tmp_path, monkeypatch, flwr_log):
    """A member reporting 1000 x its honest loss every round (inside the former bound of
    1e4 x the median; under the paper's mean its cohort "converged" in round 4 with an
    untrained teacher, against 29 clean) and one reporting 0.0 every round (flattening the
    signal) do not stop their cohorts before the clean run's stopping round (within
    TOLERANCE): the median does not follow one member, and the 1000 x report is clipped to
    10 x the median, named. A later stop stays possible: the signal is then the median of the
    other members, whose noise the stopping rule sees (here 29 in this tier; 40, the run's
    limit, in a plain script whose float noise differs)."""
    clean = run(tmp_path / "clean", *STOPPING)
    assert clean["cohort_status"] == ["converged", "converged"]
    high, low = (members[0] for members in random_cohorts(10, 2, seed=0))
    with monkeypatch.context() as m:
        lie(m, {high: Times(1000.0), low: 0.0})
        lied = run(tmp_path / "lied", *STOPPING)
    pairs = zip(clean["cohort_rounds"], lied["cohort_rounds"], strict=True)
    assert all(b >= a - TOLERANCE for a, b in pairs), (
        clean["cohort_rounds"],
        lied["cohort_rounds"],
    )
    assert set(lied["cohort_status"]) <= {"converged", "max_rounds"}
    assert f"clips the validation loss of client(s) {high}" in flwr_log.text
    assert all(
        math.isfinite(e["val_loss"])
        for r in rows_of(tmp_path / "lied")[1:]
        for e in r.get("cohorts", [])
    )


TINY = [
    "data.num_clients=8",  # cohorts [0, 1, 2, 7] and [3, 4, 5, 6]; client 5 has 59 samples
    "strategy.cohorts=2",
    "strategy.window=2",
    "strategy.patience=3",
    "rounds=3",
]


def test_two_members_reporting_1e308_do_not_crash_the_run(tmp_path, monkeypatch):
    """Half a cohort at 1e308: the median is no honest member's, so nothing is left out, but
    the mean (formerly inf: the stopping rule raised) stays finite and the run finishes."""
    lie(monkeypatch, {0: 1e308, 1: 1e308})
    s = run(tmp_path, *TINY)
    assert s["cohort_rounds"] == [3, 3] and math.isfinite(s["final_accuracy"])
    losses = [
        e["val_loss"] for r in rows_of(tmp_path)[1:] for e in r["cohorts"] if e["cohort"] == 0
    ]
    assert losses == [pytest.approx(5e307, rel=1e-6)] * 3


@pytest.mark.parametrize("value", [math.nan, [1.0, 2.0], 0.5])
def test_a_loss_from_a_client_without_a_validation_split_drops_its_reply(
    tmp_path, monkeypatch, flwr_log, value
):
    """Client 5 (59 samples) has no validation split under min_val_samples 60, so an honest
    client 5 sends no loss; one that sends any (NaN and a list crashed the run) is dropped."""
    lie(monkeypatch, {5: value})
    s = run(tmp_path, *TINY, "strategy.min_val_samples=60")
    assert s["cohort_rounds"] == [3, 3] and math.isfinite(s["final_accuracy"])
    dropped = [
        r.getMessage()
        for r in flwr_log.records
        if r.levelno == logging.WARNING
        and "Dropping reply of client 5 (node 7)" in r.getMessage()
        # the intake refuses what is no finite number >= 0; CPFL any loss without a split
        and ("no validation split" in r.getMessage() or "metric 'val_loss'" in r.getMessage())
    ]
    assert len(dropped) == 3  # one a round
    replied = [e["clients_replied"] for r in rows_of(tmp_path)[1:] for e in r["cohorts"]]
    assert replied == [4, 3] * 3


def test_without_a_liar_the_bound_changes_nothing(tmp_path, flwr_log):
    """Honest members never meet the default bound: the run is the unbounded mean's."""
    run(tmp_path / "bounded", *TINY)
    run(tmp_path / "unbounded", *TINY, "strategy.loss_bound=null")
    assert without_timing(rows_of(tmp_path / "bounded")) == without_timing(
        rows_of(tmp_path / "unbounded")
    )
    assert "clips the validation loss" not in flwr_log.text
