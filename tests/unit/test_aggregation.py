"""The aggregation rules and reply checks by hand (fedgo_flwr/learning/aggregation.py): FedAvg's
n_k-weighted running mean in extended precision, the coordinate-wise median and trimmed mean
(Yin et al. 2018, Alg. 1), norm clipping of an update (Sun et al. 2019, Sec. 4), the update
bound, the round-relative upload bound, the dtype casts and the reply checks. Each test fails
under a change of one operator, constant or argument of the module (docs/mutation.md)."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

from fedgo_flwr.config.schema import Checker, ConfigError
from fedgo_flwr.learning.aggregation import (
    AGGREGATION_RULES,
    DEFAULT_CONSENSUS_CLIP,
    DEFAULT_UPDATE_BOUND,
    DEFAULT_UPLOAD_BOUND,
    AggregationConfig,
    BoundedAverage,
    BoundedUpload,
    ReplyStack,
    RunningAverage,
    bound_uploads,
    check_arrays,
    clip_update,
    coordinate_median,
    lower_median,
    new_average,
    norm_bound_scales,
    round_median,
    scale_upload,
    trim_count,
    trimmed_mean,
    update_norm,
    update_problem,
    upload_norm,
    warn_bounded,
    weighted_average,
)
from fedgo_flwr.learning.consensus import ConsensusStack
from fedgo_flwr.learning.weighted_rules import (
    new_weighted_average,
    weighted_median,
    weighted_trimmed_mean,
)

MODULE_LOG = "fedgo_flwr.learning.aggregation"


def sets(*values: float, dtype: type = np.float64) -> list[dict[str, np.ndarray]]:
    """One array set per value: a (2,) array filled with it."""
    return [{"w": np.full(2, v, dtype=dtype)} for v in values]


def w(arrays: dict[str, np.ndarray]) -> float:
    return float(arrays["w"][0])


# -- configuration ---------------------------------------------------------------------------


def check(config: AggregationConfig) -> None:
    config.check(Checker(prefix="strategy.aggregation.", obj=config))


def test_config_defaults_are_the_consensus_rule_with_the_bounds_on() -> None:
    c = AggregationConfig()
    assert (c.rule, c.trim_fraction, c.clip_norm) == ("consensus", 0.2, None)
    assert c.consensus_clip == DEFAULT_CONSENSUS_CLIP == 2.0
    assert c.upload_bound == DEFAULT_UPLOAD_BOUND == 10.0
    assert (c.radial_clip, c.discriminator_bound) == (8.0, 25.0)
    assert (c.clip_factor, c.clip_keep) == (10.0, 3)
    assert c.update_bound == DEFAULT_UPDATE_BOUND == 50.0
    assert AGGREGATION_RULES == ("mean", "median", "trimmed_mean", "consensus")
    check(c)


# (field, the last accepted value(s), the first rejected one(s), the problem)
CONFIG_BOUNDS = [
    ("trim_fraction", (0.0, 0.49), (-0.01, 0.5), "must be in [0, 0.5)"),
    (
        "clip_norm",
        (1e-9, 1e300, None),
        (0.0, -1.0, math.inf),
        "must be a finite number > 0 (or null: no clipping)",
    ),
    (
        "upload_bound",
        (1.0, 1e300, None),
        (0.999, math.inf),
        "must be a finite number >= 1, a multiple of the round's median upload norm "
        "(or null: no bound)",
    ),
    (
        "radial_clip",
        (1.0, 1e300, None),
        (0.999, math.inf),
        "must be a finite number >= 1, a multiple of the round's median radial part of each "
        "array's updates (or null: no clipping)",
    ),
    (
        "discriminator_bound",
        (1.0, 1e300, None),
        (0.999, math.inf),
        "must be a finite number >= 1, a multiple of the round's median logit scale of the "
        "discriminators (or null: no bound)",
    ),
    (
        "update_bound",
        (1e-9, 1e300, None),
        (0.0, -1.0, math.inf),
        "must be a finite number > 0, a multiple of the norm of the model the server sent "
        "(or null: no bound)",
    ),
]


@pytest.mark.parametrize(("key", "good", "bad", "problem"), CONFIG_BOUNDS)
def test_config_bounds_name_the_key(key: str, good: tuple, bad: tuple, problem: str) -> None:
    for value in good:
        check(AggregationConfig(**{key: value}))
    for value in bad:
        with pytest.raises(ConfigError) as err:
            check(AggregationConfig(**{key: value}))
        assert err.value.key == f"strategy.aggregation.{key}", value
        assert err.value.problem == problem, value


def test_config_rule_must_be_one_of_the_rules() -> None:
    for rule in AGGREGATION_RULES:
        check(AggregationConfig(rule=rule))
    with pytest.raises(ConfigError) as err:
        check(AggregationConfig(rule="krum"))
    assert err.value.key == "strategy.aggregation.rule"
    assert err.value.problem == "unknown; choose one of mean, median, trimmed_mean, consensus"


def test_config_trimmed_is_floor_of_beta_m() -> None:
    assert AggregationConfig(trim_fraction=0.3).trimmed(10) == 3
    assert AggregationConfig(trim_fraction=0.25).trimmed(7) == 1


# -- trim count, median, trimmed mean --------------------------------------------------------


def test_trim_count_is_the_floor_of_beta_times_m() -> None:
    assert trim_count(10, 0.3) == 3  # 0.3 * 10 = 2.9999999999999996 in floating point
    assert trim_count(5, 0.2) == 1
    assert trim_count(5, 0.39) == 1  # floor(1.95)
    assert trim_count(5, 0.4) == 2
    assert trim_count(4, 0.2) == 0  # floor(0.8)
    assert trim_count(3, 0.0) == 0
    assert trim_count(0, 0.4) == 0


def test_median_is_coordinatewise_with_the_middle_mean_for_even_m() -> None:
    a = [
        {"w": np.array([1.0, 10.0, -3.0]), "m": np.array([[1.0, 2.0]])},
        {"w": np.array([2.0, 0.0, 5.0]), "m": np.array([[7.0, 2.0]])},
        {"w": np.array([9.0, 4.0, 1.0]), "m": np.array([[3.0, 8.0]])},
    ]
    out = coordinate_median(a)
    assert set(out) == {"w", "m"}
    np.testing.assert_array_equal(out["w"], [2.0, 4.0, 1.0])  # odd m: the middle value
    np.testing.assert_array_equal(out["m"], [[3.0, 2.0]])
    out = coordinate_median([*a, {"w": np.array([4.0, 5.0, 6.0]), "m": np.array([[0.0, 0.0]])}])
    # even m: the mean of the two middle values (2, 4 | 4, 5 | 1, 5 ; 1, 3 | 2, 2)
    np.testing.assert_array_equal(out["w"], [3.0, 4.5, 3.0])
    np.testing.assert_array_equal(out["m"], [[2.0, 2.0]])
    assert out["w"].shape == (3,) and out["m"].shape == (1, 2)
    # one reply: itself
    np.testing.assert_array_equal(coordinate_median(a[:1])["w"], a[0]["w"])


def test_median_and_trimmed_mean_are_unweighted_and_ignore_an_outlier() -> None:
    stack = ReplyStack("median")
    for arrays, n in zip(sets(1.0, 2.0, 1e9), (1000, 1, 1), strict=True):
        stack.add(arrays, n)
    assert stack.count == 3 and w(stack.result()) == 2.0
    stack = ReplyStack("trimmed_mean", 0.2)
    for arrays, n in zip(sets(-1e9, 1.0, 2.0, 6.0, 1e9), (100, 1, 1, 1, 100), strict=True):
        stack.add(arrays, n)
    assert w(stack.result()) == 3.0


def test_trimmed_mean_drops_b_values_at_each_end() -> None:
    a = sets(7.0, -100.0, 1.0, 2.0, 100.0, 6.0)  # sorted: -100 1 2 6 7 100
    assert w(trimmed_mean(a, 0.0)) == pytest.approx(16 / 6)  # b = 0: the plain mean
    assert w(trimmed_mean(a, 0.1)) == pytest.approx(16 / 6)  # floor(0.6) = 0
    assert w(trimmed_mean(a, 0.2)) == 4.0  # b = 1: 1 2 6 7
    assert w(trimmed_mean(a, 0.34)) == 4.0  # b = 2: 2 6
    b = sets(1.0, 2.0, 3.0, 10.0, 4.0)
    assert w(trimmed_mean(b, 0.2)) == 3.0  # b = 1: 2 3 4
    assert w(trimmed_mean(b, 0.4)) == 3.0  # b = 2: 3, the median
    # coordinate-wise: each coordinate sorted on its own
    c = [{"w": np.array([1.0, 30.0])}, {"w": np.array([20.0, 2.0])}, {"w": np.array([3.0, 1.0])}]
    np.testing.assert_array_equal(trimmed_mean(c, 0.34)["w"], [3.0, 2.0])
    # one reply: itself
    assert trimmed_mean(c[:1], 0.4)["w"].tolist() == [1.0, 30.0]


@pytest.mark.parametrize("beta", [-0.1, 0.5, 0.7])
def test_trimmed_mean_refuses_a_fraction_outside_zero_to_a_half(beta: float) -> None:
    with pytest.raises(ValueError, match=r"^trim_fraction must be in \[0, 0.5\), got "):
        trimmed_mean(sets(1.0, 2.0, 3.0), beta)


def test_the_rules_work_in_float64_and_cast_back() -> None:
    """Float32 replies are stacked as float64: the mean of two float32 values near the
    largest float32 does not overflow, and small terms are not lost to float32 sums."""
    big = sets(3e38, 3e38, dtype=np.float32)
    out = coordinate_median(big)
    assert out["w"].dtype == np.float32 and w(out) == np.float32(3e38)
    out = trimmed_mean([*big, *sets(3e38, dtype=np.float32)], 0.0)
    assert out["w"].dtype == np.float32 and w(out) == np.float32(3e38)
    tiny = 2.0**-24
    small = sets(1.0, tiny, tiny, dtype=np.float32)
    assert w(trimmed_mean(small, 0.0)) == np.float32((1 + 2 * tiny) / 3)  # 0.33333337
    assert w(trimmed_mean(small, 0.0)) != np.float32(1 / 3)


def test_integer_buffers_are_rounded_to_their_dtype() -> None:
    a = [{"n": np.asarray(np.int64(v))} for v in (-1, -2, 9)]
    out = coordinate_median(a[:2])  # -1.5: rounded (to even), not truncated
    assert out["n"].dtype == np.int64 and type(out["n"]) is np.ndarray
    assert out["n"].shape == () and int(out["n"]) == -2
    out = trimmed_mean([{"n": np.asarray(v, np.int32)} for v in (2, 3, 3, 3)], 0.0)  # 2.75
    assert out["n"].dtype == np.int32 and int(out["n"]) == 3
    avg = weighted_average([{"n": np.asarray(v, np.int64)} for v in (2, 3)], [1, 1])  # 2.5
    assert int(avg["n"]) == 2 and type(avg["n"]) is np.ndarray  # half to even


def test_stacking_refuses_no_replies_and_different_keys() -> None:
    with pytest.raises(ValueError, match="^nothing to aggregate: no arrays$"):
        coordinate_median([])
    extra = [{"w": np.zeros(2)}, {"w": np.zeros(2), "v": np.zeros(1)}]
    for rule in (coordinate_median, lambda a: trimmed_mean(a, 0.0)):
        with pytest.raises(ValueError, match="^array sets have different keys$"):
            rule(extra)
        with pytest.raises(ValueError, match="^array sets have different keys$"):
            rule([*sets(1.0, 2.0), {"v": np.zeros(2)}])


# -- the accumulators ------------------------------------------------------------------------


def test_running_average_weights_each_reply_by_n_k() -> None:
    avg = RunningAverage()
    assert avg.count == 0 and avg.total == 0.0 and avg.sums is None
    avg.add({"w": np.array([0.0, 4.0], np.float32)}, 1)
    avg.add({"w": np.array([4.0, 0.0], np.float32)}, 3)
    avg.add({"w": np.array([100.0, 100.0], np.float32)}, 0)  # weight 0 is allowed, adds nothing
    assert avg.count == 3 and avg.total == 4.0
    out = avg.result()
    assert out["w"].dtype == np.float32
    np.testing.assert_array_equal(out["w"], [3.0, 1.0])  # (0*1 + 4*3) / 4, (4*1 + 0*3) / 4
    assert weighted_average(sets(1.0, 2.0, 4.0), [1, 1, 2])["w"][0] == 2.75
    # weights that sum to less than 1 (shares rather than counts)
    assert w(weighted_average(sets(1.0, 4.0), [0.25, 0.5])) == 3.0  # (0.25 + 2) / 0.75


def test_running_average_sums_in_extended_precision() -> None:
    """``1e16 + 1`` is ``1e16`` in float64 (its spacing there is 2), not in np.longdouble."""
    if np.finfo(np.longdouble).nmant <= np.finfo(np.float64).nmant:
        pytest.skip("np.longdouble is float64 on this platform")
    out = weighted_average(sets(1e16, 1.0, -1e16), [1, 1, 1])
    assert w(out) == 1 / 3
    big = weighted_average(sets(3e38, 3e38, dtype=np.float32), [1, 1])
    assert w(big) == np.float32(3e38)


def test_running_average_cast_takes_the_first_replys_dtype_and_shape() -> None:
    avg = RunningAverage()
    avg.add({"w": np.zeros((1, 2), np.float32), "n": np.asarray(1, np.int64)}, 1)
    avg.add({"w": np.ones((1, 2), np.float64), "n": np.asarray(2, np.int64)}, 1)
    out = avg.result()
    assert out["w"].dtype == np.float32 and out["w"].shape == (1, 2)
    np.testing.assert_array_equal(out["w"], [[0.5, 0.5]])
    assert out["n"].dtype == np.int64 and int(out["n"]) == 2  # 1.5 to even


@pytest.mark.parametrize("bad", [-1.0, -1e-300, math.inf, math.nan])
def test_accumulators_refuse_a_negative_or_non_finite_weight(bad: float) -> None:
    for acc in (RunningAverage(), ReplyStack("median"), BoundedAverage(AggregationConfig())):
        with pytest.raises(ValueError, match=r"^weight must be finite and non-negative, got "):
            acc.add({"w": np.zeros(2)}, bad)
        assert acc.count == 0


def test_accumulators_take_a_weight_of_zero() -> None:
    """A client with no samples is a valid reply: the mean gives it no say, the unweighted
    rules count it like any other."""
    mean = RunningAverage()
    stack = ReplyStack("median")
    bounded = BoundedAverage(AggregationConfig(upload_bound=None))
    for acc in (mean, stack, bounded):
        for arrays, n in zip(sets(1.0, 5.0, 6.0), (2, 0, 0), strict=True):
            acc.add(arrays, n)
        assert acc.count == 3
    assert w(mean.result()) == 1.0
    assert w(stack.result()) == 5.0
    assert w(bounded.result()) == 1.0 and bounded.weights == [2, 0, 0]


def test_accumulators_refuse_different_keys_and_report_emptiness() -> None:
    for acc in (RunningAverage(), ReplyStack("median"), BoundedAverage(AggregationConfig())):
        acc.add({"w": np.zeros(2)}, 1)
        for other in ({"w": np.zeros(2), "v": np.zeros(1)}, {"v": np.zeros(2)}):
            with pytest.raises(ValueError, match="^array sets have different keys$"):
                acc.add(other, 1)
        assert acc.count == 1
    with pytest.raises(ValueError, match="^nothing to average: no arrays$"):
        RunningAverage().result()
    zero = RunningAverage()
    zero.add({"w": np.ones(2)}, 0)
    with pytest.raises(ValueError, match="^weights must not all be zero$"):
        zero.result()


def test_reply_stack_takes_only_the_robust_rules() -> None:
    with pytest.raises(ValueError, match="^ReplyStack takes median or trimmed_mean, not 'mean'$"):
        ReplyStack("mean")
    stack = ReplyStack("trimmed_mean")  # default trim fraction 0: the plain unweighted mean
    assert stack.rule == "trimmed_mean" and stack.trim_fraction == 0.0
    for arrays in sets(1.0, 2.0, 6.0):
        stack.add(arrays, 1)
    assert w(stack.result()) == 3.0


def test_new_average_follows_the_rule() -> None:
    assert isinstance(new_average(AggregationConfig(rule="mean")), RunningAverage)
    default = new_average(AggregationConfig())
    assert isinstance(default, ConsensusStack) and default.reference is None
    stack = new_average(AggregationConfig(rule="trimmed_mean", trim_fraction=0.25))
    assert isinstance(stack, ReplyStack)
    assert stack.rule == "trimmed_mean" and stack.trim_fraction == 0.25
    median = new_average(AggregationConfig(rule="median"))
    assert isinstance(median, ReplyStack) and median.rule == "median"


def test_a_trimmed_mean_that_trims_nothing_warns(caplog: pytest.LogCaptureFixture) -> None:
    def run(beta: float, m: int) -> list[str]:
        caplog.clear()
        stack = ReplyStack("trimmed_mean", beta)
        for arrays in sets(*range(m)):
            stack.add(arrays, 1)
        with caplog.at_level(logging.WARNING, logger=MODULE_LOG):
            stack.result()
        return [r.getMessage() for r in caplog.records if r.name == MODULE_LOG]

    assert run(0.1, 3) == [
        "trimmed_mean trims nothing: floor(0.1 * 3 replies) = 0; this round is the unweighted mean"
    ]
    assert caplog.records[0].levelno == logging.WARNING
    assert run(0.0, 3) == []  # asked for nothing
    assert run(0.34, 3) == []  # trims one at each end
    assert run(0.25, 4) == []
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=MODULE_LOG), pytest.raises(ValueError):
        ReplyStack("trimmed_mean", 0.1).result()  # no replies: no warning, an error
    assert [r for r in caplog.records if r.name == MODULE_LOG] == []


def test_weighted_average_checks_its_inputs() -> None:
    with pytest.raises(ValueError, match="^nothing to average: no arrays$"):
        weighted_average([], [])
    with pytest.raises(ValueError, match="^2 array sets but 1 weights$"):
        weighted_average(sets(1.0, 2.0), [1])
    for weights in ([1, -1], [0, math.inf], [1, math.nan], [0, 0], [-1, 1], [3, -1], [-1, 3]):
        with pytest.raises(
            ValueError, match=r"^weights must be finite, non-negative and not all zero: \["
        ):
            weighted_average(sets(1.0, 2.0), weights)
    assert w(weighted_average(sets(1.0, 2.0), [0, 2])) == 2.0  # a zero weight among others


# -- norms, the update bound, clipping -------------------------------------------------------


def test_norms_cover_the_floating_arrays_only() -> None:
    x = {"w": np.array([3.0, 0.0]), "v": np.array([0.0], np.float32), "n": np.asarray(7)}
    y = {"w": np.array([6.0, 4.0]), "v": np.array([12.0], np.float32), "n": np.asarray(1000)}
    assert update_norm(y, x) == 13.0  # (3, 4, 12); the integer buffer left out
    assert type(update_norm(y, x)) is float
    assert float(upload_norm(y, x)) == 13.0
    assert float(upload_norm(x)) == 3.0  # ||x||, the counter 7 left out
    assert float(upload_norm(y)) == math.sqrt(36 + 16 + 144)
    # a largest entry of exactly 1 (the norm is scaled by it) and of 0
    assert float(upload_norm({"w": np.array([1.0, 1.0, 1.0, 1.0])})) == 2.0
    assert float(upload_norm({"w": np.zeros(3), "n": np.asarray(5)})) == 0.0
    assert float(upload_norm({"w": np.array([-0.5, 0.0])})) == 0.5
    assert float(upload_norm({"w": np.array([], np.float32)})) == 0.0
    # no floating array at all
    assert float(upload_norm({"n": np.asarray(5)})) == 0.0
    assert update_norm({"n": np.asarray(5)}, {"n": np.asarray(1)}) == 0.0


def test_upload_norms_are_in_extended_precision() -> None:
    """``||(1, 2^-31)|| = sqrt(1 + 2^-62)``, about ``1 + 2^-63``: 1 in float64, not in the
    80-bit np.longdouble the bounds compare in."""
    if np.finfo(np.longdouble).nmant <= np.finfo(np.float64).nmant:
        pytest.skip("np.longdouble is float64 on this platform")
    v = {"w": np.array([1.0, 2.0**-31])}
    assert isinstance(upload_norm(v), np.longdouble)
    assert upload_norm(v) > 1
    assert upload_norm(v, {"w": np.zeros(2)}) > 1


def test_norms_do_not_overflow() -> None:
    y = {"w": np.full(2, 1e308), "v": np.full(3, 1e-30, np.float32)}
    assert update_norm(y, {"w": np.zeros(2), "v": np.zeros(3, np.float32)}) == pytest.approx(
        math.sqrt(2) * 1e308
    )


def test_update_problem_is_an_update_longer_than_factor_times_the_model() -> None:
    x = {"w": np.array([3.0, 4.0]), "n": np.asarray(10**6)}  # ||x|| = 5
    y = {"w": np.array([9.0, 12.0]), "n": np.asarray(0)}  # ||y - x|| = 10
    assert update_problem(y, x, 2.0) is None  # exactly at the bound
    assert update_problem(y, x, None) is None
    assert update_problem(y, x, 1.5) == (
        "arrays: update norm 10 is 2 x the norm 5 of the model the server sent, above "
        "strategy.aggregation.update_bound = 1.5"
    )
    assert update_problem(y, x, 1.999) is not None
    # a reference of norm 1: the bound is the factor itself
    one = {"w": np.array([0.0, 1.0])}
    assert update_problem({"w": np.array([0.0, 3.0])}, one, 2.5) is None
    assert update_problem({"w": np.array([0.0, 4.0])}, one, 2.5).startswith(
        "arrays: update norm 3 "
    )
    # a model of norm 0 gives no scale: never checked
    assert update_problem({"w": np.array([1e30, 0.0])}, {"w": np.zeros(2)}, 1.0) is None


def test_clip_update_scales_a_long_update_to_the_bound_keeping_its_direction() -> None:
    x = {"w": np.array([1.0, 1.0]), "v": np.zeros(1, np.float32), "n": np.asarray(3)}
    y = {"w": np.array([7.0, 9.0]), "v": np.array([24.0], np.float32), "n": np.asarray(8)}
    # y - x = (6, 8, 24), norm 26; clip 13 halves it
    out, did = clip_update(y, x, 13.0)
    assert did is True and set(out) == {"w", "v", "n"}
    np.testing.assert_array_equal(out["w"], [4.0, 5.0])
    np.testing.assert_array_equal(out["v"], [12.0])
    assert out["v"].dtype == np.float32
    assert out["n"] is y["n"]  # integer buffers as received
    assert update_norm(out, x) == 13.0


def test_clip_update_takes_the_global_models_dtype() -> None:
    x = {"w": np.zeros(2, np.float64)}
    y = {"w": np.array([30.0, 40.0], np.float32)}
    out, did = clip_update(y, x, 5.0)
    assert did and out["w"].dtype == np.float64
    np.testing.assert_array_equal(out["w"], [3.0, 4.0])
    out, did = clip_update(y, x, 0.5)  # a bound below 1
    assert did and update_norm(out, x) == pytest.approx(0.5, rel=1e-15)
    np.testing.assert_allclose(out["w"], [0.3, 0.4], rtol=1e-15)


def test_clip_update_keeps_an_update_within_the_bound() -> None:
    x = {"w": np.zeros(2)}
    y = {"w": np.array([3.0, 4.0])}
    for bound in (5.0, 6.0):  # at the bound and above it
        out, did = clip_update(y, x, bound)
        assert did is False and out is not y and out == y and out["w"] is y["w"]
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match=r"^clip_norm must be a finite number > 0, got "):
            clip_update(y, x, bad)


# -- the round-relative upload bound ---------------------------------------------------------


def test_lower_median_is_the_ceil_m_over_2_th_smallest() -> None:
    assert lower_median([5.0]) == 5.0
    assert lower_median([9.0, 1.0]) == 1.0  # of two: the smaller
    assert lower_median([3.0, 1.0, 2.0]) == 2.0
    assert lower_median([4.0, 1.0, 3.0, 2.0]) == 2.0
    assert lower_median([5.0, 4.0, 1.0, 3.0, 2.0]) == 3.0
    assert lower_median([6.0, 5.0, 4.0, 1.0, 3.0, 2.0]) == 3.0
    with pytest.raises(ValueError, match="^the median of no values$"):
        lower_median([])


def test_round_median_gives_each_group_one_vote() -> None:
    norms = [10.0, 10.0, 10.0, 1.0, 2.0, 3.0]
    assert round_median(norms) == 3.0  # sorted 1 2 3 10 10 10
    # client a's three uploads count once (their lower median 10); c's: 2
    assert round_median(norms, ["a", "a", "a", "b", "c", "c"]) == 2.0  # of 10, 1, 2
    assert round_median(norms, ["a", "b", "c", "d", "e", "f"]) == 3.0
    with pytest.raises(ValueError, match="^6 norms but 5 group labels$"):
        round_median(norms, ["a"] * 5)


def test_norm_bound_scales_are_min_of_one_and_bound_over_norm() -> None:
    assert norm_bound_scales([1.0, 2.0, 10.0, 3.0], 2.0) == [1.0, 1.0, 0.4, 1.0]  # bound 2 * 2
    assert norm_bound_scales([1.0, 4.0], 2.0, median=2.0) == [1.0, 1.0]  # at the bound: 1
    assert norm_bound_scales([1.0, 5.0], 2.0, median=2.0) == [1.0, 0.8]
    assert norm_bound_scales([2.0, 8.0], 1.0, median=4.0) == [1.0, 0.5]  # factor 1 allowed
    assert norm_bound_scales([], 2.0) == []
    for s in norm_bound_scales([3.0, 7.0, 1.0], 1.5):
        assert type(s) is float
    for bad in (0.999, 0.0, math.inf, math.nan):
        with pytest.raises(ValueError, match=r"^the bound's factor must be a finite number >= 1"):
            norm_bound_scales([1.0], bad)


def test_scale_upload_scales_the_update_or_the_upload() -> None:
    x = {"w": np.array([1.0, 2.0], np.float32), "n": np.asarray(4)}
    y = {"w": np.array([5.0, 10.0], np.float32), "n": np.asarray(9)}
    out = scale_upload(y, x, 0.25)  # x + (y - x) / 4
    np.testing.assert_array_equal(out["w"], [2.0, 4.0])
    assert out["w"].dtype == np.float32 and out["n"] is y["n"]
    out = scale_upload(y, None, 0.5)  # y / 2
    np.testing.assert_array_equal(out["w"], [2.5, 5.0])
    assert out["w"].dtype == np.float32 and out["n"] is y["n"]


def upload_round() -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
    """A reference and four uploads whose updates have norms 5, 10, 15, 500."""
    x = {"w": np.array([1.0, -1.0]), "n": np.asarray(2)}
    ys = [{"w": x["w"] + k * np.array([3.0, 4.0]), "n": np.asarray(k, np.int64)} for k in (1, 2, 3)]
    ys.append({"w": x["w"] + np.array([300.0, 400.0]), "n": np.asarray(7, np.int64)})
    return x, ys


def test_bound_uploads_brings_an_outlier_down_to_factor_times_the_median() -> None:
    x, ys = upload_round()
    out, bounded = bound_uploads(ys, 2.0, reference=x, clients=["a", "b", "c", "d"])
    # lower median of 5, 10, 15, 500: 10; the bound 20; the last scaled by 20 / 500
    assert bounded == [BoundedUpload(3, "d", 500.0, 10.0, 2.0, 0.04, True)]
    np.testing.assert_allclose(out[3]["w"], [13.0, 15.0], rtol=1e-15)  # x + (12, 16)
    assert update_norm(out[3], x) == pytest.approx(20.0, rel=1e-15)
    assert out[3]["n"] is ys[3]["n"]
    for before, after in zip(ys[:3], out[:3], strict=True):  # within the bound: the same arrays
        assert after is not before and after["w"] is before["w"]
    # default names: the indices; a factor the outlier meets: nothing bounded
    _, bounded = bound_uploads(ys, 2.0, reference=x)
    assert [b.client for b in bounded] == [3]
    out, bounded = bound_uploads(ys, 50.0, reference=x)
    assert bounded == [] and all(o["w"] is y["w"] for o, y in zip(out, ys, strict=True))


def test_bound_uploads_without_a_reference_bounds_the_uploads_themselves() -> None:
    ys = [{"w": np.array([0.0, k])} for k in (1.0, 2.0, 3.0, 40.0)]
    out, bounded = bound_uploads(ys, 3.0)
    assert bounded == [BoundedUpload(3, 3, 40.0, 2.0, 3.0, 0.15, False)]
    np.testing.assert_allclose(out[3]["w"], [0.0, 6.0], rtol=1e-15)


def test_bound_uploads_with_groups_takes_the_median_of_the_groups() -> None:
    ys = [{"w": np.array([k])} for k in (10.0, 10.0, 10.0, 1.0, 2.0, 25.0)]
    # ungrouped: lower median 10, bound 20; grouped: medians 10, 1, 2 -> 2, bound 4
    _, bounded = bound_uploads(ys, 2.0)
    assert [b.index for b in bounded] == [5]
    _, bounded = bound_uploads(ys, 2.0, groups=["a", "a", "a", "b", "c", "c"])
    assert [(b.index, b.median, b.scale) for b in bounded] == [
        (0, 2.0, 0.4),
        (1, 2.0, 0.4),
        (2, 2.0, 0.4),
        (5, 2.0, 0.16),
    ]


def test_bound_uploads_off_or_empty_returns_copies() -> None:
    _, ys = upload_round()
    for factor in (None,):
        out, bounded = bound_uploads(ys, factor)
        assert bounded == [] and out == ys and all(o is not y for o, y in zip(out, ys, strict=True))
    assert bound_uploads([], 2.0) == ([], [])
    with pytest.raises(ValueError, match="^4 uploads but 3 client names$"):
        bound_uploads(ys, 2.0, clients=["a", "b", "c"])


def test_bounded_upload_reports_its_ratio_and_message() -> None:
    b = BoundedUpload(3, "d", 500.0, 10.0, 2.0, 0.04)
    assert b.update is True and b.ratio == 50.0
    assert b.message("generator") == (
        "generator of client d: update norm 500 is 50 x the round's median 10, above "
        "strategy.aggregation.upload_bound = 2; scaled down to 20"
    )
    z = BoundedUpload(0, 7, 3.0, 0.0, 1.5, 0.0, update=False)
    assert z.ratio == math.inf
    assert z.message("prototypes") == (
        "prototypes of client 7: L2 norm 3 is inf x the round's median 0, above "
        "strategy.aggregation.upload_bound = 1.5; scaled down to 0"
    )


def flwr_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The run log's records (the ``flwr_log`` fixture makes Flower's logger propagate)."""
    return [r.getMessage() for r in caplog.records if r.name == "flwr"]


def test_warn_bounded_names_each_client_in_the_run_log(
    flwr_log: pytest.LogCaptureFixture,
) -> None:
    bounded = [
        BoundedUpload(1, "x", 4.0, 1.0, 2.0, 0.5),
        BoundedUpload(2, "y", 8.0, 1.0, 2.0, 0.25),
    ]
    warn_bounded(bounded, "critic")
    assert flwr_warnings(flwr_log) == [b.message("critic") for b in bounded]
    assert all(r.levelno == logging.WARNING for r in flwr_log.records)


def test_bounded_average_is_the_plain_average_bit_for_bit_when_nothing_binds() -> None:
    x, ys = upload_round()
    ys = ys[:3]
    weights = [0.3, 1.7, 2.9]
    for rule in AGGREGATION_RULES:
        config = AggregationConfig(rule=rule, trim_fraction=0.34)
        bounded = BoundedAverage(config, "generator", reference=x)
        plain = new_average(config, x)  # the consensus rule measures against the reference
        for y, n in zip(ys, weights, strict=True):
            bounded.add(y, n)
            plain.add(y, n)
        assert bounded.count == 3
        got, want = bounded.result(), plain.result()
        assert bounded.bounded == []
        for key in want:
            assert got[key].dtype == want[key].dtype
            assert got[key].tobytes() == want[key].tobytes(), (rule, key)


def test_bounded_average_bounds_then_averages(flwr_log: pytest.LogCaptureFixture) -> None:
    x, ys = upload_round()
    avg = BoundedAverage(AggregationConfig(rule="mean", upload_bound=2.0), "generator", reference=x)
    assert avg.config.upload_bound == 2.0 and avg.what == "generator" and avg.reference is x
    assert avg.bounded == [] and avg.count == 0
    for y, n, client in zip(ys, (1, 1, 1, 3), ("a", None, "c", "d"), strict=True):
        avg.add(y, n, client)
    assert avg.clients == ["a", 1, "c", "d"] and avg.weights == [1, 1, 1, 3]
    out = avg.result()
    # updates (3, 4) * (1, 2, 3) and the outlier's scaled to (12, 16) with weight 3: (54, 72) / 6
    np.testing.assert_allclose(out["w"], x["w"] + np.array([9.0, 12.0]), rtol=1e-15)
    assert int(out["n"]) == 4  # (1 + 2 + 3 + 3 * 7) / 6 = 4.5, rounded to even
    assert avg.bounded == [BoundedUpload(3, "d", 500.0, 10.0, 2.0, 0.04, True)]
    assert flwr_warnings(flwr_log) == [avg.bounded[0].message("generator")]
    # the rule applies after the bound; the upload bound off leaves the outlier whole
    median = BoundedAverage(AggregationConfig(rule="median", upload_bound=None), reference=x)
    for y in ys:
        median.add(y, 1)
    np.testing.assert_array_equal(median.result()["w"], x["w"] + [7.5, 10.0])  # of 6, 9
    assert median.bounded == [] and median.what == "upload"
    mean = BoundedAverage(AggregationConfig(rule="mean", upload_bound=None))
    for y in ys:
        mean.add(y, 1)
    assert mean.reference is None
    np.testing.assert_allclose(
        mean.result()["w"], x["w"] + [79.5, 106.0]
    )  # unbounded: (318, 424) / 4


# -- reply checks ----------------------------------------------------------------------------


def test_check_arrays_accepts_real_arrays_of_the_references_shapes_and_dtypes() -> None:
    ref = {
        "a": np.zeros(2, np.float32),
        "i": np.zeros((1, 2), np.int64),
        "u": np.zeros(3, np.uint8),
    }
    got = {
        "a": np.array([1.0, -2.0], np.float32),
        "i": np.ones((1, 2), np.int64),
        "u": np.ones(3, np.uint8),
    }
    assert check_arrays(got, ref) is None


def test_check_arrays_says_why_not() -> None:
    ref = {"a": np.zeros(2, np.float32), "b": np.zeros(1, np.int64)}
    good = {"a": np.zeros(2, np.float32), "b": np.zeros(1, np.int64)}

    def why(**changes: np.ndarray | None) -> str | None:
        got = {**good, **changes}
        return check_arrays({k: v for k, v in got.items() if v is not None}, ref)

    assert why(b=None) == "arrays: keys differ from the global model (missing ['b'], extra [])"
    extra = {k: np.zeros(1) for k in "zyxw"}
    assert check_arrays({**good, **extra}, ref) == (
        "arrays: keys differ from the global model (missing [], extra ['w', 'x', 'y'])"
    )
    assert check_arrays({}, {k: np.zeros(1) for k in "dcba"}) == (
        "arrays: keys differ from the global model (missing ['a', 'b', 'c'], extra [])"
    )
    assert why(a=np.zeros(3, np.float32)) == "arrays: 'a' has shape (3,), expected (2,)"
    assert why(a=np.zeros(2, np.complex64)) == "arrays: 'a' has dtype complex64, not real numbers"
    assert why(b=np.zeros(1, bool)) == "arrays: 'b' has dtype bool, not real numbers"
    assert why(a=np.zeros(2, np.float64)) == "arrays: 'a' has dtype float64, expected float32"
    assert why(b=np.zeros(1, np.int32)) == "arrays: 'b' has dtype int32, expected int64"
    for bad in (math.nan, math.inf, -math.inf):
        assert why(a=np.array([0.0, bad], np.float32)) == "arrays: 'a' holds non-finite values"
    assert check_arrays({"a": np.zeros(3, np.float32)}, ref, "generator", "the server's") == (
        "generator: keys differ from the server's (missing ['b'], extra [])"
    )
    assert check_arrays({**good, "a": np.zeros(1, np.float32)}, ref, "critic") == (
        "critic: 'a' has shape (1,), expected (2,)"
    )


def test_a_fraction_just_below_a_half_leaves_a_value_to_average() -> None:
    """``1e-9`` guards the floor against ``0.3 * 10 = 2.9999...``, but for a ``beta`` the
    configuration accepts just below 0.5 it made ``b = m / 2`` of an even ``m``: every value
    trimmed, a NaN model ("Mean of empty slice"). At most ``(m - 1) // 2`` go at each end."""
    assert trim_count(2, 0.4999999999) == 0  # floor(0.9999999998)
    assert trim_count(1000, 0.4999999999999) == 499
    assert trim_count(3, 0.4999999999) == 1
    assert trim_count(1, 0.4999999999) == 0
    out = trimmed_mean(sets(1.0, 3.0), 0.4999999999)
    assert w(out) == 2.0
    out = trimmed_mean(sets(*range(1000)), 0.4999999999999)
    assert w(out) == 499.5  # the two middle values


# -- the weighted rules (FedDisco's p_k) -----------------------------------------------------
def test_weighted_median_by_hand() -> None:
    """Values 1, 2, 10 with weights 0.2, 0.3, 0.5: cumulative 0.2, 0.5, 1.0 reaches half
    (0.5) exactly at 2, so the median is (2 + 10) / 2 = 6; with weights 0.2, 0.2, 0.6 the
    client holding more than half sets it alone (10); with 0.4, 0.4, 0.2 it is 2."""
    a = [{"w": np.array([v], dtype=np.float32)} for v in (10.0, 1.0, 2.0)]  # any order
    assert weighted_median(a, [0.5, 0.2, 0.3])["w"][0] == 6.0
    assert weighted_median(a, [0.6, 0.2, 0.2])["w"][0] == 10.0
    assert weighted_median(a, [0.2, 0.4, 0.4])["w"][0] == 2.0
    assert weighted_median(a, [0.2, 0.4, 0.4])["w"].dtype == np.float32
    # equal weights: numpy's median, for odd and even counts, coordinate by coordinate
    b = [{"w": np.array([[v, -v]])} for v in (3.0, 1.0, 7.0, 4.0)]
    np.testing.assert_array_equal(weighted_median(b, [2] * 4)["w"], coordinate_median(b)["w"])
    np.testing.assert_array_equal(
        weighted_median(b[:3], [1] * 3)["w"], coordinate_median(b[:3])["w"]
    )


def test_weighted_trimmed_mean_by_hand() -> None:
    """Values 1, 2, 10, 20 with weights 0.1, 0.3, 0.5, 0.1, beta 0.25: floor(0.25 * 4) = 1 value
    cut at each end by count (1 and 20), the rest by weight: (2 * 0.3 + 10 * 0.5) / 0.8 = 7.
    Zero weights have no say (left out before the count); equal weights are the unweighted
    trimmed mean."""
    a = [{"w": np.array([v])} for v in (1.0, 2.0, 10.0, 20.0, 1e9)]
    assert weighted_trimmed_mean(a, [0.1, 0.3, 0.5, 0.1, 0.0], 0.25)["w"][0] == pytest.approx(7.0)
    assert weighted_trimmed_mean(a[:3], [0.2, 0.3, 0.5], 0.0)["w"][0] == pytest.approx(
        0.2 + 0.6 + 5.0
    )
    b = [{"w": np.array([v, 2 * v])} for v in (3.0, 1.0, 7.0, 4.0)]
    np.testing.assert_allclose(
        weighted_trimmed_mean(b, [1] * 4, 0.25)["w"], trimmed_mean(b, 0.25)["w"]
    )


def test_a_heavy_client_at_an_extreme_is_cut_whatever_its_weight() -> None:
    """One client of 5 with weight 0.4 (above beta = 0.2) sending 1e6: cut by count, the mean
    is the weighted mean of the 3 middle honest values; a cut by weight would keep 0.2 of its
    weight at 1e6."""
    vals = (1.0, 2.0, 3.0, 4.0, 1e6)
    a = [{"w": np.array([v])} for v in vals]
    got = weighted_trimmed_mean(a, [0.15, 0.15, 0.15, 0.15, 0.4], 0.2)["w"][0]
    assert got == pytest.approx(3.0)


def test_weighted_rules_check_their_inputs() -> None:
    a = [{"w": np.array([1.0])}, {"w": np.array([2.0])}]
    for bad in ([1.0], [-1.0, 1.0], [float("nan"), 1.0], [0.0, 0.0]):
        with pytest.raises(ValueError):
            weighted_median(a, bad)
    with pytest.raises(ValueError, match="trim_fraction"):
        weighted_trimmed_mean(a, [1.0, 1.0], 0.5)


def test_a_weighted_reply_stack_takes_the_weights() -> None:
    a = [{"w": np.array([v])} for v in (1.0, 2.0, 10.0)]
    stack = new_weighted_average(AggregationConfig(rule="median"))
    assert isinstance(new_weighted_average(AggregationConfig(rule="mean")), RunningAverage)
    plain = new_average(AggregationConfig(rule="median"))
    for arrays, w in zip(a, (0.2, 0.2, 0.6), strict=True):
        stack.add(arrays, w)
        plain.add(arrays, w)
    assert stack.result()["w"][0] == 10.0 and plain.result()["w"][0] == 2.0


def test_weighted_option_weighs_the_kept_replies_by_n_k() -> None:
    """strategy.aggregation.weighted: the trimmed mean cuts one reply at each end by count,
    then weighs the rest by n_k; unweighted, the same kept values average plainly."""
    from fedgo_flwr.learning.aggregation import AggregationConfig
    from fedgo_flwr.learning.clipping import round_average

    values, sizes = [0.0, 1.0, 2.0, 4.0, 100.0], [1.0, 3.0, 1.0, 1.0, 50.0]
    results = {}
    for weighted in (False, True):
        cfg = AggregationConfig(rule="trimmed_mean", trim_fraction=0.2, weighted=weighted)
        average = round_average(cfg, {"w": np.zeros(1, dtype=np.float32)})
        for v, n in zip(values, sizes, strict=True):
            average.add({"w": np.array([v], dtype=np.float32)}, n)
        results[weighted] = float(average.result()["w"][0])
    assert results[False] == pytest.approx((1 + 2 + 4) / 3)
    assert results[True] == pytest.approx((3 * 1 + 1 * 2 + 1 * 4) / 5)  # 100 (n=50) cut
