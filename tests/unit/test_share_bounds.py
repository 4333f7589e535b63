"""The bounds on one client's share of an ensemble, by hand and under a mounted attack.

:func:`fedgo_flwr.gan.screen_discriminators` (the one discriminator screen of FedGO, CPFL,
Co-Boosting + FedGO and DaFKD), :func:`fedgo_flwr.weighting.cap_mean_shares_named` (CPFL's odds
weights) and :func:`fedgo_flwr.weighting.cap_scalar_shares` (Co-Boosting's learned weights).
The attacks run on hand-made teachers: honest ones right on most samples, the attacker's
predictions rolled by one class, its discriminator (or the synthetic labels) claiming every
sample. Accuracies before and after are computed here and asserted with the measured margins.
"""

from __future__ import annotations

import logging

import pytest
import torch

from fedgo_flwr.datafree.ensemble import weight_step, weighted_logits
from fedgo_flwr.gan import screen_discriminators
from fedgo_flwr.learning.cohorts import cohort_odds_weights, combine_per_sample
from fedgo_flwr.weighting import (
    WeightingInputs,
    cap_mean_shares_named,
    cap_scalar_shares,
    compute_weights,
    mean_share_caps,
)

C, N = 10, 400


def teachers(k: int, attacker: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(k, N, C)`` logits and the labels: honest teachers put 4 on the true class plus
    unit noise (about 0.9 accurate alone), the attacker 4 on the next class (always wrong)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, C, (N,), generator=g)
    z = torch.randn(k, N, C, generator=g)
    z[torch.arange(k)[:, None], torch.arange(N)[None, :], y[None, :]] += 4.0
    z[attacker] = torch.randn(N, C, generator=g)
    z[attacker, torch.arange(N), (y + 1) % C] += 4.0
    return z, y


def accuracy(logits: torch.Tensor, y: torch.Tensor) -> float:
    return float((logits.argmax(-1) == y).float().mean())


# -- the discriminator screen ------------------------------------------------------------------
def test_screen_neutralises_by_zero_or_by_the_median_and_names_the_client(caplog):
    caplog.set_level(logging.WARNING, logger="flwr")
    logging.getLogger("flwr").propagate = True
    try:
        # rows: clients 7, 8, 9, 5; RMS 1, 2, 300, nan-row
        z = torch.tensor([[1.0, -1.0], [2.0, 2.0], [300.0, -300.0], [float("nan"), 0.0]])
        test = torch.tensor([[0.5], [0.25], [9.0], [1.0]])
        screen = screen_discriminators([z, test], [7, 8, 9, 5], [0, 1, 2, 3], 100.0, "X", "the set")
        assert screen.nonfinite == [5] and screen.scaled == [(9, 300.0, 2.0)]
        assert screen.clients == [5, 9]
        assert z[2].tolist() == [0.0, 0.0] and z[3].tolist() == [0.0, 0.0]
        assert test[2].item() == 0.0 and test[0].item() == 0.5  # both tensors, same rows
        z = torch.tensor([[1.0, -1.0], [3.0, 2.0], [300.0, -300.0], [2.0, 5.0]])
        test = torch.tensor([[0.5], [0.25], [9.0], [1.0]])
        screen_discriminators([z, test], [7, 8, 9, 5], [0, 1, 2, 3], 100.0, "X", "s", "median")
        # the lower median of the rows that passed (1, 3, 2 | -1, 2, 5): 2 and 2; test 0.5
        assert z[2].tolist() == [2.0, 2.0] and test[2].item() == 0.5
    finally:
        logging.getLogger("flwr").propagate = False
    texts = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any(
        "X: the discriminator of client 9: its logit scale 300 on the set" in t for t in texts
    )
    assert any("X: the discriminator of client 5 gives non-finite logits" in t for t in texts)
    with pytest.raises(ValueError, match="neutral"):
        screen_discriminators(z, [0, 1, 2, 3], [0], 10.0, "X", "s", "mean")


# -- CPFL's odds: a claim within the screen --------------------------------------------------
def test_the_mean_share_cap_bounds_a_member_that_claims_within_the_screen(caplog):
    """Ten members of equal size in five cohorts of two, FedGO's exact odds (``disc_mode:
    sigmoid``). Honest discriminators give logits about 2 (scale 2.1); member 1's are 9.9
    times its honest ones (just under the screen at 10 x the median), and its model is rolled
    by one class. Measured: uncapped, member 1 holds 0.997 of the weight and the members'
    ensemble is 0.005 accurate (the honest nine alone 1.000); capped at max(2/10, 3/10) = 0.3
    it holds 0.300 and the ensemble is 0.998 accurate (margins asserted: 0.1 and 0.9). With
    four members the cap is 3/4 and still lets it decide (measured 0.035)."""
    k = 10
    caplog.set_level(logging.WARNING, logger="flwr")
    logits, y = teachers(k, attacker=1)
    g = torch.Generator().manual_seed(1)
    disc = 2.0 + 0.5 * torch.randn(k, N, generator=g)
    disc[1] *= 9.9
    members = list(range(k))
    assert not screen_discriminators(disc, members, members, 10.0, "CPFL", "t").clients
    sizes = torch.full((k,), 100.0)
    inputs = WeightingInputs(logits=torch.zeros(k, N, 1), num_examples=sizes, disc_logits=disc)
    raw = compute_weights("fedgo", inputs, disc_mode="sigmoid")
    logging.getLogger("flwr").propagate = True
    try:
        capped = cap_mean_shares_named(raw, sizes, members, "CPFL", "t")
    finally:
        logging.getLogger("flwr").propagate = False
    assert float(raw[1].mean()) > 0.99 and float(capped[1].mean()) == pytest.approx(0.3)
    assert torch.allclose(capped.sum(0), torch.ones(N, dtype=capped.dtype))
    assert any("CPFL: the weights of client 1 on t: mean share" in m for m in caplog.messages)
    before = accuracy(combine_per_sample(logits, raw), y)
    after = accuracy(combine_per_sample(logits, capped), y)
    assert before < 0.1 and after > 0.9, (before, after)
    pairs = [[2 * i, 2 * i + 1] for i in range(k // 2)]
    cohorts = cohort_odds_weights(capped, pairs)  # a cohort: the sum of its members' weights
    assert float(cohorts[0].mean()) <= 0.3 + float(capped[0].mean()) + 1e-6


# -- Co-Boosting's learned weights ------------------------------------------------------------
def test_cap_scalar_shares_by_hand():
    caps = mean_share_caps(torch.ones(4))  # max(2/4, 3/4) = 0.75 each
    w = torch.tensor([0.25, 0.25, 0.25, 0.25])
    same, capped = cap_scalar_shares(w, caps)
    assert same is w and capped == []
    out, capped = cap_scalar_shares(torch.tensor([1.0, 0.1, 0.1, 0.1]), caps)
    # 0.3 left to the others: w_0 = 0.75 * 0.3 / (1 - 0.75) = 0.9, share 0.9 / 1.2 = 0.75
    assert capped == [0] and out.tolist() == pytest.approx([0.9, 0.1, 0.1, 0.1])
    out, capped = cap_scalar_shares(torch.tensor([1.0, 0.0, 0.0, 0.0]), caps)
    # the others hold nothing: an equal third of 1/3 each, share 0.75 exactly
    assert capped == [0] and float(out[0] / out.sum()) == pytest.approx(0.75)
    caps10 = mean_share_caps(torch.tensor([20.0] + [10.0] * 9))  # n_0 / sum n = 20/110
    assert float(caps10[0]) == pytest.approx(3 * 20 / 110) and float(caps10[1]) == pytest.approx(
        3 * 10 / 110
    )
    with pytest.raises(ValueError, match="caps"):
        cap_scalar_shares(w, caps10)


def test_the_learned_weights_cap_bounds_a_teacher_the_synthetic_labels_favour():
    """Eq. 12 on batches whose labels the attacker (teacher 0 of 10) predicts and the honest
    teachers do not (what synthetic samples aimed at its outputs would be), then the ensemble
    on real labels, where it is always wrong. Measured: after 200 uncapped steps its weight is
    1 and every other 0 (share 1.000, accuracy 0.003), capped at max(2/10, 3/10) = 0.3 its
    share is 0.300 and the accuracy 1.000 (margins asserted: 0.05 and 0.9). With 5 teachers the
    cap is 0.6 and it still decides (measured 0.225)."""
    k = 10
    real, y = teachers(k, attacker=0)
    synthetic, y_syn = teachers(k, attacker=0, seed=3)
    y_syn = (y_syn + 1) % C  # the labels the attacker predicts there
    caps = mean_share_caps(torch.ones(k))
    free = torch.full((k,), 1.0 / k)
    capped_w = free.clone()
    for _ in range(200):
        free = weight_step(free, synthetic, y_syn, 0.1 / k)
        capped_w = weight_step(capped_w, synthetic, y_syn, 0.1 / k)
        capped_w, _ = cap_scalar_shares(capped_w, caps)
    share_free = float(free[0] / free.sum())
    share_capped = float(capped_w[0] / capped_w.sum())
    before = accuracy(weighted_logits(real, free), y)
    after = accuracy(weighted_logits(real, capped_w), y)
    assert share_free > 0.99 and share_capped == pytest.approx(0.3, abs=1e-5)
    assert before < 0.05 and after > 0.9, (before, after)
