"""Tests for :mod:`fedgo_flwr.weighting` (per-sample ensemble weights, FedGO Alg. 1-2, Eq. (9)).

The last test is an end-to-end check on the four-Gaussian toy of FedGO App. E.1 (Fig. 1/4).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from fedgo_flwr.weighting import (
    BYZANTINE_LOGIT,
    DISC_MODES,
    WEIGHTING_METHODS,
    WEIGHTING_NAMES,
    WeightingInputs,
    byzantine_clients,
    cap_mean_shares,
    compute_weights,
    discriminator_odds,
    discriminator_probability,
    ensemble_logits,
    get_weighting,
    log_discriminator_odds,
    make_byzantine,
    mean_share_caps,
    pseudo_labels,
)

SEEDS = (0, 1, 2)
TEACHER_COUNTS = (1, 3, 8)

# (method name, params) pairs covering every method and both discriminator modes.
METHOD_CASES: tuple[tuple[str, dict[str, object]], ...] = (
    ("uniform", {}),
    ("data_size", {}),
    ("variance", {}),
    ("entropy", {}),
    ("entropy", {"temperature": 0.1}),
    ("domain", {}),
    ("domain", {"disc_mode": "double_sigmoid"}),
    ("fedgo", {}),
    ("fedgo", {"disc_mode": "sigmoid"}),
    ("oracle", {}),
)


def random_inputs(
    seed: int, k: int, n: int = 17, c: int = 5, logit_scale: float = 3.0, disc_scale: float = 4.0
) -> WeightingInputs:
    """Random but fully specified inputs (every optional field present)."""
    g = torch.Generator().manual_seed(seed)
    return WeightingInputs(
        logits=logit_scale * torch.randn(k, n, c, generator=g),
        num_examples=torch.randint(1, 500, (k,), generator=g),
        disc_logits=disc_scale * torch.randn(k, n, generator=g),
        labels=torch.randint(0, c, (n,), generator=g),
        class_counts=torch.randint(0, 30, (k, c), generator=g),
    )


def assert_distribution(w: Tensor, k: int, n: int) -> None:
    """``w`` is a finite, non-negative float32 ``(K, N)`` tensor whose columns sum to 1."""
    assert w.shape == (k, n)
    assert w.dtype == torch.float32
    assert bool(torch.isfinite(w).all())
    assert bool((w >= 0).all())
    torch.testing.assert_close(w.sum(0), torch.ones(n), atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------
# Generic invariants
# ------------------------------------------------------------------------------------------


def test_registry_matches_names() -> None:
    assert tuple(WEIGHTING_METHODS) == WEIGHTING_NAMES
    for name in WEIGHTING_NAMES:
        assert get_weighting(name).name == name
    covered = {name for name, _ in METHOD_CASES}
    assert covered == set(WEIGHTING_NAMES)


@pytest.mark.parametrize("k", TEACHER_COUNTS)
@pytest.mark.parametrize(("name", "params"), METHOD_CASES)
def test_weights_are_per_sample_distributions(name: str, params: dict[str, object], k: int) -> None:
    for seed in SEEDS:
        inputs = random_inputs(seed, k)
        w = compute_weights(name, inputs, **params)
        assert_distribution(w, k, inputs.num_samples)
        if k == 1:
            assert bool((w == 1).all())


@pytest.mark.parametrize(("name", "params"), METHOD_CASES)
def test_extreme_inputs_stay_finite(name: str, params: dict[str, object]) -> None:
    inputs = random_inputs(7, 6, logit_scale=1e4, disc_scale=1e4)
    assert_distribution(compute_weights(name, inputs, **params), 6, inputs.num_samples)


@pytest.mark.parametrize(("name", "params"), METHOD_CASES)
def test_empty_sample_set(name: str, params: dict[str, object]) -> None:
    inputs = random_inputs(0, 3, n=0)
    assert compute_weights(name, inputs, **params).shape == (3, 0)


def test_weights_follow_logits_device_and_accept_lists() -> None:
    inputs = WeightingInputs(
        logits=torch.zeros(2, 4, 3, dtype=torch.float64),
        num_examples=[1, 3],  # type: ignore[arg-type]
        disc_logits=[[0.0] * 4, [1.0] * 4],  # type: ignore[arg-type]
    )
    w = compute_weights("fedgo", inputs, disc_mode="sigmoid")
    assert w.dtype == torch.float32 and w.device == inputs.logits.device
    expected = torch.tensor([1.0, 3.0 * math.e]) / (1.0 + 3.0 * math.e)
    torch.testing.assert_close(w[:, 0], expected.float())


# ------------------------------------------------------------------------------------------
# FedGO (Thm 3.6, Eq. (9); App. E.2 double sigmoid)
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", DISC_MODES)
@pytest.mark.parametrize("k", TEACHER_COUNTS)
def test_fedgo_identical_discriminators_equal_data_size(mode: str, k: int) -> None:
    for seed in SEEDS:
        base = random_inputs(seed, k)
        same_row = base.disc_logits[:1].expand(k, -1)  # type: ignore[index]
        inputs = WeightingInputs(base.logits, base.num_examples, disc_logits=same_row)
        w_fedgo = compute_weights("fedgo", inputs, disc_mode=mode)
        w_size = compute_weights("data_size", inputs)
        assert torch.equal(w_fedgo, w_size)
        # ...so FedGO's pseudo-labels reduce to n_k-weighted FedDF (AVGLOGITS).
        assert torch.equal(
            pseudo_labels(inputs.logits, w_fedgo), pseudo_labels(inputs.logits, w_size)
        )


@pytest.mark.parametrize("mode", DISC_MODES)
@pytest.mark.parametrize("k", TEACHER_COUNTS)
def test_fedgo_equal_sizes_identical_discriminators_is_uniform(mode: str, k: int) -> None:
    g = torch.Generator().manual_seed(k)
    row = 50.0 * torch.randn(1, 9, generator=g)
    inputs = WeightingInputs(
        torch.randn(k, 9, 4, generator=g), torch.full((k,), 123), disc_logits=row.expand(k, -1)
    )
    assert torch.equal(
        compute_weights("fedgo", inputs, disc_mode=mode), compute_weights("uniform", inputs)
    )


@pytest.mark.parametrize("mode", DISC_MODES)
def test_fedgo_rejecting_discriminator_loses_weight(mode: str) -> None:
    # Client 0 rejects sample 0 (z = -6) and accepts sample 1 (z = +6); the others are neutral.
    disc = torch.tensor([[-6.0, 6.0], [0.0, 0.0], [0.0, 0.0]])
    inputs = WeightingInputs(torch.randn(3, 2, 4), torch.tensor([10, 10, 10]), disc_logits=disc)
    w = compute_weights("fedgo", inputs, disc_mode=mode)
    assert w[0, 0] < w[1, 0] and w[0, 0] < w[2, 0]
    assert w[0, 1] > w[1, 1] and w[0, 1] > w[2, 1]
    if mode == "sigmoid":  # exact odds: Φ_0 / Φ_1 = e^{-6} and e^{6}
        torch.testing.assert_close(w[0, 0] / w[1, 0], torch.tensor(math.exp(-6.0)))
    else:  # the double sigmoid bounds any odds ratio by e (App. E.2)
        assert w[0, 1] / w[1, 1] < math.e and w[1, 0] / w[0, 0] < math.e


@pytest.mark.parametrize("mode", DISC_MODES)
def test_fedgo_weight_is_monotone_in_own_discriminator(mode: str) -> None:
    z0 = torch.linspace(-12.0, 12.0, 97)
    others = torch.tensor([[0.5], [-1.0], [2.0]]).expand(3, z0.numel())
    disc = torch.cat([z0[None], others])
    inputs = WeightingInputs(torch.zeros(4, z0.numel(), 2), torch.tensor([5, 1, 2, 9]), disc)
    w0 = compute_weights("fedgo", inputs, disc_mode=mode)[0].double()
    assert bool((w0.diff() > 0).all())
    # Raising z_0 can only lower every other client's weight.
    w_rest = compute_weights("fedgo", inputs, disc_mode=mode)[1:]
    assert bool((w_rest.diff(dim=1) <= 0).all())


def test_byzantine_clients_are_seeded_distinct_and_bounded() -> None:
    assert byzantine_clients(0, 10, 3) == byzantine_clients(0, 10, 3)
    draws = {tuple(byzantine_clients(seed, 10, 3)) for seed in range(20)}
    assert len(draws) > 1  # the seed chooses them
    for liars in draws:
        assert list(liars) == sorted(set(liars)) and len(liars) == 3
        assert all(0 <= i < 10 for i in liars)
    assert byzantine_clients(0, 10, 0) == [] and byzantine_clients(0, 4, 4) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="byzantine"):
        byzantine_clients(0, 4, 5)


@pytest.mark.parametrize("mode", DISC_MODES)
def test_byzantine_discriminator_claims_every_sample(mode: str) -> None:
    """FedGO App. F.8: a discriminator at its maximum everywhere. With the exact odds it takes
    the whole weight of every sample; the double sigmoid bounds its odds ratio by e."""
    g = torch.Generator().manual_seed(0)
    disc = 2 * torch.randn(4, 50, generator=g)
    liar = make_byzantine(disc, [2])
    assert bool((liar[2] == BYZANTINE_LOGIT).all()) and torch.equal(
        liar[[0, 1, 3]], disc[[0, 1, 3]]
    )
    assert not bool((disc == BYZANTINE_LOGIT).any())  # the input is left alone
    n = torch.tensor([10, 10, 10, 10])
    w = compute_weights("fedgo", WeightingInputs(torch.zeros(4, 50, 3), n, liar), disc_mode=mode)
    assert bool((w[2] >= w.amax(0) - 1e-7).all())  # the liar's weight is the largest
    if mode == "sigmoid":
        torch.testing.assert_close(w[2], torch.ones(50))
    else:
        assert bool((w[2] / w[[0, 1, 3]] <= math.e + 1e-5).all())


def test_fedgo_clip_bounds_any_odds_ratio() -> None:
    """``clip``: log-odds in [-c, c], so w_i / w_j <= (n_i / n_j) e^{2c} whatever the logits;
    a Byzantine client with the exact odds then no longer takes every sample."""
    g = torch.Generator().manual_seed(1)
    disc = make_byzantine(30 * torch.randn(3, 40, generator=g), [0])
    inputs = WeightingInputs(torch.zeros(3, 40, 2), torch.tensor([1, 2, 4]), disc)
    for clip in (0.5, 2.0, 5.0):
        w = compute_weights("fedgo", inputs, disc_mode="sigmoid", clip=clip).double()
        n = torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64)[:, None]
        ratio = (w / n)[:, None, :] / (w / n)[None, :, :]
        assert float(ratio.max()) <= math.exp(2 * clip) * (1 + 1e-5)
        torch.testing.assert_close(w.sum(0), torch.ones(40, dtype=torch.float64))
    unclipped = compute_weights("fedgo", inputs, disc_mode="sigmoid")
    torch.testing.assert_close(unclipped[0], torch.ones(40))
    # A clip wider than every |log Φ| changes nothing.
    mild = WeightingInputs(torch.zeros(3, 40, 2), torch.tensor([1, 2, 4]), disc.clamp(-3, 3))
    torch.testing.assert_close(
        compute_weights("fedgo", mild, disc_mode="sigmoid", clip=3.5),
        compute_weights("fedgo", mild, disc_mode="sigmoid"),
    )
    with pytest.raises(ValueError, match="clip"):
        compute_weights("fedgo", inputs, clip=0)


def test_fedgo_scales_with_num_examples() -> None:
    disc = torch.zeros(2, 3)
    inputs = WeightingInputs(torch.zeros(2, 3, 2), torch.tensor([1, 3]), disc_logits=disc)
    w = compute_weights("fedgo", inputs)
    torch.testing.assert_close(w, torch.tensor([[0.25] * 3, [0.75] * 3]))


def test_fedgo_without_sizes_is_the_odds_alone() -> None:
    # Exact odds exp(z): z = (0, ln 3) gives odds (1, 3); with n = (3, 1) Eq. (9) weighs them
    # 3*1 : 1*3 (equal), without n_k 1 : 3. A client with no data stays out either way.
    disc = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0], [5.0, 5.0]])
    inputs = WeightingInputs(torch.zeros(3, 2, 2), torch.tensor([3, 1, 0]), disc_logits=disc)
    with_n = compute_weights("fedgo", inputs, disc_mode="sigmoid")
    torch.testing.assert_close(with_n[:, 0], torch.tensor([0.5, 0.5, 0.0]))
    alone = compute_weights("fedgo", inputs, disc_mode="sigmoid", sizes=False)
    torch.testing.assert_close(alone[:, 0], torch.tensor([0.25, 0.75, 0.0]))
    torch.testing.assert_close(alone[:, 1], torch.tensor([0.5, 0.5, 0.0]))
    with pytest.raises(ValueError, match="sizes must be true or false"):
        compute_weights("fedgo", inputs, sizes="no")


def test_double_sigmoid_odds_bounds() -> None:
    moderate = torch.linspace(-15.0, 15.0, 301)
    phi = discriminator_odds(moderate)
    assert bool((phi > 1).all()) and bool((phi < math.e).all())
    huge = torch.tensor([-1e4, -1e3, 1e3, 1e4])
    for dtype in (torch.float32, torch.float64):
        phi = discriminator_odds(huge.to(dtype))
        assert bool(torch.isfinite(phi).all())
        # Mathematically inside (1, e); in floating point sigmoid(±1e4) rounds to exactly 0 or 1.
        assert bool((phi >= 1).all()) and bool((phi <= math.e).all())
    torch.testing.assert_close(log_discriminator_odds(torch.tensor([0.0])), torch.tensor([0.5]))


@pytest.mark.parametrize("mode", DISC_MODES)
def test_closed_form_odds_match_definition(mode: str) -> None:
    z = torch.linspace(-8.0, 8.0, 33, dtype=torch.float64)
    d = discriminator_probability(z, mode)
    torch.testing.assert_close(discriminator_odds(z, mode), d / (1 - d))  # FedGO Def. 3.5
    expected_d = torch.sigmoid(torch.sigmoid(z)) if mode == "double_sigmoid" else torch.sigmoid(z)
    torch.testing.assert_close(d, expected_d)


def test_single_sigmoid_log_space_is_finite_for_huge_logits() -> None:
    disc = torch.tensor([[1e4, -1e4, 1e4], [-1e4, 1e4, 1e4], [0.0, 0.0, -1e4]])
    inputs = WeightingInputs(torch.randn(3, 3, 2), torch.tensor([4, 2, 7]), disc_logits=disc)
    w = compute_weights("fedgo", inputs, disc_mode="sigmoid")
    assert_distribution(w, 3, 3)
    expected = torch.tensor([[1.0, 0.0, 4 / 6], [0.0, 1.0, 2 / 6], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(w, expected)
    assert bool(torch.isinf(discriminator_odds(disc, "sigmoid")).any())  # why log space is needed


def test_fedgo_client_with_no_data_never_dominates() -> None:
    # The most confident discriminator belongs to a client with n_k = 0.
    disc = torch.tensor([[1e4], [-1e4]])
    inputs = WeightingInputs(torch.randn(2, 1, 3), torch.tensor([0, 5]), disc_logits=disc)
    for mode in DISC_MODES:
        w = compute_weights("fedgo", inputs, disc_mode=mode)
        torch.testing.assert_close(w, torch.tensor([[0.0], [1.0]]))


# ------------------------------------------------------------------------------------------
# Baselines: entropy (FedHKT/FedDS), variance (Fed-ET), domain (DaFKD), oracle
# ------------------------------------------------------------------------------------------


def test_entropy_prefers_confident_teacher() -> None:
    confident = torch.tensor([[8.0, 0.0, 0.0, 0.0]])
    flat = torch.zeros(1, 4)
    inputs = WeightingInputs(torch.stack([flat, confident, flat]), torch.tensor([1, 1, 1]))
    w = compute_weights("entropy", inputs)
    assert w[1, 0] > w[0, 0] and w[1, 0] > w[2, 0]
    torch.testing.assert_close(w[0], w[2])
    # w_k ∝ exp(-H_k / τ): the ratio between a flat and a confident teacher is exp(ΔH / τ).
    p = torch.softmax(confident.double(), -1)
    h_conf = float(-(p * p.log()).sum())
    ratio = math.exp((math.log(4) - h_conf) / 1.0)
    torch.testing.assert_close(float(w[1, 0] / w[0, 0]), ratio, rtol=1e-5, atol=0)
    # A large temperature approaches uniform weighting (FedGO App. E.2).
    w_hot = compute_weights("entropy", inputs, temperature=1e6)
    torch.testing.assert_close(w_hot, torch.full((3, 1), 1 / 3), atol=1e-6, rtol=0)


def test_variance_gives_constant_teacher_least_weight() -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 6, 5, generator=g)
    logits[2] = 7.0  # constant logits: zero variance across classes
    w = compute_weights("variance", WeightingInputs(logits, torch.ones(4)))
    assert bool((w[2] == 0).all())
    assert bool((w[2] < w[[0, 1, 3]]).all())
    var = logits.var(dim=2)
    torch.testing.assert_close(w, var / var.sum(0), atol=1e-6, rtol=1e-5)


def test_variance_all_constant_falls_back_to_uniform() -> None:
    logits = torch.ones(3, 2, 4)
    w = compute_weights("variance", WeightingInputs(logits, torch.ones(3)))
    torch.testing.assert_close(w, torch.full((3, 2), 1 / 3))


def test_domain_is_normalised_raw_probability() -> None:
    disc = torch.tensor([[2.0, -3.0], [0.0, 1.0], [-1.0, 5.0]], dtype=torch.float64)
    inputs = WeightingInputs(torch.zeros(3, 2, 2), torch.tensor([1, 100, 1]), disc_logits=disc)
    d = torch.sigmoid(disc)
    torch.testing.assert_close(compute_weights("domain", inputs), (d / d.sum(0)).float())
    # No n_k: changing the data sizes changes FedGO but not DaFKD.
    other = WeightingInputs(inputs.logits, torch.tensor([1, 1, 1]), disc_logits=disc)
    assert torch.equal(compute_weights("domain", inputs), compute_weights("domain", other))
    assert not torch.equal(compute_weights("fedgo", inputs), compute_weights("fedgo", other))
    dd = torch.sigmoid(torch.sigmoid(disc))
    torch.testing.assert_close(
        compute_weights("domain", inputs, disc_mode="double_sigmoid"), (dd / dd.sum(0)).float()
    )


def test_oracle_uses_true_label_counts() -> None:
    counts = torch.tensor([[5, 5, 0, 7], [3, 0, 0, 0], [2, 5, 0, 0]])
    labels = torch.tensor([3, 0, 1, 2])
    inputs = WeightingInputs(
        torch.randn(3, 4, 4), torch.ones(3), labels=labels, class_counts=counts
    )
    w = compute_weights("oracle", inputs)
    torch.testing.assert_close(w[:, 0], torch.tensor([1.0, 0.0, 0.0]))  # only client 0 has 3
    torch.testing.assert_close(w[:, 1], torch.tensor([0.5, 0.3, 0.2]))
    torch.testing.assert_close(w[:, 2], torch.tensor([0.5, 0.0, 0.5]))
    torch.testing.assert_close(w[:, 3], torch.full((3,), 1 / 3))  # nobody has class 2


# ------------------------------------------------------------------------------------------
# Ensembling
# ------------------------------------------------------------------------------------------


def test_ensemble_with_one_hot_weights_picks_teacher() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 4, generator=g)
    choice = torch.tensor([2, 0, 1, 1, 0])
    w = F.one_hot(choice, 3).T.float()
    out = ensemble_logits(logits, w)
    torch.testing.assert_close(out, logits[choice, torch.arange(5)])


def test_uniform_ensemble_is_avglogits_and_pseudo_labels_are_distributions() -> None:
    inputs = random_inputs(1, 4)
    w = compute_weights("uniform", inputs)
    torch.testing.assert_close(ensemble_logits(inputs.logits, w), inputs.logits.mean(0))
    for name, params in METHOD_CASES:
        probs = pseudo_labels(inputs.logits, compute_weights(name, inputs, **params))
        assert probs.shape == (inputs.num_samples, inputs.num_classes)
        assert bool((probs >= 0).all())
        torch.testing.assert_close(probs.sum(1), torch.ones(inputs.num_samples))
    sharp = pseudo_labels(inputs.logits, w, temperature=0.5)
    torch.testing.assert_close(sharp, torch.softmax(2 * inputs.logits.mean(0), -1))


# ------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------


def test_unknown_method_lists_names() -> None:
    with pytest.raises(ValueError, match="unknown weighting method 'fedavg'.*fedgo"):
        compute_weights("fedavg", random_inputs(0, 2))


@pytest.mark.parametrize(
    ("name", "missing"),
    [("fedgo", "disc_logits"), ("domain", "disc_logits"), ("oracle", "labels")],
)
def test_missing_required_input(name: str, missing: str) -> None:
    inputs = WeightingInputs(torch.randn(2, 3, 4), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=f"'{name}' requires input '{missing}'"):
        compute_weights(name, inputs)


def test_oracle_missing_class_counts() -> None:
    inputs = WeightingInputs(
        torch.randn(2, 3, 4), torch.tensor([1, 2]), labels=torch.zeros(3).long()
    )
    with pytest.raises(ValueError, match="'oracle' requires input 'class_counts'"):
        compute_weights("oracle", inputs)


def test_disc_logits_shape_mismatch() -> None:
    with pytest.raises(ValueError, match=r"disc_logits must have shape \(K, N\) = \(2, 3\)"):
        WeightingInputs(torch.randn(2, 3, 4), torch.tensor([1, 2]), disc_logits=torch.zeros(3, 2))


def test_negative_num_examples() -> None:
    with pytest.raises(ValueError, match="num_examples must be non-negative"):
        WeightingInputs(torch.randn(2, 3, 4), torch.tensor([5, -1]))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"logits": torch.randn(3, 4)}, r"logits must have shape \(K, N, C\)"),
        ({"logits": torch.zeros(2, 3, 4, dtype=torch.long)}, "logits must be a floating"),
        ({"logits": torch.full((2, 3, 4), float("nan"))}, "logits contains NaN"),
        ({"num_examples": torch.tensor([1, 2, 3])}, r"num_examples must have shape \(K,\)"),
        ({"labels": torch.tensor([0, 1])}, r"labels must have shape \(N,\)"),
        ({"labels": torch.tensor([0, 1, 4])}, r"labels must lie in \[0, C\)"),
        ({"labels": torch.tensor([0.0, 1.0, 2.0])}, "labels must be an integer"),
        ({"class_counts": torch.ones(2, 3)}, r"class_counts must have shape \(K, C\)"),
        ({"class_counts": -torch.ones(2, 4)}, "class_counts must be non-negative"),
        ({"disc_logits": torch.tensor([[0.0, 1.0, float("inf")]] * 2)}, "disc_logits contains"),
    ],
)
def test_invalid_inputs_are_named(kwargs: dict[str, Tensor], message: str) -> None:
    fields: dict[str, Tensor] = {"logits": torch.randn(2, 3, 4), "num_examples": torch.ones(2)}
    fields.update(kwargs)
    with pytest.raises(ValueError, match=message):
        WeightingInputs(**fields)


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("uniform", {"temperature": 2.0}, "unknown parameter"),
        ("fedgo", {"disc_mod": "sigmoid"}, r"unknown parameter\(s\) \['disc_mod'\]"),
        ("fedgo", {"disc_mode": "triple"}, "unknown disc_mode 'triple'"),
        ("domain", {"disc_mode": 1}, "unknown disc_mode"),
        ("entropy", {"temperature": 0.0}, "temperature must be a finite number > 0"),
        ("entropy", {"temperature": "hot"}, "temperature must be a number"),
    ],
)
def test_invalid_parameters(name: str, params: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        compute_weights(name, random_inputs(0, 2), **params)


@pytest.mark.parametrize("name", ["data_size", "fedgo"])
def test_zero_total_examples(name: str) -> None:
    inputs = WeightingInputs(torch.randn(2, 3, 4), torch.zeros(2), disc_logits=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="sum_k num_examples > 0"):
        compute_weights(name, inputs)


def test_ensemble_shape_mismatch() -> None:
    with pytest.raises(ValueError, match="weights must have shape"):
        ensemble_logits(torch.randn(2, 3, 4), torch.ones(3, 2))
    with pytest.raises(ValueError, match=r"logits must have shape \(K, \.\.\., N, C\)"):
        pseudo_labels(torch.randn(2, 3), torch.ones(2, 3))


# ------------------------------------------------------------------------------------------
# End to end: the four-Gaussian toy of FedGO App. E.1
# ------------------------------------------------------------------------------------------

# Component means; classes Red = 0 for (4, 4) and (-4, -4), Blue = 1 for (-4, 4), Green = 2 for
# (4, -4); isotropic variance 3 (App. E.1).
TOY_MEANS = torch.tensor([[4.0, 4.0], [-4.0, -4.0], [-4.0, 4.0], [4.0, -4.0]])
TOY_LABELS = torch.tensor([0, 0, 1, 2])
# Client k's main component: clients 1-4 of the paper hold the 3rd, 4th, 2nd, 1st quadrants.
TOY_MAIN_COMPONENT = (1, 3, 2, 0)
TOY_SQUARE = 12.0  # the server set / "generator" is uniform on [-12, 12]^2


def init_batched_mlp(k: int, sizes: list[int], g: torch.Generator) -> list[Tensor]:
    """Parameters of ``k`` independent MLPs (nn.Linear-style uniform init), stacked on dim 0."""
    params: list[Tensor] = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        bound = 1.0 / math.sqrt(fan_in)
        params.append(
            ((torch.rand(k, fan_in, fan_out, generator=g) * 2 - 1) * bound).requires_grad_()
        )
        params.append(((torch.rand(k, 1, fan_out, generator=g) * 2 - 1) * bound).requires_grad_())
    return params


def batched_mlp(params: list[Tensor], x: Tensor) -> Tensor:
    """Apply the ``k`` MLPs to ``x`` of shape ``(k, B, d)``; ReLU between layers."""
    h = x
    for i in range(0, len(params), 2):
        h = torch.baddbmm(params[i + 1], h, params[i])
        if i + 2 < len(params):
            h = torch.relu(h)
    return h


def toy_round(seed: int) -> dict[str, float]:
    """One seeded run of the App. E.1 toy; returns pseudo-label accuracy per weighting.

    Faithful to App. E.1: four Gaussians (300 points each), each client holds 90% of one Gaussian
    and 10 points of each other one, a 3-layer MLP classifier per client (Adam 1e-3, batch 64), a
    3-layer MLP discriminator per client with the client data as "real" and points uniform on the
    server square [-12, 12]^2 as "fake". Simplified: 4 classifier epochs instead of 2 (with 2,
    a client is sometimes not yet accurate even on its own quadrant), and 200 Adam steps (lr 1e-3,
    BCE) for the discriminator instead of one epoch of RMSprop at 5e-5, so that it approaches the
    optimal discriminator of Thm 2.1. The K = 4 clients are trained in parallel as batched MLPs.
    Accuracy is measured on 1000 fresh points of the global mixture against their true labels.
    """
    g = torch.Generator().manual_seed(seed)
    k, hidden = 4, 32
    xs: list[list[Tensor]] = [[] for _ in range(k)]
    ys: list[list[Tensor]] = [[] for _ in range(k)]
    for comp in range(4):
        points = TOY_MEANS[comp] + math.sqrt(3.0) * torch.randn(300, 2, generator=g)
        main = TOY_MAIN_COMPONENT.index(comp)
        owners = [main] + [c for c in range(k) if c != main]
        start = 0
        for owner, size in zip(owners, (270, 10, 10, 10), strict=True):
            xs[owner].append(points[start : start + size])
            ys[owner].append(torch.full((size,), int(TOY_LABELS[comp])))
            start += size
    x_local = torch.stack([torch.cat(x) for x in xs])  # (K, 300, 2)
    y_local = torch.stack([torch.cat(y) for y in ys])  # (K, 300)
    n_local = x_local.shape[1]

    classifier = init_batched_mlp(k, [2, hidden, hidden, 3], g)
    opt = torch.optim.Adam(classifier, lr=1e-3, betas=(0.9, 0.999))
    for _ in range(4):
        perm = torch.argsort(torch.rand(k, n_local, generator=g), dim=1)
        for start in range(0, n_local, 64):
            idx = perm[:, start : start + 64]
            xb = torch.gather(x_local, 1, idx[..., None].expand(-1, -1, 2))
            yb = torch.gather(y_local, 1, idx)
            out = batched_mlp(classifier, xb)
            # Sum over clients of each client's mean loss: the K problems stay independent.
            loss = F.cross_entropy(out.reshape(-1, 3), yb.reshape(-1), reduction="sum")
            opt.zero_grad()
            (loss / idx.shape[1]).backward()
            opt.step()

    discriminator = init_batched_mlp(k, [2, hidden, hidden, 1], g)
    opt = torch.optim.Adam(discriminator, lr=1e-3)
    target = torch.cat([torch.ones(k, 64), torch.zeros(k, 64)], dim=1)
    for _ in range(200):
        idx = torch.randint(n_local, (k, 64), generator=g)
        real = torch.gather(x_local, 1, idx[..., None].expand(-1, -1, 2))
        fake = (torch.rand(k, 64, 2, generator=g) * 2 - 1) * TOY_SQUARE
        z = batched_mlp(discriminator, torch.cat([real, fake], dim=1)).squeeze(-1)
        loss = F.binary_cross_entropy_with_logits(z, target, reduction="sum") / 128
        opt.zero_grad()
        loss.backward()
        opt.step()

    comps = torch.arange(4).repeat_interleave(250)
    x_test = TOY_MEANS[comps] + math.sqrt(3.0) * torch.randn(1000, 2, generator=g)
    y_test = TOY_LABELS[comps]
    with torch.no_grad():
        logits = batched_mlp(classifier, x_test.expand(k, -1, -1))
        disc = batched_mlp(discriminator, x_test.expand(k, -1, -1)).squeeze(-1)
    inputs = WeightingInputs(logits, torch.full((k,), n_local), disc_logits=disc)
    cases = {
        "uniform": ("uniform", {}),
        "fedgo_sigmoid": ("fedgo", {"disc_mode": "sigmoid"}),
        "fedgo_double_sigmoid": ("fedgo", {}),
        "domain": ("domain", {}),
        "entropy": ("entropy", {}),
        "variance": ("variance", {}),
    }
    accuracy: dict[str, float] = {}
    for key, (name, params) in cases.items():
        w = compute_weights(name, inputs, **params)
        hits = pseudo_labels(logits, w).argmax(dim=1) == y_test
        accuracy[key] = hits.float().mean().item()
    return accuracy


def test_toy_four_gaussians_fedgo_beats_uniform() -> None:
    runs = [toy_round(seed) for seed in range(8)]  # one torch thread: tests/unit/conftest.py
    mean = {key: sum(r[key] for r in runs) / len(runs) for key in runs[0]}
    # Measured (seeds 0-7): uniform 0.874, FedGO sigmoid 0.964, FedGO double sigmoid 0.915.
    assert mean["fedgo_sigmoid"] - mean["uniform"] >= 0.03, mean
    assert mean["fedgo_sigmoid"] >= 0.9, mean
    assert mean["fedgo_double_sigmoid"] > mean["uniform"], mean
    for r in runs:
        assert r["fedgo_sigmoid"] >= r["uniform"] - 0.02, r


def test_the_reference_cancels_in_fedgo_exact_odds() -> None:
    """Optimal discriminators against a reference density r give z_k = log p_k - log r
    (Goodfellow et al. 2014, Prop. 1: D* = p_k / (p_k + r)). With the exact odds
    (``disc_mode: sigmoid``) r cancels from FedGO's weights (Thm 3.6), so two different
    references give the same weights, Thm 3.4's n_k p_k / sum_i n_i p_i; the paper's double
    sigmoid does not cancel it. The server-referenced variant rests on this."""
    gen = torch.Generator().manual_seed(0)
    k, n_samples = 3, 40
    log_p = torch.randn(k, n_samples, generator=gen, dtype=torch.float64) * 2
    n = torch.tensor([50.0, 10.0, 140.0], dtype=torch.float64)
    logits = torch.randn(k, n_samples, 4, generator=gen)
    weights = {}
    for name, log_r in {
        "generator": torch.randn(n_samples, generator=gen, dtype=torch.float64),
        "server": torch.randn(n_samples, generator=gen, dtype=torch.float64) * 3 + 1,
    }.items():
        z = (log_p - log_r).float()
        inputs = WeightingInputs(logits=logits, num_examples=n, disc_logits=z)
        weights[name] = {
            mode: compute_weights("fedgo", inputs, disc_mode=mode)
            for mode in ("sigmoid", "double_sigmoid")
        }
    exact = weights["generator"]["sigmoid"]
    torch.testing.assert_close(exact, weights["server"]["sigmoid"], rtol=1e-6, atol=1e-7)
    optimal = n[:, None] * log_p.exp()
    torch.testing.assert_close(
        exact, (optimal / optimal.sum(0)).to(exact.dtype), rtol=1e-5, atol=1e-6
    )
    gap = (weights["generator"]["double_sigmoid"] - weights["server"]["double_sigmoid"]).abs()
    assert gap.max() > 0.05


@pytest.mark.parametrize("mode", ["sigmoid", "double_sigmoid"])
def test_fedgo_temperature_takes_the_odds_to_the_power_one_over_t(mode) -> None:
    """``temperature`` T: Phi_k^(1/T), i.e. w_k = n_k Phi_k^(1/T) / sum_i n_i Phi_i^(1/T)."""
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(3, 10, generator=gen) * 3
    n = torch.tensor([20.0, 5.0, 75.0])
    inputs = WeightingInputs(
        logits=torch.randn(3, 10, 4, generator=gen), num_examples=n, disc_logits=z
    )
    log_phi = z.double() if mode == "sigmoid" else torch.sigmoid(z.double())
    for t in (0.5, 2.0, 3.0):
        numer = n.double()[:, None] * torch.exp(log_phi / t)
        expected = (numer / numer.sum(0)).float()
        got = compute_weights("fedgo", inputs, disc_mode=mode, temperature=t)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_oracle_weights_a_class_held_once_and_one_held_by_none() -> None:
    """Thm 3.4's n_{k,y} / sum_i n_{i,y}, also when the class has one sample in all (total 1),
    and uniform where no teacher has the class (total 0)."""
    counts = torch.tensor([[1, 0, 3], [0, 0, 1]])  # (K=2, C=3): class 0 held once, class 1 by none
    inputs = WeightingInputs(
        logits=torch.zeros(2, 3, 3),
        num_examples=torch.tensor([4.0, 1.0]),
        labels=torch.tensor([0, 1, 2]),
        class_counts=counts,
    )
    expected = torch.tensor([[1.0, 0.5, 0.75], [0.0, 0.5, 0.25]])
    torch.testing.assert_close(compute_weights("oracle", inputs), expected)


def test_parameter_errors_name_the_method_and_what_it_accepts() -> None:
    inputs = WeightingInputs(
        logits=torch.zeros(2, 3, 4),
        num_examples=torch.tensor([1.0, 2.0]),
        disc_logits=torch.zeros(2, 3),
    )
    with pytest.raises(
        ValueError, match=r"'uniform' got unknown parameter\(s\) \['clip'\]; accepted: none"
    ):
        compute_weights("uniform", inputs, clip=1.0)
    with pytest.raises(
        ValueError, match=r"^fedgo: temperature must be a finite number > 0, got 0.0$"
    ):
        compute_weights("fedgo", inputs, temperature=0)
    with pytest.raises(ValueError, match=r"^domain: unknown disc_mode 'x'"):
        compute_weights("domain", inputs, disc_mode="x")
    with pytest.raises(ValueError, match=r"^inputs must be a WeightingInputs, got dict$"):
        compute_weights("uniform", {})  # type: ignore[arg-type]


# -- the cap on a teacher's mean share ------------------------------------------------------------
def test_mean_share_caps_by_hand() -> None:
    # K = 4, n = (10, 10, 60, 20): 3 pi = (0.3, 0.3, 1.8, 0.6), floor 2/K = 0.5, top 1, then
    # at most max(1/2, pi) = (0.5, 0.5, 0.6, 0.5): no one holds a majority but by its data
    caps = mean_share_caps(torch.tensor([10.0, 10.0, 60.0, 20.0]))
    assert caps.tolist() == pytest.approx([0.5, 0.5, 0.6, 0.5])


def test_cap_mean_shares_by_hand() -> None:
    """Teacher 0 holds a mean share of 0.85 > its cap 0.5: its weights are halved times
    0.5 / 0.85 on every sample, what it gives up goes to 1 and 2 in proportion to their weights
    (equally on the last sample, where both hold 0), and every column still sums to 1."""
    w = torch.tensor([[0.9, 0.9, 0.6, 1.0], [0.1, 0.05, 0.4, 0.0], [0.0, 0.05, 0.0, 0.0]])
    out, capped = cap_mean_shares(w, torch.tensor([0.5, 1.0, 1.0]))
    c = 0.5 / 0.85
    assert capped == [0]
    assert out[0].tolist() == pytest.approx([0.9 * c, 0.9 * c, 0.6 * c, c])
    removed = 1 - c
    want1 = [0.1 + 0.9 * removed, 0.05 + 0.9 * removed / 2, 0.4 + 0.6 * removed, removed / 2]
    assert out[1].tolist() == pytest.approx(want1)
    assert out.sum(0).tolist() == pytest.approx([1.0] * 4)
    assert float(out[0].mean()) == pytest.approx(0.5)
    # within every cap: the same tensor, untouched
    same, none = cap_mean_shares(w, torch.tensor([0.9, 1.0, 1.0]))
    assert same is w and none == []


def test_cap_mean_shares_second_pass_and_gradient() -> None:
    """Capping 0 pushes 1 above its cap: a second pass scales 1 and gives to 2 only."""
    w = torch.tensor([[0.8, 0.8], [0.2, 0.1], [0.0, 0.1]], requires_grad=True)
    out, capped = cap_mean_shares(w, torch.tensor([0.4, 0.4, 1.0]))
    assert capped == [0, 1]
    assert out.mean(1).tolist()[:2] == pytest.approx([0.4, 0.4])
    assert out.sum(0).tolist() == pytest.approx([1.0, 1.0])
    out[2].sum().backward()  # the factors are constants; the weights carry the gradient
    assert w.grad is not None and torch.isfinite(w.grad).all()


@pytest.mark.parametrize("k", [2, 4, 10])
def test_mean_share_cap_binds_on_double_sigmoid_odds_only_past_half(k: int) -> None:
    """FedGO's default odds lie in (1, e), so no mean share can exceed
    ``b = e pi / (e pi + 1 - pi) < 3 pi``: the most extreme discriminators (one says "mine"
    everywhere, the others "not mine") take exactly ``b``, and the cap binds only where ``b``
    is above the half of three or more teachers (never with two)."""
    gen = torch.Generator().manual_seed(k)
    bound_any = False
    for _ in range(20):
        n = torch.randint(1, 1000, (k,), generator=gen).float()
        z = torch.full((k, 50), -1e3)
        z[0] = 1e3
        w = compute_weights("fedgo", WeightingInputs(torch.zeros(k, 50, 3), n, disc_logits=z))
        pi = float(n[0] / n.sum())
        b = math.e * pi / (math.e * pi + 1 - pi)
        assert float(w[0].mean()) == pytest.approx(b, rel=1e-5)
        caps = mean_share_caps(n)
        out, capped = cap_mean_shares(w, caps)
        assert capped == ([0] if b > float(caps[0]) * (1 + 1e-9) else [])
        assert float(out[0].mean()) <= max(0.5, pi) + 1e-6 or k == 2  # float32 weights
        bound_any |= bool(capped)
    if k == 2:
        assert not bound_any  # no cap with two teachers
    if k == 4:
        assert bound_any  # some of the 20 draws give teacher 0 more than 1/(1+e) of the data


def test_mean_share_cap_binds_on_a_biased_exact_odds_discriminator() -> None:
    """With exact odds (disc_mode sigmoid) a bias of +50 takes every sample; capped, its mean
    share is its cap min(3 n_k / sum n, 1/2) = 0.5 of five."""
    k, n = 5, torch.full((5,), 100.0)
    z = torch.randn(k, 200, generator=torch.Generator().manual_seed(0))
    z[1] += 50
    w = compute_weights(
        "fedgo", WeightingInputs(torch.zeros(k, 200, 3), n, disc_logits=z), disc_mode="sigmoid"
    )
    assert float(w[1].mean()) > 0.99
    out, capped = cap_mean_shares(w, mean_share_caps(n))
    assert capped == [1] and float(out[1].mean()) == pytest.approx(0.5)
