"""The streaming mean with updates clipped relative to the round (fedgo_flwr.learning.clipping).

Hand computations of ``tau = c * lower_median_k ||y_k - x||``, ``y_k' = x + (y_k - x) min(1,
tau / ||y_k - x||)`` and the n_k-weighted mean of the ``y_k'``; the streaming version must give
the same as clipping first, whatever the order of the replies, and FedAvg's mean bit for bit
when nothing exceeds the bound.
"""

from __future__ import annotations

import itertools
import logging

import numpy as np
import pytest

from fedgo_flwr.learning.aggregation import AggregationConfig, ReplyStack, RunningAverage
from fedgo_flwr.learning.clipping import ClippedMean, array_outliers, round_average
from fedgo_flwr.learning.consensus import ConsensusStack


def model(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "w": rng.normal(size=(3, 4)).astype(np.float32),
        "b": rng.normal(size=4).astype(np.float32),
        "count": np.array(7, dtype=np.int64),  # an integer buffer: never clipped
    }


def update(x, rng, scale):
    return {
        k: (v + scale * rng.normal(size=v.shape)).astype(v.dtype) if v.dtype.kind == "f" else v
        for k, v in x.items()
    }


def norm(y, x):
    return float(
        np.sqrt(
            sum(np.sum((y[k].astype(np.float64) - x[k]) ** 2) for k in x if x[k].dtype.kind == "f")
        )
    )


def by_hand(x, ys, weights, factor, keep=None):
    """Clip each update to factor x the lower median norm (or, with more than ``keep`` above
    it, to the (keep+1)-th largest norm), then the weighted mean in float64."""
    norms = [norm(y, x) for y in ys]
    median = sorted(norms)[(len(norms) - 1) // 2]
    bound = factor * median
    ranked = sorted(norms, reverse=True)
    if keep is not None and sum(n > bound for n in norms) > keep:
        bound = ranked[keep]
    out = {}
    total = sum(weights)
    for k in x:
        if x[k].dtype.kind != "f":
            continue
        acc = np.zeros(x[k].shape)
        for y, n, w in zip(ys, norms, weights, strict=True):
            s = min(1.0, bound / n) if n > 0 else 1.0
            acc += w * (x[k] + s * (y[k].astype(np.float64) - x[k]))
        out[k] = acc / total
    return out


def test_no_update_above_the_bound_gives_fedavg_bit_for_bit():
    rng = np.random.default_rng(0)
    x = model(rng)
    ys = [update(x, rng, 0.1) for _ in range(5)]
    weights = [3, 10, 7, 1, 4]
    plain, clipped = RunningAverage(), ClippedMean(x, 10.0, 3)
    for pid, (y, w) in enumerate(zip(ys, weights, strict=True)):
        plain.add(y, w)
        clipped.add(y, w, pid)
    got, want = clipped.result(), plain.result()
    assert clipped.clipped == []
    for k in want:
        assert got[k].dtype == want[k].dtype
        assert np.array_equal(got[k], want[k])


def test_one_large_update_is_clipped_to_factor_times_the_lower_median(caplog):
    rng = np.random.default_rng(1)
    x = model(rng)
    ys = [update(x, rng, 0.1) for _ in range(4)] + [update(x, rng, 50.0)]
    weights = [5, 5, 5, 5, 5]
    avg = ClippedMean(x, 3.0, 2, "Round 7")
    with caplog.at_level(logging.WARNING, logger="flwr"):
        for pid, (y, w) in enumerate(zip(ys, weights, strict=True)):
            avg.add(y, w, pid)
        got = avg.result()
    want = by_hand(x, ys, weights, 3.0)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)
    assert got["count"] == 7
    [c] = avg.clipped
    assert c.client == 4
    assert c.bound == pytest.approx(3.0 * sorted(norm(y, x) for y in ys)[2])
    assert any(
        "Round 7" in m and "client 4" in m and "clip_factor = 3" in m for m in caplog.messages
    )
    ratio, client = avg.ratio_max()
    assert client == 4 and ratio > 100


def test_the_result_does_not_depend_on_the_order_of_the_replies():
    rng = np.random.default_rng(2)
    x = model(rng)
    ys = [update(x, rng, s) for s in (0.1, 0.2, 30.0, 0.15, 20.0)]
    weights = [1, 2, 3, 4, 5]
    results = []
    for order in itertools.permutations(range(5)):
        avg = ClippedMean(x, 2.0, 2)
        for i in order:
            avg.add(ys[i], weights[i], i)
        results.append(avg.result())
    want = by_hand(x, ys, weights, 2.0)
    for got in results:
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)
            np.testing.assert_array_equal(got[k], results[0][k])


def test_more_outliers_than_kept_raise_the_bound_to_the_next_largest_norm(caplog):
    rng = np.random.default_rng(3)
    x = model(rng)
    ys = [update(x, rng, s) for s in (0.1, 0.1, 0.1, 5.0, 8.0, 11.0, 0.1)]
    weights = [1.0] * 7
    avg = ClippedMean(x, 2.0, 2)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        for pid, y in enumerate(ys):
            avg.add(y, 1.0, pid)
        got = avg.result()
    want = by_hand(x, ys, weights, 2.0, keep=2)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)
    assert sorted(c.client for c in avg.clipped) == [4, 5]
    assert any("more than clip_keep = 2" in m for m in caplog.messages)


def test_no_factor_is_the_plain_mean_and_still_measures_the_norms():
    rng = np.random.default_rng(4)
    x = model(rng)
    ys = [update(x, rng, s) for s in (0.1, 100.0)]
    avg, plain = ClippedMean(x, None, 3), RunningAverage()
    for pid, y in enumerate(ys):
        avg.add(y, 2.0, pid)
        plain.add(y, 2.0)
    got, want = avg.result(), plain.result()
    for k in want:
        assert np.array_equal(got[k], want[k])
    assert avg.clipped == []
    assert avg.ratio_max()[1] == 1


def test_two_replies_one_attacker_cannot_set_the_median():
    """The lower median of two norms is the smaller: an attacker paired with one honest client
    is clipped to factor x the honest norm."""
    rng = np.random.default_rng(5)
    x = model(rng)
    honest, attacker = update(x, rng, 0.1), update(x, rng, 1000.0)
    avg = ClippedMean(x, 4.0, 1)
    avg.add(honest, 1.0, 0)
    avg.add(attacker, 1.0, 1)
    got = avg.result()
    moved = norm({k: got[k] for k in x}, x)
    assert moved <= (1 + 4.0) * norm(honest, x) / 2 + 1e-6


def test_round_average_picks_the_accumulator_of_the_rule():
    x = {"w": np.ones(3, dtype=np.float32)}
    mean = AggregationConfig(rule="mean")
    assert isinstance(round_average(mean, x), ClippedMean)
    assert type(round_average(mean, None)) is RunningAverage
    default = round_average(AggregationConfig(), x)  # the default rule: consensus
    assert isinstance(default, ConsensusStack) and default.reference is x
    assert default.clip_factor == AggregationConfig().consensus_clip == 2.0
    assert isinstance(round_average(AggregationConfig(rule="median"), x), ReplyStack)


@pytest.mark.parametrize("factor", [0.5, float("nan"), float("inf")])
def test_a_factor_below_one_or_not_finite_is_refused(factor):
    with pytest.raises(ValueError, match="clip factor"):
        ClippedMean({"w": np.ones(2, dtype=np.float32)}, factor, 3)


def test_array_outliers_name_the_models_with_an_array_beyond_the_rounds_median_by_hand():
    """Per array: the bound is factor x the lower median of the updates' norms; a model with
    an array beyond it is named with its largest ratio and that array."""
    x = {
        "w": np.zeros(2, np.float32),
        "b": np.zeros(1, np.float32),
        "z": np.zeros(1, np.float32),
        "n": np.array(3, np.int64),
    }
    ws = [(1.0, 0.0), (0.0, 2.0), (2.0, 0.0), (0.0, 1.0)]  # norms 1, 2, 2, 1: lower median 1
    bs = [0.1, 0.2, 0.1, 50.0]  # lower median 0.1: 50 is 500 x it
    zs = [0.0, 0.0, 0.0, 0.0]
    models = [
        {
            "w": np.array(w, np.float32),
            "b": np.array([b], np.float32),
            "z": np.array([z], np.float32),
            "n": np.array(9 * i, np.int64),  # not floating: never compared
        }
        for i, (w, b, z) in enumerate(zip(ws, bs, zs, strict=True))
    ]
    (o,) = array_outliers(models, x, 3.0)
    assert (o.index, o.key) == (3, "b") and o.ratio == pytest.approx(500.0, rel=1e-6)
    assert array_outliers(models, x, 600.0) == []  # 500 x is within 600 x
    # w: the norms 2 are 2 x the lower median 1 (the upper median, 2, would pass them)
    named = {o.index: (o.key, o.ratio) for o in array_outliers(models, x, 1.5)}
    assert named[2] == ("w", pytest.approx(2.0)) and named[3][0] == "b" and 0 not in named
    models[0]["z"] = np.array([0.5], np.float32)  # one model moves z: the median is 0
    (o, b) = array_outliers(models, x, 3.0)
    assert (o.index, o.key, o.ratio) == (0, "z", float("inf")) and b.index == 3
    assert array_outliers(models[:1], x, 3.0) == []  # one model: no round to compare with
    assert array_outliers(models[2:], x, 3.0) == []  # two: either sets the lower median
