"""CPFL's cohort math by hand (Dhasade et al., paper 003): the cohort split and validation
split (Sec. 3, 4.1), the moving-average plateau stopping rule (Sec. 4.1), the members' loss
reduction, the per-class label weights and the combined target (eq. 2), the L1 distillation
(eq. 3), and the simulated-time bookkeeping of stage 2 (deadlines, snapshots, totals)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from fedgo_flwr.config.schema import Checker, ConfigError
from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.learning.cohorts import (
    CONVERGED,
    EMPTY,
    LOSS_BOUND,
    MAX_ROUNDS,
    PAUSED,
    RUNNING,
    Cohort,
    CohortDistillConfig,
    PlateauStopper,
    batches_per_epoch,
    class_cohorts,
    cohort_loss,
    cohort_odds_weights,
    cohort_totals,
    cohorts_needed,
    combine_per_sample,
    combine_teachers,
    distill_deadline,
    distill_l1,
    distill_start,
    holdout_size,
    holdout_split,
    live_cohorts,
    mean_sd,
    prune_history,
    random_cohorts,
    teacher_at,
    teacher_outputs,
    teacher_weights,
)
from fedgo_flwr.learning.systems import SimClock
from fedgo_flwr.runtime.rng import derive_seed


def test_one_l1_step_is_eq3_with_adam_by_hand() -> None:
    """One batch, one epoch: the reported loss is mean |f(x) - t| (eq. 3) and Adam's first
    step moves each parameter by lr * g / (|g| + eps), g the gradient of the mean absolute
    error, sign(f(x) - t) x / (N C) for a linear student."""
    rng = np.random.default_rng(0)
    n, d, c = 8, 3, 2
    data = ArrayDataset(x=rng.normal(size=(n, d)).astype(np.float32), y=np.zeros(n), num_classes=c)
    x = torch.as_tensor(data.x)
    targets = torch.as_tensor(rng.normal(size=(n, c)).astype(np.float32))
    torch.manual_seed(0)
    student = nn.Linear(d, c)
    w0, b0 = student.weight.detach().clone(), student.bias.detach().clone()
    out = x @ w0.T + b0
    sign = torch.sign(out - targets)
    g_w, g_b = sign.T @ x / (n * c), sign.sum(0) / (n * c)
    lr, eps = 0.1, 1e-8
    cfg = CohortDistillConfig(epochs=1, batch_size=n, lr=lr)
    result = distill_l1(
        student,
        data,
        targets,
        cfg,
        rng=torch.Generator().manual_seed(0),
        device=torch.device("cpu"),
    )
    assert result.steps == 1
    assert np.isclose(result.loss, float((out - targets).abs().mean()), rtol=1e-6)
    torch.testing.assert_close(student.weight.detach(), w0 - lr * g_w / (g_w.abs() + eps))
    torch.testing.assert_close(student.bias.detach(), b0 - lr * g_b / (g_b.abs() + eps))


# -- cohorts and the validation split (Sec. 3 step 1, Sec. 4.1) -------------------------------


def test_random_cohorts_are_a_seeded_shuffle_cut_into_near_equal_sorted_parts() -> None:
    """7 clients in 3 cohorts: sizes floor(7/3) = 2 plus one for the first 7 mod 3 = 1 cohort,
    cut in order from the seeded permutation, each sorted; a partition of 0..6."""
    out = random_cohorts(7, 3, seed=4)
    order = np.random.default_rng(derive_seed(4, "cpfl-cohorts")).permutation(7)
    assert out == [
        sorted(order[0:3].tolist()),
        sorted(order[3:5].tolist()),
        sorted(order[5:7].tolist()),
    ]
    assert [len(c) for c in out] == [3, 2, 2]
    assert sorted(k for c in out for k in c) == list(range(7))
    assert all(isinstance(k, int) for c in out for k in c)
    assert random_cohorts(7, 3, seed=4) == out
    assert random_cohorts(8, 3, seed=0) != random_cohorts(8, 3, seed=1)
    assert sorted(len(c) for c in random_cohorts(5, 5, seed=0)) == [1] * 5
    assert random_cohorts(5, 1, seed=0) == [[0, 1, 2, 3, 4]]


@pytest.mark.parametrize("n", [0, 8])
def test_random_cohorts_needs_between_one_and_k_cohorts(n: int) -> None:
    with pytest.raises(ValueError, match=r"cohorts must be in 1\.\.7 \(the number of clients\)"):
        random_cohorts(7, n, seed=0)


def test_class_cohorts_group_clients_by_their_dominant_class_ties_to_the_lowest() -> None:
    hist = np.array([[1, 5, 0, 0], [3, 3, 0, 0], [0, 0, 2, 0], [4, 1, 0, 0]])
    assert class_cohorts(hist) == [[1, 3], [0], [2], []]
    with pytest.raises(
        ValueError, match=r"histogram must be \(clients, classes\), got shape \(4,\)"
    ):
        class_cohorts(np.array([1, 2, 3, 4]))


@pytest.mark.parametrize(
    ("size", "fraction", "min_samples", "expected"),
    [
        (100, 0.1, 10, 10),  # Sec. 4.1: 10%
        (10, 0.1, 10, 1),  # exactly the minimum
        (9, 0.1, 10, 0),  # fewer than 10 samples: no validation set
        (15, 0.1, 10, 1),  # floor(1.5)
        (5, 0.1, 2, 1),  # floor(0.5) = 0, at least 1
        (100, 0.57, 0, 57),  # 0.57 * 100 = 56.999...: floor of the intended 57
        (10, 1.0, 0, 9),  # at least one training sample
        (2, 0.9, 0, 1),
        (1, 0.9, 0, 0),  # one sample: nothing to hold out
        (10, 0.0, 0, 0),
        (10, -0.1, 0, 0),
    ],
)
def test_holdout_size(size: int, fraction: float, min_samples: int, expected: int) -> None:
    assert holdout_size(size, fraction, min_samples) == expected


def test_holdout_split_is_a_seeded_per_client_partition_of_sorted_positions() -> None:
    train, val = holdout_split(20, 0.1, 10, seed=3, client=5)
    order = np.random.default_rng(derive_seed(3, "cpfl-holdout", 5)).permutation(20)
    np.testing.assert_array_equal(val, np.sort(order[:2]))
    np.testing.assert_array_equal(train, np.sort(order[2:]))
    assert len(val) == 2 and len(train) == 18
    assert sorted(train.tolist() + val.tolist()) == list(range(20))
    again = holdout_split(20, 0.1, 10, seed=3, client=5)
    np.testing.assert_array_equal(again[1], val)
    train0, val0 = holdout_split(9, 0.1, 10, seed=3, client=5)
    assert val0.tolist() == [] and train0.tolist() == list(range(9))


@pytest.mark.parametrize(
    ("size", "batch", "expected"),
    [(0, 4, 0), (-1, 4, 0), (1, 4, 1), (5, 4, 1), (8, 4, 2), (9, 4, 2), (10, 4, 3), (3, 4, 1)],
)
def test_batches_per_epoch_drops_a_last_batch_of_one(size: int, batch: int, expected: int) -> None:
    assert batches_per_epoch(size, batch) == expected


# -- the stopping rule (Sec. 4.1) -------------------------------------------------------------


def test_plateau_defaults_are_the_papers_window_and_cifar_patience() -> None:
    s = PlateauStopper()
    assert (s.window, s.patience, s.history, s.smoothed, s.best, s.counter) == (
        20,
        50,
        [],
        None,
        math.inf,
        0,
    )
    assert not s.stopped


def test_plateau_smooths_over_the_window_and_stops_after_patience_rounds_without_a_minimum() -> (
    None
):
    s = PlateauStopper(window=3, patience=3)
    assert s.observe(4.0) is True and s.smoothed == 4.0 and s.counter == 0  # cumulative mean
    assert s.observe(2) is True and s.smoothed == 3.0 and s.best == 3.0
    assert s.history == [4.0, 2.0] and isinstance(s.history[1], float)
    assert s.observe(6.0) is False and s.smoothed == 4.0 and s.counter == 1  # (4+2+6)/3
    # (2+6+1)/3 = 3, equal to the best: not a new minimum
    assert s.observe(1.0) is False and s.smoothed == 3.0 and s.counter == 2
    assert s.history == [2.0, 6.0, 1.0] and not s.stopped
    assert s.observe(0.0) is True and s.smoothed == pytest.approx(7 / 3) and s.counter == 0
    assert s.best == s.smoothed and s.history == [6.0, 1.0, 0.0]
    assert s.observe(None) is False and s.counter == 1  # a round without a report counts too
    assert s.observe(None) is False and s.counter == 2 and not s.stopped
    assert s.observe(None) is False and s.counter == 3 and s.stopped
    assert s.history == [6.0, 1.0, 0.0]  # nothing appended for the silent rounds
    assert s.observe(None) is False and s.counter == 4 and s.stopped


def test_plateau_first_repeat_of_the_best_does_not_reset() -> None:
    s = PlateauStopper(window=1, patience=1)
    assert s.observe(1.0) is True
    assert s.observe(1.0) is False and s.counter == 1 and s.stopped


def test_plateau_sums_shares_where_the_plain_sum_overflows() -> None:
    s = PlateauStopper(window=2, patience=5)
    s.observe(1.5e308)
    s.observe(1.0e308)
    assert s.smoothed == pytest.approx(1.25e308, rel=1e-12)
    assert s.best == s.smoothed


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_plateau_rejects_a_non_finite_loss(bad: float) -> None:
    with pytest.raises(ValueError, match="validation loss must be finite, got"):
        PlateauStopper().observe(bad)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window": 0}, "window must be >= 1, got 0"),
        ({"patience": 0}, "patience must be >= 1, got 0"),
    ],
)
def test_plateau_needs_a_positive_window_and_patience(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PlateauStopper(**kwargs)
    PlateauStopper(window=1, patience=1)


def test_plateau_state_round_trips_and_parses_stored_numbers() -> None:
    s = PlateauStopper(window=2, patience=3)
    for v in (3.0, 1.0, 2.0, 4.0):
        s.observe(v)
    st = s.state()
    assert st == {
        "window": 2,
        "patience": 3,
        "history": [2.0, 4.0],
        "smoothed": 3.0,
        "best": 1.5,
        "counter": 1,
    }
    st["history"].append(9.0)
    assert s.history == [2.0, 4.0]  # the state holds a copy
    back = PlateauStopper.from_state(s.state())
    assert back == s
    raw = {
        "window": "2",
        "patience": 3.0,
        "history": ["1"],
        "smoothed": "1",
        "best": 1,
        "counter": "4",
    }
    parsed = PlateauStopper.from_state(raw)
    assert parsed == PlateauStopper(
        window=2, patience=3, history=[1.0], smoothed=1.0, best=1.0, counter=4
    )
    assert (
        type(parsed.window) is int and type(parsed.patience) is int and type(parsed.counter) is int
    )
    assert type(parsed.history[0]) is float and type(parsed.smoothed) is float
    assert type(parsed.best) is float
    fresh = PlateauStopper.from_state(PlateauStopper(window=2, patience=3).state())
    assert fresh.smoothed is None and fresh.best == math.inf


# -- a cohort's validation signal -------------------------------------------------------------


@pytest.mark.parametrize(
    ("losses", "reduce", "bound", "expected", "clipped"),
    [
        ([], "mean", LOSS_BOUND, None, []),
        ([1, 2, 3], "mean", None, 2.0, []),
        ([1, 1, 1, 100], "mean", 10, 13 / 4, [3]),  # 100 > 10 x median 1: clipped to 10
        ([1, 1, 10], "mean", 10, 4.0, []),  # at the bound: kept
        ([1, 1, 100, 3, 3], "mean", 10, 38 / 5, [2]),  # median 3: 100 -> 30
        ([1, 1, 1, 2e4], "mean", 1e4, 2500.75, [3]),  # 2e4 -> 1e4
        ([1, 1, 1, 9e3], "mean", 1e4, 2250.75, []),
        ([3, 1, 2], "median", None, 2.0, []),
        ([1, 2, 3, 10], "median", None, 2.5, []),  # even: mean of the middle two
        ([2, 4], "median", None, 3.0, []),
        ([1, 1, 100], "median", 10, 1.0, [2]),
        ([1, 2, 3, 1000], "median", 10, 2.5, [3]),  # clipped to 25: the median stays 2.5
        ([1, 2, 100], "trimmed_mean", None, 2.0, []),  # n = 3: one off each end
        ([1, 3], "trimmed_mean", None, 2.0, []),  # fewer than three: the mean
        ([float(i * i) for i in range(20)], "trimmed_mean", None, 111.5, []),  # 20 // 10 = 2
        ([0.0, 0.0, 5.0], "mean", 2, 0.0, [2]),  # median 0: every positive loss is above
    ],
)
def test_cohort_loss(losses, reduce, bound, expected, clipped) -> None:
    value, out = cohort_loss(losses, reduce, bound)
    assert out == clipped
    if expected is None:
        assert value is None
    else:
        assert value == pytest.approx(expected, rel=1e-12)


def test_cohort_loss_defaults_to_the_median_with_a_clip_at_ten() -> None:
    assert LOSS_BOUND == 10.0
    assert cohort_loss([1.0, 2.0, 1.5, 2e4]) == (1.75, [3])  # median 1.75: 2e4 -> 17.5
    assert cohort_loss([1.0, 2.0, 1.5, 17.0]) == (1.75, [])


def test_the_clip_never_moves_the_median() -> None:
    """Values above the limit keep their order when clipped, and with a bound of 2 or more the
    limit is at or above the upper middle value (``b <= 2 (a + b) / 2``), so the median with
    the bound is the unbounded median, bit for bit, whatever the losses."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        losses = list(np.exp(rng.normal(0, 3, size=int(rng.integers(1, 9)))))
        bound = float(rng.choice([2.0, 3.0, 10.0]))
        assert cohort_loss(losses, "median", bound)[0] == cohort_loss(losses, "median", None)[0]


def test_cohort_loss_mean_does_not_overflow() -> None:
    """Nor warns: the overflow of the plain mean is expected and handled."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value, out = cohort_loss([1.5e308, 1.5e308, 0.0], "mean", None)
    assert out == [] and value == pytest.approx(1e308, rel=1e-12)
    value, _ = cohort_loss([1.7e308, 1.7e308], "mean", None)
    assert value == 1.7e308


def test_cohort_loss_median_of_an_even_count_does_not_overflow() -> None:
    assert cohort_loss([1.7e308, 1.6e308], "median", None)[0] == pytest.approx(1.65e308)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"losses": [1.0], "reduce": "max"},
            r"unknown loss reduction 'max'; choose one of \('mean'",
        ),
        ({"losses": [1.0], "bound": 1.0}, r"bound must be > 1 \(or None\), got 1.0"),
        ({"losses": [1.0], "bound": 0.5}, "bound must be > 1"),
        ({"losses": [1.0, -1.0]}, r"losses must be finite and >= 0, got -1.0"),
        ({"losses": [math.nan]}, "losses must be finite and >= 0, got nan"),
        ({"losses": [1.0, math.inf]}, "losses must be finite and >= 0, got inf"),
    ],
)
def test_cohort_loss_rejects(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cohort_loss(**kwargs)


def test_cohort_loss_accepts_a_bound_just_above_one() -> None:
    assert cohort_loss([1.0, 1.0], bound=1.0001) == (1.0, [])


# -- stage 2: label weights (Sec. 3, eq. 2; the code's per-class weights) ----------------------


COUNTS = np.array([[3, 0, 0], [1, 4, 0]])


def test_label_weights_are_each_cohorts_share_of_the_class() -> None:
    """p_ic = N_ic / sum_j N_jc: class 0 held 3:1, class 1 only by cohort 1, class 2 by none
    (uniform 1/n)."""
    expected = np.array([[0.75, 0.0, 0.5], [0.25, 1.0, 0.5]])
    np.testing.assert_allclose(teacher_weights(COUNTS), expected)
    np.testing.assert_allclose(teacher_weights(COUNTS, "label"), expected)


def test_size_and_uniform_weights() -> None:
    """size: p_i = N_i / N = 3/8, 5/8 in every class; uniform: 1/n."""
    np.testing.assert_allclose(
        teacher_weights(COUNTS, "size"), np.array([[3 / 8] * 3, [5 / 8] * 3])
    )
    np.testing.assert_allclose(teacher_weights(COUNTS, "uniform"), np.full((2, 3), 0.5))
    np.testing.assert_allclose(teacher_weights(np.zeros((4, 2)), "size"), np.full((4, 2), 0.25))
    np.testing.assert_allclose(teacher_weights(np.zeros((4, 2)), "label"), np.full((4, 2), 0.25))


@pytest.mark.parametrize(
    ("counts", "mode", "message"),
    [
        (np.array([1.0, 2.0]), "label", r"counts must be \(teachers, classes\), got shape \(2,\)"),
        (np.zeros((0, 3)), "label", r"got shape \(0, 3\)"),
        (np.array([[1.0, -1.0]]), "label", "^counts must be finite and non-negative$"),
        (np.array([[1.0, math.nan]]), "label", "counts must be finite and non-negative"),
        (np.array([[1.0, math.inf]]), "label", "counts must be finite and non-negative"),
        (COUNTS, "fedgo", r"unknown teacher weighting 'fedgo'; choose one of \('label'"),
    ],
)
def test_teacher_weights_reject(counts, mode: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        teacher_weights(counts, mode)


def test_label_and_size_weights_of_a_class_or_total_of_one() -> None:
    """A class held once gets weight 1 for its holder; a total of one sample is a size weight
    of 1 (not the uniform fallback, which is for a total of 0). A class no cohort holds gets
    1/n without a division by zero (no warning)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        label = teacher_weights(np.array([[1, 0, 0], [0, 2, 0]]))
    np.testing.assert_allclose(label, [[1.0, 0.0, 0.5], [0.0, 1.0, 0.5]])
    np.testing.assert_allclose(
        teacher_weights(np.array([[1, 0], [0, 0]]), "size"), [[1.0, 1.0], [0.0, 0.0]]
    )


def test_one_teacher_gets_weight_one() -> None:
    np.testing.assert_allclose(teacher_weights(np.array([[2.0, 0.0]])), [[1.0, 1.0]])


def test_combine_teachers_is_eq2_with_per_class_weights() -> None:
    """z~[x, c] = sum_i p_ic z_i[x, c]."""
    logits = torch.tensor(
        [[[1.0, 2.0], [0.0, -2.0]], [[3.0, 4.0], [8.0, 6.0]]], dtype=torch.float64
    )
    weights = np.array([[0.25, 1.0], [0.75, 0.0]])
    expected = torch.tensor([[2.5, 2.0], [6.0, -2.0]], dtype=torch.float64)
    out = combine_teachers(logits, weights)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(combine_teachers(logits, torch.as_tensor(weights)), expected)
    # float32 logits with float64 weights: the weights take the logits' dtype
    out32 = combine_teachers(logits.float(), weights)
    assert out32.dtype == torch.float32
    torch.testing.assert_close(out32, expected.float())


def test_combine_teachers_with_more_samples_than_teachers() -> None:
    """n = 2 teachers, N = 3 samples, C = 1: the weights are (n, C), not (N, C)."""
    logits = torch.tensor([[[1.0], [2.0], [3.0]], [[5.0], [6.0], [7.0]]])
    out = combine_teachers(logits, np.array([[0.5], [0.5]]))
    torch.testing.assert_close(out, torch.tensor([[3.0], [4.0], [5.0]]))


def test_combine_teachers_checks_shapes() -> None:
    with pytest.raises(
        ValueError,
        match=r"logits \(n, N, C\) and weights \(n, C\) disagree: \(2, 2, 2\) vs \(2, 3\)",
    ):
        combine_teachers(torch.zeros(2, 2, 2), np.zeros((2, 3)))
    with pytest.raises(ValueError, match="disagree"):
        combine_teachers(torch.zeros(2, 2), np.zeros((2, 2)))


def test_cohort_odds_weights_sum_their_clients_rows() -> None:
    client = torch.tensor([[0.2, 0.5], [0.3, 0.1], [0.5, 0.4]])
    out = cohort_odds_weights(client, [[0, 2], [1]])
    torch.testing.assert_close(out, torch.tensor([[0.7, 0.9], [0.3, 0.1]]))
    torch.testing.assert_close(out.sum(0), torch.ones(2))


def test_combine_per_sample_weights_each_sample_by_its_own_weights() -> None:
    logits = torch.tensor([[[1.0, 2.0], [4.0, 0.0]], [[3.0, 0.0], [2.0, 2.0]]])
    weights = torch.tensor([[0.5, 0.25], [0.5, 0.75]], dtype=torch.float64)
    out = combine_per_sample(logits, weights)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([[2.0, 1.0], [2.5, 1.5]]))
    with pytest.raises(
        ValueError,
        match=r"logits \(n, N, C\) and weights \(n, N\) disagree: \(2, 2, 2\) vs \(2, 3\)",
    ):
        combine_per_sample(logits, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="disagree"):
        combine_per_sample(torch.zeros(2, 2), torch.zeros(2, 2))


def test_teacher_outputs_are_the_logits_or_their_log_softmax() -> None:
    z = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    assert teacher_outputs(z, "logits") is z
    expected = z - torch.logsumexp(z, dim=1, keepdim=True)
    torch.testing.assert_close(teacher_outputs(z, "log_probs"), expected)
    # the stacked teachers' (n, N, C) logits: over the classes, the last axis
    stacked = torch.stack([z, 2 * z])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = teacher_outputs(stacked, "log_probs")
    torch.testing.assert_close(got, stacked - torch.logsumexp(stacked, dim=2, keepdim=True))


def test_distill_config_defaults_are_sec_4_1() -> None:
    cfg = CohortDistillConfig()
    assert (cfg.epochs, cfg.batch_size, cfg.lr, cfg.beta1) == (50, 512, 1e-3, 0.9)
    assert cfg.steps is None and cfg.public_size is None  # epochs passes over the whole set
    assert (cfg.weights, cfg.disc_mode, cfg.outputs, cfg.teacher_batch_size) == (
        "label",
        "double_sigmoid",
        "logits",
        512,
    )
    cfg.check(Checker(prefix="strategy.distill.", obj=cfg))
    edge = CohortDistillConfig(epochs=1, batch_size=1, lr=1e-9, beta1=0.0, teacher_batch_size=1)
    edge.check(Checker(prefix="strategy.distill.", obj=edge))


@pytest.mark.parametrize(
    ("change", "key", "problem"),
    [
        ({"epochs": 0}, "epochs", "must be >= 1"),
        ({"steps": 0}, "steps", "must be >= 1 (or null: epochs)"),
        ({"public_size": 0}, "public_size", "must be >= 1 (or null: all)"),
        ({"batch_size": 0}, "batch_size", "must be >= 1"),
        ({"lr": 0.0}, "lr", "must be > 0"),
        ({"beta1": -0.1}, "beta1", "must be in [0, 1)"),
        ({"beta1": 1.0}, "beta1", "must be in [0, 1)"),
        ({"weights": "x"}, "weights", "unknown; choose one of label, size, uniform, fedgo"),
        ({"disc_mode": "x"}, "disc_mode", "unknown; choose one of double_sigmoid, sigmoid"),
        ({"outputs": "x"}, "outputs", "unknown; choose one of logits, log_probs"),
        ({"teacher_batch_size": 0}, "teacher_batch_size", "must be >= 1"),
    ],
)
def test_distill_config_check_names_the_key(change: dict, key: str, problem: str) -> None:
    cfg = CohortDistillConfig(**change)
    with pytest.raises(ConfigError) as err:
        cfg.check(Checker(prefix="strategy.distill.", obj=cfg))
    assert err.value.key == f"strategy.distill.{key}"
    assert err.value.problem == problem


def _reference_l1(student, x, targets, cfg, seed):
    """The same loop written out with torch's Adam: shuffled batches, the last batch of one
    dropped, L1 on (log-)outputs, the epoch loss weighted by batch size."""
    opt = torch.optim.Adam(student.parameters(), lr=cfg.lr, betas=(cfg.beta1, 0.999))
    gen = torch.Generator().manual_seed(seed)
    n = len(x)
    end = n - 1 if n > 1 and n % cfg.batch_size == 1 else n
    losses, steps = [], 0
    for _ in range(cfg.epochs):
        order = torch.randperm(n, generator=gen)
        total = count = 0
        for s in range(0, end, cfg.batch_size):
            idx = order[s : s + cfg.batch_size]
            out = student(x[idx])
            if cfg.outputs == "log_probs":
                out = torch.log_softmax(out, dim=-1)
            loss = (out - targets[idx]).abs().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
            count += len(idx)
            steps += 1
        losses.append(total / count)
    return losses, steps


@pytest.mark.parametrize(
    ("n", "outputs", "per_epoch"), [(7, "logits", 2), (9, "log_probs", 2), (1, "logits", 1)]
)
def test_distill_l1_matches_the_loop_written_out(n: int, outputs: str, per_epoch: int) -> None:
    """Two epochs in batches of 4 (7 samples: 4 + 3; 9: 4 + 4, the last one dropped; 1: one
    batch of one, kept): the same parameters, per-epoch losses and step count as
    Adam(lr, (beta1, 0.999)) written out."""
    rng = np.random.default_rng(1)
    data = ArrayDataset(x=rng.normal(size=(n, 3)).astype(np.float32), y=np.zeros(n), num_classes=2)
    x = torch.as_tensor(data.x)
    targets = torch.as_tensor(rng.normal(size=(n, 2)).astype(np.float32))
    cfg = CohortDistillConfig(epochs=2, batch_size=4, lr=0.05, beta1=0.5, outputs=outputs)
    torch.manual_seed(0)
    student = nn.Linear(3, 2)
    ref = nn.Linear(3, 2)
    ref.load_state_dict(student.state_dict())
    losses, steps = _reference_l1(ref, x, targets, cfg, seed=7)
    result = distill_l1(
        student,
        data,
        targets,
        cfg,
        rng=torch.Generator().manual_seed(7),
        device=torch.device("cpu"),
    )
    assert result.steps == steps == 2 * per_epoch
    np.testing.assert_allclose(result.epoch_losses, losses, rtol=1e-6)
    assert result.loss == result.epoch_losses[-1]
    assert 0 <= result.seconds < 600
    for a, b in zip(student.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a.detach(), b.detach())


def test_distill_l1_in_steps_continues_across_passes_and_stops_mid_pass() -> None:
    """``steps=5`` on 7 samples in batches of 4 (2 a pass): passes of 2, 2 and 1 steps, the
    same parameters as the loop written out for 3 epochs stopped after its fifth step (the
    third pass's loss over its one batch), and ``epochs`` ignored."""
    rng = np.random.default_rng(2)
    data = ArrayDataset(x=rng.normal(size=(7, 3)).astype(np.float32), y=np.zeros(7), num_classes=2)
    targets = torch.as_tensor(rng.normal(size=(7, 2)).astype(np.float32))
    cfg = CohortDistillConfig(epochs=40, steps=5, batch_size=4, lr=0.05)
    torch.manual_seed(0)
    student, ref = nn.Linear(3, 2), nn.Linear(3, 2)
    ref.load_state_dict(student.state_dict())
    result = distill_l1(
        student,
        data,
        targets,
        cfg,
        rng=torch.Generator().manual_seed(7),
        device=torch.device("cpu"),
    )
    opt = torch.optim.Adam(ref.parameters(), lr=0.05, betas=(0.9, 0.999))
    gen = torch.Generator().manual_seed(7)
    x, losses, done = torch.as_tensor(data.x), [], 0
    while done < 5:
        order = torch.randperm(7, generator=gen)
        total = count = 0
        for s in (0, 4):
            if done == 5:
                break
            idx = order[s : s + 4]
            loss = (ref(x[idx]) - targets[idx]).abs().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, count, done = total + loss.item() * len(idx), count + len(idx), done + 1
        losses.append(total / count)
    assert result.steps == 5 and len(result.epoch_losses) == 3
    np.testing.assert_allclose(result.epoch_losses, losses, rtol=1e-6)
    for a, b in zip(student.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a.detach(), b.detach())


def test_public_subset_is_a_seeded_sorted_draw_or_everything() -> None:
    from fedgo_flwr.learning.cohorts import public_subset

    assert public_subset(10, None, 0) is None and public_subset(10, 10, 0) is None
    a = public_subset(100, 30, seed=3)
    assert len(a) == len(set(a)) == 30 and list(a) == sorted(a) and 0 <= a.min() < a.max() < 100
    assert np.array_equal(a, public_subset(100, 30, seed=3))
    assert not np.array_equal(a, public_subset(100, 30, seed=4))


def test_distill_l1_of_zero_epochs_reports_nan_and_leaves_the_student() -> None:
    data = ArrayDataset(x=np.ones((4, 3), np.float32), y=np.zeros(4), num_classes=2)
    student = nn.Linear(3, 2)
    before = [p.detach().clone() for p in student.parameters()]
    cfg = CohortDistillConfig(epochs=0)
    result = distill_l1(
        student, data, torch.zeros(4, 2), cfg, rng=torch.Generator(), device=torch.device("cpu")
    )
    assert math.isnan(result.loss) and result.epoch_losses == [] and result.steps == 0
    for a, b in zip(student.parameters(), before, strict=True):
        torch.testing.assert_close(a.detach(), b)


def test_distill_l1_checks_the_targets_shape() -> None:
    data = ArrayDataset(x=np.zeros((4, 3), np.float32), y=np.zeros(4), num_classes=2)
    cfg = CohortDistillConfig(epochs=1)
    for bad in (torch.zeros(3, 2), torch.zeros(4)):
        with pytest.raises(ValueError, match=r"targets must be \(4, C\), got"):
            distill_l1(
                nn.Linear(3, 2), data, bad, cfg, rng=torch.Generator(), device=torch.device("cpu")
            )


def test_mean_sd() -> None:
    m, s = mean_sd([])
    assert math.isnan(m) and math.isnan(s)
    assert mean_sd([2]) == (2.0, 0.0)
    m, s = mean_sd([1, 2, 3, 6])
    assert m == 3.0 and s == pytest.approx(math.sqrt(14 / 3), rel=1e-12)
    assert mean_sd([1.0, 3.0]) == (2.0, pytest.approx(math.sqrt(2.0)))


# -- a cohort's run: deadlines, snapshots and totals ------------------------------------------


def _cohort(i, status=RUNNING, finish=None, clock=0.0, trace=(), history=(), best=None) -> Cohort:
    return Cohort(
        index=i,
        members=[i],
        counts=np.zeros(2),
        arrays={"w": np.array([float(i)])},
        stopper=PlateauStopper(),
        clock=SimClock(seconds=clock),
        best=best,
        status=status,
        finish_seconds=finish,
        trace=list(trace),
        history=list(history),
    )


def test_cohort_teacher_is_the_best_model_when_known_else_the_last() -> None:
    best = {"w": np.array([9.0])}
    c = _cohort(1, best=best)
    assert c.teacher("best") is best
    assert c.teacher("last") is c.arrays
    assert (
        _cohort(1).teacher("best") is _cohort(1).arrays or _cohort(1).teacher("best")["w"][0] == 1.0
    )
    assert c.running and not _cohort(2, status=CONVERGED).running
    fresh = Cohort(0, [0], np.zeros(2), {}, PlateauStopper())
    assert (fresh.status, fresh.rounds, fresh.updates, fresh.best, fresh.best_round) == (
        RUNNING,
        0,
        0,
        None,
        None,
    )
    assert fresh.finish_seconds is None and fresh.trace == [] and fresh.history == []
    assert fresh.clock == SimClock()


def test_live_cohorts_are_those_with_clients() -> None:
    cs = [
        _cohort(0),
        _cohort(1, status=EMPTY),
        _cohort(2, status=CONVERGED),
        _cohort(3, status=PAUSED),
    ]
    assert [c.index for c in live_cohorts(cs)] == [0, 2, 3]


@pytest.mark.parametrize(
    ("q", "live", "expected"),
    [(0.5, 4, 2), (0.5, 3, 2), (0.1, 4, 1), (0.0, 4, 1), (0.75, 4, 3), (0.7, 10, 7), (1.0, 4, 4)],
)
def test_cohorts_needed_is_ceil_qn_at_least_one(q: float, live: int, expected: int) -> None:
    assert cohorts_needed(q, live) == expected


def test_distill_deadline_is_the_earlier_of_the_hours_and_the_qth_finish() -> None:
    cs = [
        _cohort(0, CONVERGED, finish=100.0),
        _cohort(1, CONVERGED, finish=50.0),
        _cohort(2, EMPTY),
    ]
    assert distill_deadline(cs, 0.5, None) == 50.0  # ceil(0.5 x 2 live) = 1st finish
    assert distill_deadline(cs, 0.75, None) == 100.0  # ceil(1.5) = 2nd finish
    assert distill_deadline(cs, 0.5, 0.01) == 36.0  # 0.01 h = 36 s, earlier
    assert distill_deadline(cs, 0.5, 1.0) == 50.0
    assert distill_deadline(cs, 1.0, None) is None  # q = 1: wait for every cohort
    assert distill_deadline(cs, 1.0, 2.0) == 7200.0
    running = [_cohort(0, CONVERGED, finish=100.0), _cohort(1, RUNNING, clock=500.0)]
    assert distill_deadline(running, 0.5, None) == 100.0  # 1 needed, 1 converged
    assert distill_deadline(running, 0.75, None) is None  # 2 needed, 1 converged: not yet
    paused = [_cohort(0, CONVERGED, finish=80.0), _cohort(1, MAX_ROUNDS, finish=20.0)]
    assert distill_deadline(paused, 0.5, None) == 80.0  # only converged cohorts count


def test_prune_history_keeps_the_snapshots_that_can_still_be_the_teacher() -> None:
    """q = 0.25 of 3 live cohorts: T_q >= the smallest of (finish, or clock if running) = 60
    (A's finish, not its clock 130, nor B's clock 70); a snapshot is dropped once the next one
    is known by then."""
    a = _cohort(
        0,
        CONVERGED,
        finish=60.0,
        clock=130.0,
        history=[(0, "a0"), (40, "a1"), (60, "a2"), (90, "a3")],
    )
    b = _cohort(1, RUNNING, clock=70.0, history=[(0, "b0"), (70, "b1")])
    c = _cohort(2, CONVERGED, finish=200.0, clock=250.0, history=[(0, "c0"), (10, "c1")])
    e = _cohort(3, EMPTY, clock=0.0, history=[(0, "e0"), (5, "e1")])
    prune_history([a, b, c, e], 0.25)
    assert [h[1] for h in a.history] == ["a2", "a3"]
    assert [h[1] for h in b.history] == ["b0", "b1"]
    assert [h[1] for h in c.history] == ["c1"]
    assert [h[1] for h in e.history] == ["e0", "e1"]
    d = _cohort(0, CONVERGED, finish=5.0, history=[(0, "d0"), (1, "d1")])
    prune_history([d], 1.0)  # q = 1: every cohort's last model is its teacher
    assert [h[1] for h in d.history] == ["d0", "d1"]


def test_cohort_totals_count_each_cohort_as_of_the_deadline() -> None:
    a = _cohort(
        0,
        CONVERGED,
        finish=100.0,
        trace=[(30.0, 3.0, 300, 600), (60.0, 6.0, 600, 1200), (100.0, 10.0, 1000, 2000)],
    )
    a.clock = SimClock(100.0, 10.0, 1000, 2000, 3)
    b = _cohort(1, RUNNING, trace=[(50.0, 5.0, 250, 350), (80.0, 8.0, 500, 700)])
    b.clock = SimClock(80.0, 8.0, 500, 700, 2)
    e = _cohort(2, EMPTY)
    e.clock = SimClock(999.0, 99.0, 9, 9, 9)
    uploads = SimClock(bytes_down=11, bytes_up=13)
    assert cohort_totals([a, b, e], None, uploads) == SimClock(100.0, 18.0, 1511, 2713, 3)
    assert cohort_totals([a, b, e], 60.0, uploads) == SimClock(60.0, 11.0, 861, 1563, 2)
    assert cohort_totals([a, b, e], 60.0 - 5e-10, uploads) == SimClock(60.0, 11.0, 861, 1563, 2)
    edge = 59.999999999  # edge + 1e-9 == 60.0 exactly: still counted
    assert edge + 1e-9 == 60.0
    assert cohort_totals([a, b, e], edge, uploads) == SimClock(60.0, 11.0, 861, 1563, 2)
    assert cohort_totals([a, b, e], 59.0, uploads) == SimClock(50.0, 8.0, 561, 963, 1)
    assert cohort_totals([a, b, e], 20.0, uploads) == SimClock(0.0, 0.0, 11, 13, 0)
    assert uploads == SimClock(bytes_down=11, bytes_up=13)


def test_distill_start_is_the_deadline_or_the_last_finish() -> None:
    cs = [
        _cohort(0, CONVERGED, finish=100.0, clock=130.0),
        _cohort(1, RUNNING, clock=80.0),
        _cohort(2, EMPTY, clock=500.0),
    ]
    assert distill_start(cs, None) == 100.0
    assert distill_start(cs, 90.0) == 90.0
    assert distill_start(cs, 200.0) == 100.0
    assert distill_start([], None) == 0.0
    assert distill_start([_cohort(2, EMPTY, clock=500.0)], 5.0) == 0.0


def test_teacher_at_is_the_last_snapshot_known_by_then() -> None:
    c = _cohort(0, CONVERGED, finish=100.0, history=[(0.0, "h0"), (50.0, "h1"), (100.0, "h2")])
    assert teacher_at(c, 60.0, 0.5, "best") == "h1"
    assert teacher_at(c, 50.0, 0.5, "best") == "h1"
    assert teacher_at(c, 50.0 - 5e-10, 0.5, "best") == "h1"
    edge = 49.999999999  # edge + 1e-9 == 50.0 exactly
    assert edge + 1e-9 == 50.0
    assert teacher_at(c, edge, 0.5, "best") == "h1"
    assert teacher_at(c, 49.0, 0.5, "best") == "h0"
    assert teacher_at(c, 100.0, 0.5, "best") == "h2"
    assert teacher_at(c, -1.0, 0.5, "best") == "h0"  # none known yet: the first
    best = {"w": np.array([5.0])}
    c.best = best
    assert teacher_at(c, 60.0, 1.0, "best") is best
    assert teacher_at(c, 60.0, 1.0, "last") is c.arrays
