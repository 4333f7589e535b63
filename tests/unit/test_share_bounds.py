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
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import tiny_config

from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.datafree.ensemble import fedgo_multipliers, weight_step, weighted_logits
from fedgo_flwr.gan import screen_discriminators
from fedgo_flwr.learning.aggregation import DEFAULT_DISCRIMINATOR_BOUND
from fedgo_flwr.learning.cohorts import cohort_odds_weights, combine_per_sample
from fedgo_flwr.weighting import (
    WeightingInputs,
    cap_mean_shares_named,
    cap_scalar_shares,
    compute_weights,
    mean_share_caps,
    share_cap_warning,
)
from strategies.base import Strategy
from strategies.coboosting import CoBoosting
from strategies.coboosting_fedgo import CoBoostingFedGO
from strategies.fedavg import FedAvg
from strategies.feddf import FedDF

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
def test_screen_gives_the_lower_median_of_the_others_and_names_the_client(caplog):
    caplog.set_level(logging.WARNING, logger="flwr")
    logging.getLogger("flwr").propagate = True
    try:
        # rows: clients 7, 8, 9, 5, 6; RMS 1, 2, 300, nan-row, no discriminator (absent)
        z = torch.tensor(
            [[1.0, -1.0], [2.0, 2.0], [300.0, -300.0], [float("nan"), 0.0], [0.0, 0.0]]
        )
        test = torch.tensor([[0.5], [0.25], [9.0], [1.0], [0.0]])
        screen = screen_discriminators([z, test], [7, 8, 9, 5, 6], [0, 1, 2, 3], 100.0, "X", "s")
        assert screen.nonfinite == [5] and screen.scaled == [(9, 300.0, 2.0)]
        assert screen.clients == [5, 9]
        # the rows that passed: 0 and 1; lower median (1, 2 | -1, 2): 1 and -1; test 0.25
        for row in (2, 3, 4):  # screened, non-finite and absent alike
            assert z[row].tolist() == [1.0, -1.0] and test[row].item() == 0.25
        assert z[0].tolist() == [1.0, -1.0] and z[1].tolist() == [2.0, 2.0]  # kept
        # nothing passed: 0 everywhere
        lone = torch.tensor([[float("inf"), 1.0]])
        screen_discriminators(lone, [4], [0], 10.0, "X", "s")
        assert lone.tolist() == [[0.0, 0.0]]
    finally:
        logging.getLogger("flwr").propagate = False
    texts = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("X: the discriminator of client 9: its logit scale 300 on s" in t for t in texts)
    assert any("X: the discriminator of client 5 gives non-finite logits" in t for t in texts)


def _low_logits(k: int, attacker: int, seed: int = 0) -> torch.Tensor:
    """``(k, N)`` discriminator logits on generated samples: honest ones about -5 (every
    honest discriminator calls them fake), the attacker's +100 (it calls them all its own)."""
    g = torch.Generator().manual_seed(seed)
    z = -5.0 + 0.5 * torch.randn(k, N, generator=g)
    z[attacker] = 100.0
    return z


@pytest.mark.parametrize("mode", ["sigmoid", "double_sigmoid"])
def test_a_screened_discriminator_takes_no_more_than_a_uniform_share(mode):
    """Honest logits about -5 on the samples, one discriminator of five screened. Given the
    logit 0 (odds 1, the neutral value before), it held 0.97 of the exact odds' weight
    (``sigmoid``) and 0.29 of the double sigmoid's, against a uniform 0.2; given the lower
    median of the others' logits, at most 0.2."""
    k, attacker = 5, 2
    z = _low_logits(k, attacker)
    sizes = torch.full((k,), 100.0)
    zero = z.clone()
    zero[attacker] = 0.0
    before = float(fedgo_multipliers(zero, sizes, mode)[attacker].mean())
    screen = screen_discriminators(z, list(range(k)), list(range(k)), 10.0, "X", "samples")
    assert screen.clients == [attacker]
    after = float(fedgo_multipliers(z, sizes, mode)[attacker].mean())
    assert before > (0.95 if mode == "sigmoid" else 0.28), before
    assert after <= 1 / k, after


class _Disc(torch.nn.Module):
    """A hand-made discriminator on 4 float features: ``bias + 0.5 * x[:, col]``."""

    def __init__(self, bias: float, col: int) -> None:
        super().__init__()
        self.bias, self.col = bias, col

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bias + 0.5 * x[:, self.col : self.col + 1]


@pytest.mark.parametrize("mode", ["sigmoid", "double_sigmoid"])
def test_coboosting_fedgo_gives_a_screened_discriminator_the_median_of_the_others(mode):
    """Co-Boosting + FedGO's screen on its own weights: four honest discriminators whose logits
    are about -5 on the samples (synthetic ones: fake to all of them) and one whose bias is
    +200 (a logit scale about 40 times theirs, above ``discriminator_bound`` 25). Screened, it
    stands in as the lower median of the others' logits on every input,
    on the test split and on any synthetic batch: its mean share is at most uniform (0.2).
    With the logit 0 it took the capped 0.5 (exact odds) and about 0.29 (double sigmoid)."""
    k, attacker = 5, 3
    g = torch.Generator().manual_seed(0)
    test_x = torch.randn(60, 4, generator=g)
    strategy = CoBoostingFedGO.__new__(CoBoostingFedGO)
    strategy.teachers = {pid: {} for pid in (10, 11, 12, 13, 14)}  # pids: sorted(teachers)
    strategy.teacher_sizes = dict.fromkeys(strategy.teachers, 100)
    strategy.resources = SimpleNamespace(
        bundle=SimpleNamespace(
            test=ArrayDataset(x=test_x.numpy(), y=np.zeros(60, dtype=np.int64), num_classes=2)
        ),
        device=torch.device("cpu"),
    )
    strategy.params = SimpleNamespace(teacher_batch_size=64, disc_mode=mode)
    strategy.aggregation = SimpleNamespace(discriminator_bound=25.0)
    mods = [_Disc(200.0 if i == attacker else -5.0, i % 4) for i in range(k)]
    strategy._disc_modules = strategy.screened(mods)
    synthetic = torch.randn(N, 4, generator=g)
    weights = strategy.odds_weights(synthetic)
    assert weights.shape == (k, N)
    assert float(weights[attacker].mean()) <= 1 / k, float(weights[attacker].mean())
    med = torch.stack([mods[i](synthetic) for i in range(k) if i != attacker]).median(0).values
    assert torch.equal(strategy._disc_modules[attacker](synthetic), med)


# -- CPFL's odds: a claim within the screen --------------------------------------------------
def test_the_mean_share_cap_bounds_a_member_that_claims_within_the_screen(caplog):
    """Ten members of equal size in five cohorts of two, FedGO's exact odds (``disc_mode:
    sigmoid``). Honest discriminators give logits about 2 (scale 2.1); member 1's are 24.75
    times its honest ones (just under the screen at ``discriminator_bound`` 25 x the median),
    and its model is rolled
    by one class. Measured: uncapped, member 1 holds 0.997 of the weight and the members'
    ensemble is 0.005 accurate (the honest nine alone 1.000); capped at max(2/10, 3/10) = 0.3
    it holds 0.300 and the ensemble is 0.998 accurate (margins asserted: 0.1 and 0.9)."""
    k = 10
    caplog.set_level(logging.WARNING, logger="flwr")
    logits, y = teachers(k, attacker=1)
    g = torch.Generator().manual_seed(1)
    disc = 2.0 + 0.5 * torch.randn(k, N, generator=g)
    disc[1] *= 0.99 * DEFAULT_DISCRIMINATOR_BOUND
    members = list(range(k))
    assert not screen_discriminators(
        disc, members, members, DEFAULT_DISCRIMINATOR_BOUND, "CPFL", "t"
    ).clients
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
    caps = mean_share_caps(torch.ones(4))  # min(max(2/4, 3/4), 1/2) = 0.5 each
    assert caps.tolist() == [0.5] * 4
    w = torch.tensor([0.25, 0.25, 0.25, 0.25])
    same, capped = cap_scalar_shares(w, caps)
    assert same is w and capped == []
    out, capped = cap_scalar_shares(torch.tensor([1.0, 0.1, 0.1, 0.1]), caps)
    # 0.3 left to the others: w_0 = 0.5 * 0.3 / (1 - 0.5) = 0.3, share 0.3 / 0.6 = 0.5
    assert capped == [0] and out.tolist() == pytest.approx([0.3, 0.1, 0.1, 0.1])
    out, capped = cap_scalar_shares(torch.tensor([1.0, 0.0, 0.0, 0.0]), caps)
    # the others hold nothing: an equal third of 1 each, share 1 / 2 exactly
    assert capped == [0] and float(out[0] / out.sum()) == pytest.approx(0.5)
    caps10 = mean_share_caps(torch.tensor([20.0] + [10.0] * 9))  # n_0 / sum n = 20/110
    # 3 * 20/110 = 0.545 above the half: 0.5; 3 * 10/110 = 0.273 stays
    assert float(caps10[0]) == 0.5 and float(caps10[1]) == pytest.approx(3 * 10 / 110)
    with pytest.raises(ValueError, match="caps"):
        cap_scalar_shares(w, caps10)


# -- fewer than four teachers: no majority where a cap can prevent one ------------------------
def test_mean_share_caps_leave_no_teacher_a_majority_of_three_or_more():
    """``min(max(2/K, 3 pi_k), max(1/2, pi_k))`` for K >= 3, by hand; K = 2: no cap (1)."""
    assert mean_share_caps(torch.ones(2)).tolist() == [1.0, 1.0]  # max(2/2, 3/2) -> 1
    assert mean_share_caps(torch.ones(3)).tolist() == [0.5] * 3  # max(2/3, 1) = 1 -> 1/2
    assert mean_share_caps(torch.ones(5)).tolist() == [0.5] * 5  # 3/5 -> 1/2
    assert mean_share_caps(torch.ones(10)).tolist() == pytest.approx([0.3] * 10)  # 3/10 stays
    # a teacher with most of the data (the server's count) keeps its data share: 0.6
    assert mean_share_caps(torch.tensor([60.0, 20.0, 20.0])).tolist() == pytest.approx(
        [0.6, 0.5, 0.5]
    )
    # K = 3, teacher 0 at 0.9 on every sample: scaled to 1/2; the 0.4 it gives up goes to
    # the other two in proportion (0.05 each): 0.25 each, together as much as it
    w = torch.tensor([[0.9] * 4, [0.05] * 4, [0.05] * 4])
    out = cap_mean_shares_named(w, torch.ones(3), [4, 5, 6], "T", "s")
    assert out[0].tolist() == pytest.approx([0.5] * 4)
    assert out[1].tolist() == pytest.approx([0.25] * 4) and out[2].tolist() == pytest.approx(
        [0.25] * 4
    )
    # the learned scalar weights of three: w = (1, 0.1, 0.1) -> 0.5 * 0.2 / 0.5 = 0.2
    low, capped = cap_scalar_shares(torch.tensor([1.0, 0.1, 0.1]), mean_share_caps(torch.ones(3)))
    assert capped == [0] and low.tolist() == pytest.approx([0.2, 0.1, 0.1])


def test_two_teachers_get_a_warning_naming_the_strategy_and_the_count(tmp_path, flwr_log):
    """No cap can keep one of two teachers from half of the ensemble: a run whose ensembles
    have two says so at its start, naming the strategy and the count; three or more do not."""
    assert share_cap_warning("feddf", 3) is None and share_cap_warning("feddf", 10) is None
    text = share_cap_warning("fedgo", 2)
    assert text is not None and text.startswith("fedgo: its ensembles have 2 teachers")
    two = tiny_config(tmp_path, "strategy.name=feddf")  # 4 clients, fraction 0.5
    assert two.clients_per_round == 2 and FedDF.ensemble_teachers(two) == 2
    assert CoBoosting.ensemble_teachers(two) == 4 and FedAvg.ensemble_teachers(two) is None
    fake = SimpleNamespace(cfg=two, name="feddf", ensemble_teachers=FedDF.ensemble_teachers)
    Strategy.warn_share_cap(fake)  # type: ignore[arg-type]
    warned = {m for m in flwr_log.messages if "teachers" in m}
    assert len(warned) == 1 and warned.pop().startswith("feddf: its ensembles have 2 teachers")
    flwr_log.clear()
    fake.cfg = tiny_config(tmp_path, "strategy.name=feddf", "fraction=1.0")  # 4 a round
    Strategy.warn_share_cap(fake)  # type: ignore[arg-type]
    assert not [m for m in flwr_log.messages if "teachers" in m]


def test_the_learned_weights_cap_bounds_a_teacher_the_synthetic_labels_favour():
    """Eq. 12 on batches whose labels the attacker (teacher 0 of 10) predicts and the honest
    teachers do not (what synthetic samples aimed at its outputs would be), then the ensemble
    on real labels, where it is always wrong. Measured: after 200 uncapped steps its weight is
    1 and every other 0 (share 1.000, accuracy 0.003), capped at max(2/10, 3/10) = 0.3 its
    share is 0.300 and the accuracy 1.000 (margins asserted: 0.05 and 0.9)."""
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


@pytest.mark.parametrize("share_cap", [True, False])
def test_coboosting_share_cap_switch_reaches_the_engine(share_cap, monkeypatch, flwr_log):
    """``strategy.share_cap`` (default true) hands the engine the mean-share caps (0.3 each for
    ten equal clients, as the bound test above); ``false`` hands it none (eq. 12 as published,
    the uncapped column of that test: one teacher's share 1.000) and says so in a WARNING."""
    import strategies.coboosting as module

    built: list[dict] = []
    monkeypatch.setattr(module, "DataFreeDistillation", lambda *a, **kw: built.append(kw))
    params = module.CoBoostingConfig(share_cap=share_cap)
    fake = SimpleNamespace(
        name="coboosting",
        params=params,
        average=None,
        model_factory=lambda: torch.nn.Linear(2, 2),
        resources=SimpleNamespace(
            bundle=SimpleNamespace(
                train=SimpleNamespace(num_classes=C, input_shape=(2,), flip=False)
            ),
            device="cpu",
        ),
        cfg=SimpleNamespace(seed=0),
        teacher_modules=lambda: [],
        boost_settings=lambda: params.boost,
        data_size_weights=lambda: torch.full((10,), 0.1),
        student_arrays=lambda: {},
    )
    fake.build_engine = lambda initial: CoBoosting.build_engine(fake, initial)  # type: ignore[attr-defined]
    initial = {k: v.numpy() for k, v in torch.nn.Linear(2, 2).state_dict().items()}
    CoBoosting.after_clients(fake, initial)  # type: ignore[arg-type]
    caps = built[0]["share_caps"]
    warned = [m for m in flwr_log.messages if "share_cap: false" in m]
    if share_cap:
        assert caps.tolist() == pytest.approx([0.3] * 10) and not warned
    else:
        assert caps is None and len(warned) == 1
