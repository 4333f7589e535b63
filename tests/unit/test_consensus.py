"""The consensus rule by hand (fedgo_flwr/learning/consensus.py): FLTrust's trust-weighted
combination (Cao et al., NDSS 2021, Eq. 3-5) per array, with the round's coordinate-wise median
update as the reference, trust relative to half the round's median cosine, each array's update
clipped to a multiple of the round's lower median norm of that array, the strategy's weights
kept."""

from __future__ import annotations

import numpy as np
import pytest

from fedgo_flwr.config.schema import Checker, ConfigError
from fedgo_flwr.learning.aggregation import AggregationConfig, new_average
from fedgo_flwr.learning.clipping import round_average
from fedgo_flwr.learning.consensus import (
    TRUST_FRACTION,
    ConsensusStack,
    _combine,
    clip_radial,
    consensus_mean,
)
from strategies._aggregation import update_norms

X = {"w": np.zeros(2, np.float32), "n": np.array(0, np.int64)}


def combine(*args, **kwargs):
    out, scores = consensus_mean(*args, **kwargs)
    return out, scores.trust


def _model(w, n=0):
    return {"w": np.asarray(w, np.float32), "n": np.array(n, np.int64)}


def test_hand_computation_drops_the_flipped_update_and_clips_nothing_honest():
    # clip 1: d = [2,0], [1,1], [-4,0]; med = [1,0]; norms 2, 1.414, 4 -> lower median 2;
    # cos 1, 0.7071, -1 -> lower median 0.7071 -> trust 1, 1, 0; weights 1, 1, 2:
    # x' = (1*[2,0] + 1*[1,1]) / 2 = [1.5, 0.5]; the counter: (10 + 20 + 2*40) / 4 = 27.5 -> 28
    models = [_model([2, 0], 10), _model([1, 1], 20), _model([-4, 0], 40)]
    out, trust = combine(models, [1.0, 1.0, 2.0], X, clip_factor=1.0)
    np.testing.assert_allclose(trust, [1.0, 1.0, 0.0])
    np.testing.assert_allclose(out["w"], [1.5, 0.5], rtol=1e-6)
    assert out["w"].dtype == np.float32
    assert out["n"] == 28 and out["n"].dtype == np.int64


def test_updates_longer_than_the_median_norm_are_clipped_to_it():
    # d = [3,0], [1,0], [2,0]: all along med = [2,0], trust 1; lower median norm 2, so at
    # clip 1 [3,0] becomes [2,0]: x' = ([2,0] + [1,0] + [2,0]) / 3; at 1.25 it becomes [2.5,0];
    # at 2 (the default) and without a clip nothing changes
    models = [_model([3, 0]), _model([1, 0]), _model([2, 0])]
    for clip, first in ((1.0, 2.0), (1.25, 2.5), (2.0, 3.0), (None, 3.0)):
        out, trust = combine(models, [1.0, 1.0, 1.0], X, clip_factor=clip)
        np.testing.assert_allclose(trust, 1.0)
        np.testing.assert_allclose(out["w"], [(first + 3) / 3, 0], rtol=1e-6)


def test_trust_below_half_the_median_cosine_is_proportional():
    # med of [1,0], [1,0], [1,0.2], [0,1] is [1, 0.1]; cosines 1/|med| (twice), 1.02/(1.0198
    # |med|) and 0.1/|med|; the lower median is 1/|med|, so the last client's trust is
    # (0.1/|med|) / (TRUST_FRACTION * 1/|med|) = 0.2 and the others' 1
    assert TRUST_FRACTION == 0.5
    models = [_model([1, 0]), _model([1, 0]), _model([1, 0.2]), _model([0, 1])]
    _, trust = combine(models, [1.0] * 4, X)
    np.testing.assert_allclose(trust, [1, 1, 1, 0.2], rtol=1e-6)


def test_a_reference_shifts_the_updates_and_the_result():
    ref = {"w": np.array([10, -10], np.float32), "n": np.array(0, np.int64)}
    models = [_model([12, -10]), _model([11, -9]), _model([6, -10])]
    out, trust = combine(models, [1.0, 1.0, 2.0], ref, clip_factor=1.0)
    np.testing.assert_allclose(trust, [1.0, 1.0, 0.0])
    np.testing.assert_allclose(out["w"], [11.5, -9.5], rtol=1e-6)


def test_a_bias_on_one_coordinate_weighs_nothing():
    honest = [_model([1.0, 0.9]), _model([0.9, 1.0]), _model([1.1, 1.0]), _model([1.0, 1.1])]
    attacker = {"w": np.array([0.0, 0.0], np.float32), "n": np.array(0, np.int64)}
    x3 = {"w": np.zeros(3, np.float32), "n": np.array(0, np.int64)}
    models = [{"w": np.append(m["w"], 0.0).astype(np.float32), "n": m["n"]} for m in honest]
    models.append({"w": np.append(attacker["w"], 50.0).astype(np.float32), "n": attacker["n"]})
    out, trust = combine(models, [1.0] * 5, x3)
    assert trust[-1] == 0.0
    np.testing.assert_allclose(out["w"], [1.0, 1.0, 0.0], rtol=1e-6)


def test_each_array_is_weighed_and_clipped_on_its_own():
    # two arrays: "w" (3 clients agree: [1,0], [1,0], [1,0]) and "b" (updates 0.1, 0.2 and the
    # third client's 5.0, all along the median 0.2: trust 1 in both arrays). The third client's
    # "b" is clipped to 2 x the lower median of |b| (0.2) = 0.4, its "w" is untouched: the
    # whole-model norm would not have clipped it (sqrt(1 + 25) against a median of 1.02).
    ref = {"w": np.zeros(2, np.float32), "b": np.zeros(1, np.float32)}
    models = [
        {"w": np.array([1, 0], np.float32), "b": np.array([b], np.float32)} for b in (0.1, 0.2, 5.0)
    ]
    out, trust = combine(models, [1.0, 1.0, 1.0], ref, clip_factor=2.0)
    np.testing.assert_allclose(trust, 1.0)
    np.testing.assert_allclose(out["w"], [1.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(out["b"], [(0.1 + 0.2 + 0.4) / 3], rtol=1e-6)
    # a client flipped in one array only loses its trust there: trust 0 in "b", 1 in "w"
    models[2] = {"w": np.array([1, 0], np.float32), "b": np.array([-5.0], np.float32)}
    out, trust = combine(models, [1.0, 1.0, 1.0], ref, clip_factor=2.0)
    np.testing.assert_allclose(trust, [1.0, 1.0, 0.5])  # the mean of its arrays' scores
    np.testing.assert_allclose(out["b"], [0.15], rtol=1e-6)


def test_identical_updates_give_that_update():
    models = [_model([0.5, -0.25])] * 4
    out, trust = combine(models, [1.0, 2.0, 3.0, 4.0], X)
    np.testing.assert_allclose(trust, 1.0)
    np.testing.assert_allclose(out["w"], [0.5, -0.25])


def test_no_positive_trust_takes_the_median_update():
    # med of [1,0], [-1,0], [0,0] is [0,0]: every cosine is 0, so the median update (no move)
    models = [_model([1, 0]), _model([-1, 0]), _model([0, 0])]
    out, trust = combine(models, [1.0] * 3, X)
    np.testing.assert_allclose(trust, 0.0)
    np.testing.assert_allclose(out["w"], [0.0, 0.0])


@pytest.mark.parametrize(
    "weights, models, match",
    [
        ([1.0], [], "nothing to aggregate"),
        ([1.0], [_model([1, 0]), _model([0, 1])], "2 models but 1 weights"),
        ([0.0, 0.0], [_model([1, 0]), _model([0, 1])], "not all 0"),
        ([1.0, float("nan")], [_model([1, 0]), _model([0, 1])], "finite"),
    ],
)
def test_bad_input_is_a_clear_error(weights, models, match):
    with pytest.raises(ValueError, match=match):
        consensus_mean(models, weights, X)


def test_the_rule_is_a_config_choice_and_records_the_least_trusted_client():
    cfg = AggregationConfig(rule="consensus", consensus_clip=1.0)
    cfg.check(Checker(prefix="strategy.aggregation.", obj=cfg))  # raises if not a choice
    for bad in (0.5, float("inf")):
        with pytest.raises(ConfigError, match="consensus_clip"):
            wrong = AggregationConfig(rule="consensus", consensus_clip=bad)
            wrong.check(Checker(prefix="strategy.aggregation.", obj=wrong))
    acc = round_average(cfg, X, "Round 1")
    assert isinstance(acc, ConsensusStack)
    for pid, w in ((7, [2, 0]), (8, [1, 1]), (9, [-4, 0])):
        acc.add(_model(w), 1.0, pid)
    np.testing.assert_allclose(acc.result()["w"], [1.5, 0.5], rtol=1e-6)
    assert acc.trust == {7: 1.0, 8: 1.0, 9: 0.0}
    figures = update_norms(acc)
    assert figures["consensus_trust_min"] == 0.0
    assert figures["consensus_trust_client"] == 9
    assert figures["consensus_distrusted"] == 1
    # the other uploads (no reference: already updates) take the same rule
    assert isinstance(new_average(cfg), ConsensusStack)


def test_the_result_does_not_depend_on_the_order_the_replies_came_in():
    """A deployment's replies arrive in the network's order: the same replies in another order
    give the same bits, model and trust (the rule runs over them in their clients' order; in
    arrival order, ``d @ median`` rounded one client's cosine differently in one of these
    draws: a trust 2e-16 apart, which a deployed run and its in-process replay then showed)."""
    rng = np.random.default_rng(1)
    for _ in range(30):
        n, size = int(rng.integers(3, 9)), int(rng.integers(5, 3000))
        x = {
            "w": rng.normal(size=size).astype(np.float32),
            "b": rng.normal(size=7).astype(np.float32),
        }
        models = [
            {
                k: (v + rng.normal(scale=rng.uniform(0.001, 1), size=v.shape)).astype(np.float32)
                for k, v in x.items()
            }
            for _ in range(n)
        ]
        weights = list(rng.uniform(1, 5, size=n))
        results = []
        for order in (list(range(n)), list(rng.permutation(n))):
            stack = ConsensusStack(x, 2.0)
            for i in order:
                stack.add(models[i], weights[i], int(i))
            results.append((stack.result(), stack.trust))
        (a, trust_a), (b, trust_b) = results
        assert trust_a == trust_b
        assert all(np.array_equal(a[k], b[k]) for k in a)


def test_the_radial_part_is_clipped_to_the_rounds_lower_median_by_hand():
    # base [3, 4]: unit u = [0.6, 0.8]; rows d = t + r u with t = [0.8, -0.6] (orthogonal to u)
    # and r = 0.1, -0.2, 0.3 and a scaled model's -10 base (r = -50); |r| lower median 0.2, so at
    # clip 2 the bound is 0.4: only the scaled row changes, to -0.4 u; its norm falls from 50
    base = np.array([3.0, 4.0])
    u, t = base / 5.0, np.array([0.8, -0.6])
    d = np.stack([t + 0.1 * u, t - 0.2 * u, t + 0.3 * u, -10 * base])
    out, hit = clip_radial(d, base, 2.0)
    np.testing.assert_allclose(out[:3], d[:3])
    np.testing.assert_allclose(out[3], -0.4 * u, atol=1e-12)
    assert hit.tolist() == [False, False, False, True]
    # at clip 1 the bound is 0.2: the 0.3 row keeps its tangent and loses 0.1 of its radial part
    out, hit = clip_radial(d, base, 1.0)
    np.testing.assert_allclose(out[2], t + 0.2 * u, atol=1e-12)
    assert hit.tolist() == [False, False, True, True]
    # an array at 0 has no radial part; no clip factor clips nothing
    for b, clip in ((np.zeros(2), 2.0), (base, None)):
        same, hit = clip_radial(d, b, clip)
        np.testing.assert_array_equal(same, d)
        assert not hit.any()


def test_a_scaled_model_moves_the_models_length_by_at_most_the_radial_bound():
    # four honest updates orthogonal to x but for radial parts of +-0.01 and +-0.02, and a
    # scaled model y = x - 48 x (the freeze attack under update_bound): |r| lower median 0.02,
    # so at the default radial_clip 8 the bound is 0.16; the average's radial step is a mean
    # of parts within it, whatever the trust. Without the radial clip the scaled model,
    # clipped to twice the lower median norm only, is trusted in full and shrinks the model by
    # about its share of 2 typical updates (asserted below).
    rng = np.random.default_rng(0)
    x = rng.normal(size=50)
    u = x / np.linalg.norm(x)
    honest = []
    for r in (-0.02, -0.01, 0.01, 0.02):
        t = rng.normal(size=50) + 0.5  # the clients agree on a common direction
        t -= (t @ u) * u
        honest.append(x + t / np.linalg.norm(t) + r * u)
    models = [{"w": y} for y in [*honest, x - 48 * x]]
    out, scores = consensus_mean(models, [1.0] * 5, {"w": x})
    step = float((out["w"] - x) @ u)
    assert abs(step) <= 8 * 0.02 + 1e-9
    assert scores.clipped.tolist() == [False, False, False, False, True]
    out, _ = consensus_mean(models, [1.0] * 5, {"w": x}, radial_clip=2.0)
    assert abs(float((out["w"] - x) @ u)) <= 2 * 0.02 + 1e-9
    d = np.stack([m["w"] - x for m in models])
    unclipped, trust, _ = _combine(d, np.ones(5), 2.0)
    assert trust[-1] == 1.0 and unclipped @ u < -0.3  # what the radial clip takes away
