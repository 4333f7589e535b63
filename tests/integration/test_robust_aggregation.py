"""Robust aggregation: ``strategy.aggregation`` (median, trimmed mean, update clipping) for every
parameter-averaging strategy and ``strategy.weight_cap`` for the distillation weightings.

The math is tested on plain arrays; the runs poison one client of six (its parameters times
-10 each round, a model-replacement-style attack) on the embedded digits data and compare the
final test accuracy with the clean run's.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import strategies
from clients.fedavg import FedAvgClient
from clients.scaffold import ScaffoldClient
from fedgo_app.inprocess import run_inprocess
from fedgo_flwr.config.experiment import ConfigError
from fedgo_flwr.learning.aggregation import (
    AggregationConfig,
    ReplyStack,
    RunningAverage,
    clip_update,
    coordinate_median,
    new_average,
    trimmed_mean,
    update_norm,
    weighted_average,
)
from fedgo_flwr.weighting import WeightingInputs, cap_weights, compute_weights
from strategies import load_experiment, strategy_class

ROOT = Path(__file__).resolve().parents[2]


def models(*values: float) -> list[dict[str, np.ndarray]]:
    """One array set per value: a float32 weight filled with it and an int64 counter."""
    return [
        {"w": np.full((2, 3), v, dtype=np.float32), "n": np.asarray(np.int64(i + 1))}
        for i, v in enumerate(values)
    ]


# -- the rules ---------------------------------------------------------------------------------
def test_median_is_coordinatewise_and_ignores_one_outlier():
    a = models(1.0, 2.0, 3.0, 1e6)
    a[0]["w"][0, 0] = 10.0  # coordinate (0, 0): 10, 2, 3, 1e6 -> median 6.5
    out = coordinate_median(a[:3] + [a[3]])
    assert out["w"].dtype == np.float32 and out["w"].shape == (2, 3)
    assert out["w"][0, 0] == 6.5
    assert np.all(out["w"].ravel()[1:] == 2.5)  # 1, 2, 3, 1e6: the mean of the middle two
    assert coordinate_median(models(1.0, 2.0, 1e9))["w"][1, 1] == 2.0


def test_trimmed_mean_drops_floor_beta_m_at_each_end():
    a = models(-1e6, 1.0, 2.0, 3.0, 1e6)
    assert trimmed_mean(a, 0.2)["w"][0, 0] == 2.0  # floor(0.2 * 5) = 1 dropped at each end
    assert trimmed_mean(a, 0.39)["w"][0, 0] == 2.0  # floor(1.95) = 1
    assert trimmed_mean(a, 0.4)["w"][0, 0] == 2.0  # floor(2) = 2: the median
    # Nothing trimmed: the unweighted mean (the rules ignore n_k, Yin et al. 2018).
    b = models(1.0, 2.0, 6.0)
    assert trimmed_mean(b, 0.1)["w"][0, 0] == 3.0
    with pytest.raises(ValueError, match="trim_fraction"):
        trimmed_mean(b, 0.5)


def test_integer_buffers_keep_their_dtype():
    a = models(1.0, 2.0, 3.0, 4.0)  # counters 1, 2, 3, 4
    for out in (coordinate_median(a), trimmed_mean(a, 0.25)):
        assert out["n"].dtype == np.int64 and out["n"].shape == ()
        assert int(out["n"]) in (2, 3)  # 2.5 rounded to even
    clipped, did = clip_update(a[3], a[0], 0.5)
    assert did and clipped["n"].dtype == np.int64 and int(clipped["n"]) == 4  # as received


def test_clip_update_scales_a_long_update_to_the_bound():
    x = {"w": np.zeros((2, 2), np.float32), "b": np.ones(3, np.float64)}
    y = {"w": np.full((2, 2), 3.0, np.float32), "b": np.full(3, 5.0)}  # ||y - x|| = sqrt(84)
    assert update_norm(y, x) == pytest.approx(np.sqrt(84))
    out, did = clip_update(y, x, 2.0)
    assert did
    assert update_norm(out, x) == pytest.approx(2.0, rel=1e-6)
    assert out["w"].dtype == np.float32 and out["b"].dtype == np.float64
    scale = 2.0 / np.sqrt(84)
    np.testing.assert_allclose(out["w"], 3.0 * scale, rtol=1e-6)  # same direction
    np.testing.assert_allclose(out["b"], 1.0 + 4.0 * scale)


def test_clip_update_keeps_a_short_update():
    x = {"w": np.zeros(4, np.float32)}
    y = {"w": np.full(4, 0.5, np.float32)}  # norm 1
    out, did = clip_update(y, x, 1.0)
    assert not did and out["w"] is y["w"]
    with pytest.raises(ValueError, match="clip_norm"):
        clip_update(y, x, 0.0)


def test_a_huge_update_is_clipped_without_overflow():
    # Squares of 1e308 overflow float64; the norm is computed scaled by the largest entry.
    x = {"w": np.zeros(2), "v": np.zeros(3, np.float32)}
    y = {"w": np.full(2, 1e308), "v": np.full(3, 1e-30, np.float32)}
    assert update_norm(y, x) == pytest.approx(np.sqrt(2) * 1e308)
    out, did = clip_update(y, x, 1.0)
    assert did and np.isfinite(out["w"]).all()
    np.testing.assert_allclose(out["w"], np.sqrt(0.5))
    assert update_norm(out, x) == pytest.approx(1.0)


def test_the_mean_rule_is_the_weighted_running_mean():
    a = models(1.0, 2.0, 4.0)
    avg = new_average(AggregationConfig(rule="mean"))
    assert isinstance(avg, RunningAverage)
    for arrays, n in zip(a, (1, 1, 2), strict=True):
        avg.add(arrays, n)
    assert avg.result()["w"][0, 0] == weighted_average(a, [1, 1, 2])["w"][0, 0] == 2.75
    stack = new_average(AggregationConfig(rule="median"))
    assert isinstance(stack, ReplyStack)
    for arrays, n in zip(a, (1, 1, 2), strict=True):
        stack.add(arrays, n)
    assert stack.count == 3 and stack.result()["w"][0, 0] == 2.0  # unweighted


# -- configuration -------------------------------------------------------------------------
def averaging_strategies() -> list[str]:
    """Every strategy found by name whose parameters have the ``aggregation`` section."""
    return [
        name
        for name in strategies.available()
        if "aggregation" in {f.name for f in dataclasses.fields(strategy_class(name).Config)}
    ]


def test_the_parameter_averaging_strategies_have_the_aggregation_section():
    assert {"fedavg", "fedprox", "scaffold", "feddf", "fedgo"} <= set(averaging_strategies())


@pytest.mark.parametrize("strategy", averaging_strategies())
def test_every_averaging_strategy_takes_the_aggregation_section(strategy):
    def load(rule: str):
        return load_experiment(
            ROOT / "conf/default.yaml",
            [
                f"strategy.name={strategy}",
                f"strategy.aggregation.rule={rule}",
                "strategy.aggregation.trim_fraction=0.25",
                "strategy.aggregation.clip_norm=3",
            ],
        )

    cfg = load("trimmed_mean")
    assert cfg.strategy.params.aggregation == AggregationConfig("trimmed_mean", 0.25, 3.0)
    default = load_experiment(ROOT / "conf/default.yaml", [f"strategy.name={strategy}"])
    assert default.strategy.params.aggregation == AggregationConfig()  # mean, no clipping


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("strategy.aggregation.rule=mode", "strategy.aggregation.rule"),
        ("strategy.aggregation.trim_fraction=0.5", "strategy.aggregation.trim_fraction"),
        ("strategy.aggregation.trim_fraction=-0.1", "strategy.aggregation.trim_fraction"),
        ("strategy.aggregation.trim_fraction=.nan", "strategy.aggregation.trim_fraction"),
        ("strategy.aggregation.clip_norm=0", "strategy.aggregation.clip_norm"),
        ("strategy.aggregation.clip_norm=-1", "strategy.aggregation.clip_norm"),
        ("strategy.aggregation.clip_norm=.inf", "strategy.aggregation.clip_norm"),
        ("strategy.aggregation.clip_norm=.nan", "strategy.aggregation.clip_norm"),
        ("strategy.aggregation.clipnorm=1", "strategy.aggregation.clipnorm"),
    ],
)
def test_bad_aggregation_values_name_their_key(override, key):
    with pytest.raises(ConfigError) as info:
        load_experiment(ROOT / "conf/default.yaml", [override])
    assert info.value.key == key


def test_a_trimmed_mean_that_trims_no_client_is_rejected():
    # 8 clients per round (default): floor(0.1 * 8) = 0 would trim nothing.
    with pytest.raises(ConfigError, match="trims no client of the 8 per round") as info:
        load_experiment(
            ROOT / "conf/default.yaml",
            ["strategy.aggregation.rule=trimmed_mean", "strategy.aggregation.trim_fraction=0.1"],
        )
    assert info.value.key == "strategy.aggregation.trim_fraction"
    # With 2 clients per round no allowed fraction (< 0.5) trims one; the error says so.
    two = ["data.num_clients=4", "fraction=0.5", "strategy.aggregation.rule=trimmed_mean"]
    with pytest.raises(ConfigError, match="needs 3 or more clients per round") as info:
        load_experiment(
            ROOT / "conf/default.yaml", [*two, "strategy.aggregation.trim_fraction=0.4999999999"]
        )
    assert info.value.key == "strategy.aggregation.trim_fraction"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("0", "must be in"),
        ("1.5", "must be in"),
        (".nan", "must be a finite number"),
        ("0.1", "infeasible"),
    ],
)
def test_bad_weight_caps_are_rejected(value, problem):
    # 8 clients per round: a cap of 0.1 leaves 0.8 of every sample's weight to nobody.
    with pytest.raises(ConfigError, match=problem) as info:
        load_experiment(ROOT / "conf/fedgo.yaml", [f"strategy.weight_cap={value}"])
    assert info.value.key == "strategy.weight_cap"
    cfg = load_experiment(ROOT / "conf/fedgo.yaml", ["strategy.weight_cap=0.125"])
    assert cfg.strategy.params.weight_cap == 0.125


# -- the weight cap --------------------------------------------------------------------------
def test_capped_weights_sum_to_one_and_stay_below_the_cap():
    gen = torch.Generator().manual_seed(0)
    for k, cap in [(2, 0.5), (3, 0.4), (5, 0.25), (8, 0.2), (8, 0.125), (20, 0.06)]:
        raw = torch.rand(k, 300, generator=gen, dtype=torch.float64) ** 8  # skewed
        raw[:, :50] = 0.0
        raw[0, :50] = 1.0  # one client holds every weight on 50 samples
        w = raw / raw.sum(0, keepdim=True)
        capped = cap_weights(w, cap)
        assert capped.dtype == w.dtype
        assert torch.allclose(capped.sum(0), torch.ones(300, dtype=torch.float64))
        assert bool((capped <= cap + 1e-12).all()) and bool((capped >= 0).all())
        # Within each sample the order is kept (proportional redistribution).
        for i in range(50, 300):
            order = torch.argsort(w[:, i])
            assert bool((capped[order, i].diff() >= -1e-12).all())


def test_weights_already_within_the_cap_are_unchanged():
    w = torch.tensor([[0.3, 0.2], [0.3, 0.7], [0.4, 0.1]], dtype=torch.float32)
    assert cap_weights(w, 0.7) is w  # every column within: the same tensor
    capped = cap_weights(w, 0.5)
    assert torch.equal(capped[:, 0], w[:, 0])  # this column was within the cap
    assert torch.allclose(capped[:, 1], torch.tensor([0.5 * 2 / 3, 0.5, 0.5 / 3]))
    with pytest.raises(ValueError, match="infeasible"):
        cap_weights(w, 0.3)


def test_single_sigmoid_fedgo_with_one_huge_logit_no_longer_takes_everything():
    k, n = 4, 5
    disc = torch.zeros(k, n)
    disc[2] = 1000.0  # client 2's discriminator claims every sample
    inputs = WeightingInputs(
        logits=torch.randn(k, n, 3), num_examples=torch.ones(k), disc_logits=disc
    )
    w = compute_weights("fedgo", inputs, disc_mode="sigmoid")
    assert torch.equal(w[2], torch.ones(n))  # today: weight 1.0, the others 0
    capped = cap_weights(w, 0.4)
    assert torch.allclose(capped[2], torch.full((n,), 0.4))
    assert torch.allclose(capped[[0, 1, 3]], torch.full((3, n), 0.2))  # zeros share the rest
    assert torch.allclose(capped.sum(0), torch.ones(n))


# -- runs -------------------------------------------------------------------------------------
RUN = [
    "rounds=8",
    "data.num_clients=6",
    "fraction=1.0",
    "train.local_epochs=3",
    "data.alpha=10",
    "checkpoint=false",
    "eval.every=8",  # the tests read the last round's accuracy; every round's other columns
]
MEAN = "strategy.aggregation.rule=mean"  # FedAvg's mean (the default rule is consensus)
NO_CLIP = (MEAN, "strategy.aggregation.clip_factor=null")  # the plain mean, no relative clip
MARGIN = 0.10
"""A robust run's final test accuracy stays within this of the clean run's (measured: clean
0.881; poisoned mean 0.103, median 0.861, trimmed mean 0.861, clip_norm 1.0 0.822, consensus
0.883)."""


def poison(monkeypatch, cls: type, partition: int = 0, scale: float = -10.0) -> None:
    """Partition ``partition``'s replies carry its trained parameters times ``scale``."""
    honest = cls.train

    def train(self, job):
        stats, extra = honest(self, job)
        if job.partition_id == partition:
            with torch.no_grad():
                for p in job.model.parameters():
                    p.mul_(scale)
        return stats, extra

    monkeypatch.setattr(cls, "train", train)


def final_rows(tmp_path: Path, name: str, *overrides: str) -> list[dict]:
    out = tmp_path / name
    cfg = load_experiment(ROOT / "conf/default.yaml", [*RUN, f"output_dir={out}", *overrides])
    run_inprocess(cfg)
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_fedavg_with_a_poisoned_client_stays_near_the_clean_run(tmp_path, monkeypatch):
    clean = final_rows(tmp_path, "clean")[-1]["test_accuracy"]
    assert clean > 0.8
    poison(monkeypatch, FedAvgClient)
    plain = final_rows(tmp_path, "mean", *NO_CLIP)[-1]["test_accuracy"]
    assert plain < 0.2  # the n_k-weighted mean collapses (10 classes: chance is 0.1)
    # The mean clips the update to clip_factor typical ones: far less harm, not none (a -10x
    # model every round is still 10 updates against the honest 5).
    clipped_mean = final_rows(tmp_path, "clipped-mean", MEAN)
    assert clipped_mean[-1]["test_accuracy"] > plain + 0.15
    assert all(r["clients_clipped_relative"] == 1 for r in clipped_mean[1:] if "train_loss" in r)
    for name, overrides in {
        "median": ["strategy.aggregation.rule=median"],
        "trimmed": ["strategy.aggregation.rule=trimmed_mean"],  # floor(0.2 * 6) = 1 per end
        "clipped": [MEAN, "strategy.aggregation.clip_norm=1.0"],
        "consensus": [],  # the default
    }.items():
        rows = final_rows(tmp_path, name, *overrides)
        assert rows[-1]["test_accuracy"] >= clean - MARGIN, (name, rows[-1])
        if name == "clipped":  # the poisoned client, every round
            assert all(r["clients_clipped"] >= 1 for r in rows[1:])
        if name == "consensus":  # partition 0's -10x model is the one it hardly trusts
            trained = [r for r in rows[1:] if "train_loss" in r]
            assert trained and all(r["consensus_trust_client"] == 0 for r in trained)
            assert all(r["consensus_trust_min"] < 0.5 for r in trained)  # measured: 0.03-0.29


@pytest.mark.slow  # three 8-round runs (about 10 s on an idle core); FedAvg's test is the fast one
def test_scaffold_median_with_a_poisoned_model_update(tmp_path, monkeypatch):
    # The rule covers SCAFFOLD's model update; the poisoned client's control delta is honest
    # here (the model is scaled after the client computed it).
    clean = final_rows(tmp_path, "clean", "strategy.name=scaffold")[-1]["test_accuracy"]
    poison(monkeypatch, ScaffoldClient)
    plain = final_rows(tmp_path, "mean", "strategy.name=scaffold", *NO_CLIP)[-1]["test_accuracy"]
    robust = final_rows(
        tmp_path, "median", "strategy.name=scaffold", "strategy.aggregation.rule=median"
    )[-1]["test_accuracy"]
    assert plain < 0.2 <= clean - MARGIN <= robust


def test_feddf_starts_distillation_from_the_robust_average(tmp_path, monkeypatch):
    poison(monkeypatch, FedAvgClient)
    feddf = ["strategy.name=feddf", "rounds=1", "strategy.distill.epochs=1"]
    plain = final_rows(tmp_path, "mean", *feddf, *NO_CLIP)[-1]["init_test_accuracy"]
    robust = final_rows(tmp_path, "median", *feddf, "strategy.aggregation.rule=median")
    assert plain < 0.2 and robust[-1]["init_test_accuracy"] > 0.2


def test_feddf_pseudo_labels_use_the_capped_weights(tmp_path, monkeypatch):
    import strategies.feddf as feddf

    seen: list[float] = []
    original = feddf.pseudo_labels

    def recording(logits, weights, temperature=1.0):
        seen.append(float(weights.max()))
        return original(logits, weights, temperature)

    monkeypatch.setattr(feddf, "pseudo_labels", recording)
    args = ["strategy.name=feddf", "rounds=1", "strategy.distill.epochs=1", "data.alpha=0.1"]
    final_rows(tmp_path, "plain", *args, "strategy.weighting=data_size")
    final_rows(tmp_path, "capped", *args, "strategy.weighting=data_size", "strategy.weight_cap=0.2")
    assert seen[0] > 0.2 and seen[1] <= 0.2 + 1e-6


def test_feddisco_takes_its_weights_into_the_robust_rules(tmp_path, monkeypatch):
    """FedDisco's weighted mean (without the relative clip) takes a client whose model is its
    trained one times -10 at its weight p_k and collapses; the weighted median and trimmed
    mean (FedDisco's p_k, the poisoned client below half of them) stay near the clean run."""
    disco = ["strategy.name=feddisco"]
    clean = final_rows(tmp_path, "clean", *disco)[-1]["test_accuracy"]
    poison(monkeypatch, FedAvgClient)
    plain = final_rows(tmp_path, "mean", *disco, *NO_CLIP)[-1]["test_accuracy"]
    assert plain < 0.2 <= clean - MARGIN
    for rule in ("median", "trimmed_mean"):
        rows = final_rows(tmp_path, rule, *disco, f"strategy.aggregation.rule={rule}")
        assert rows[-1]["test_accuracy"] >= clean - MARGIN, (rule, rows[-1])
        assert all(r["disco_weight_max"] < 0.5 for r in rows[1:])
