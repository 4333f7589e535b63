"""``benchmarks/generated_diversity.py``: the spread of a run's generated set and the classes
its server model sees in it."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from benchmark_scripts import load_benchmark
from helpers import held_one_thread
from torch import nn

from fedgo_app.inprocess import run_inprocess
from fedgo_flwr.records.checkpoint import read_checkpoint
from strategies import load_experiment

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def div():
    return load_benchmark("generated_diversity")


def test_spread_by_hand(div):
    same = torch.ones(5, 1, 2, 2)
    assert div.spread(same) == {"pixel_std": 0.0, "pairwise_distance": 0.0}
    two = torch.tensor([[0.0, 0.0], [3.0, 4.0]])  # one pair at distance 5
    got = div.spread(two)
    assert math.isclose(got["pairwise_distance"], 5.0)
    # per pixel: the sample std of (0, 3) and of (0, 4) (unbiased), averaged
    assert math.isclose(got["pixel_std"], (3 / math.sqrt(2) + 4 / math.sqrt(2)) / 2)
    with pytest.raises(ValueError, match="at least 2"):
        div.spread(torch.zeros(1, 3))


def test_predicted_classes_by_hand(div):
    model = nn.Flatten()  # the two inputs are the logits
    x = torch.tensor([[5.0, 0.0, 0.0], [5.0, 0.0, 0.0], [0.0, 5.0, 0.0], [0.0, 5.0, 0.0]])
    got = div.predicted_classes(model, x, num_classes=3, batch_size=3)
    assert got["histogram"] == [2, 2, 0]
    assert got["classes_predicted"] == 2
    assert math.isclose(got["effective_classes"], 2.0)  # two classes, equally often
    top = math.exp(5) / (math.exp(5) + 2)
    assert math.isclose(got["mean_top_probability"], top, rel_tol=1e-6)
    one = div.predicted_classes(model, x[:2], num_classes=3)
    assert one["classes_predicted"] == 1 and math.isclose(one["effective_classes"], 1.0)


def test_feature_distance_is_the_spread_of_what_enters_the_output_layer(div):
    x = torch.tensor([[0.0, 0.0], [3.0, 4.0], [6.0, 8.0], [0.0, 8.0]])
    model = nn.Sequential(nn.Linear(2, 3))  # the features are the inputs themselves
    assert math.isclose(
        div.feature_distance(model, x, train_mode=False), div.spread(x)["pairwise_distance"]
    )
    # with BatchNorm before the output layer, train mode normalises each batch by its own
    # statistics: batches of 2 become (-1, +1) per feature, whatever their scale
    bn = nn.Sequential(nn.BatchNorm1d(2, eps=1e-12, affine=False), nn.Linear(2, 3)).eval()
    before = {k: v.clone() for k, v in bn.state_dict().items()}
    pairs = x[:2] * 100
    assert math.isclose(
        div.feature_distance(bn, pairs, True, batch_size=2), 2 * math.sqrt(2), rel_tol=1e-6
    )
    assert math.isclose(div.feature_distance(bn, pairs, False), 500.0, rel_tol=1e-6)  # stats 0, 1
    assert all(torch.equal(before[k], v) for k, v in bn.state_dict().items()) and not bn.training


def test_train_mode_normalises_each_batch_by_its_own_statistics(div):
    from fedgo_flwr.data.arrays import ArrayDataset

    torch.manual_seed(0)
    gen = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4, eps=1e-12, affine=False)).eval()
    before = {k: v.clone() for k, v in gen.state_dict().items()}
    like = ArrayDataset(x=np.zeros((2, 4), np.float32), y=np.zeros(2, np.int64), num_classes=2)
    x = div.train_mode_set(gen, 12, 3, torch.Generator().manual_seed(1), 4, like)
    assert x.shape == (12, 4)
    for batch in x.split(4):  # each batch of 4: mean 0, biased variance 1 per feature
        assert torch.allclose(batch.mean(0), torch.zeros(4), atol=1e-6)
        assert torch.allclose(batch.var(0, unbiased=False), torch.ones(4), atol=1e-3)
    # the run's generator is untouched: its mode and running statistics
    assert not gen.training
    assert all(torch.equal(before[k], v) for k, v in gen.state_dict().items())
    # in eval mode the same codes go through the running statistics (mean 0, var 1) instead
    z = torch.randn(12, 3, generator=torch.Generator().manual_seed(1))
    assert not torch.allclose(x, gen(z), atol=1e-3)


TINY_DAFKD = [
    "data.num_clients=4",
    "fraction=0.5",
    "train.local_epochs=1",
    "strategy.name=dafkd",
    "strategy.generator.latent_dim=8",
    "strategy.generator.width=8",
    "strategy.distill_size=64",
]


@pytest.fixture(scope="module")
def dafkd_run(tmp_path_factory) -> Path:
    """A finished 2-round DaFKD run on the digits."""
    out = tmp_path_factory.mktemp("dafkd")
    with held_one_thread():
        run_inprocess(
            load_experiment(
                ROOT / "conf/default.yaml", [*TINY_DAFKD, "rounds=2", f"output_dir={out}"]
            )
        )
    return out


def test_on_a_dafkd_run(div, dafkd_run):
    tmp_path = dafkd_run
    result = div.main([str(tmp_path), "--samples", "40"])
    assert result["generator"] == "checkpoint.pt (round 2)" and result["model_round"] == 2
    for which in ("generated", "real"):
        got = result[which]
        assert got["pixel_std"] > 0 and got["pairwise_distance"] > 0
        assert got["feature_distance"] > 0
        assert sum(got["histogram"]) == 40
    # the generator is the checkpoint's: round 1's is another one, the real images the same
    prev = div.main([str(tmp_path), "--samples", "40", "--checkpoint", "prev"])
    assert prev["model_round"] == 1 and prev["generator"] == "checkpoint.prev.pt (round 1)"
    assert prev["generated"]["pixel_std"] != result["generated"]["pixel_std"]
    assert prev["real"]["pixel_std"] == result["real"]["pixel_std"]  # the same real images
    # train mode: the same generator and codes, another normalisation, another set
    train = div.main([str(tmp_path), "--samples", "40", "--mode", "train", "--batch-size", "8"])
    assert train["mode"] == "train" and result["mode"] == "eval"
    assert sum(train["generated"]["histogram"]) == 40
    assert train["generated"]["pixel_std"] != result["generated"]["pixel_std"]
    assert train["real"] == result["real"]


def test_a_run_without_generator_is_refused(div, tmp_path):
    cfg = load_experiment(
        ROOT / "conf/default.yaml",
        ["rounds=1", "data.num_clients=4", "fraction=0.5", f"output_dir={tmp_path}"],
    )
    run_inprocess(cfg)
    with pytest.raises(SystemExit, match="has no generator"):
        div.main([str(tmp_path), "--samples", "10"])


def test_generator_rounds_keeps_every_round_and_measures_both_modes(
    div, dafkd_run, tmp_path, monkeypatch
):
    rounds_mod = load_benchmark("generator_rounds")
    calls: list[list[str]] = []

    def in_process(cmd, log, **_):  # the child's entry, without a new interpreter
        assert cmd[1:4] == ["-m", "benchmarks.generator_rounds", "--child"]
        calls.append(cmd[4:])
        rounds_mod.main(cmd[3:])
        return 0.0

    monkeypatch.setattr(rounds_mod, "run_command", in_process)
    tiny = TINY_DAFKD
    out = tmp_path / "rounds"
    argv = ["conf/default.yaml", "--out", str(out), "--rounds", "2", "--samples", "40", *tiny]
    results = rounds_mod.main(argv)
    assert [(r["model_round"], r["mode"]) for r in results] == [
        (1, "eval"),
        (1, "train"),
        (2, "eval"),
        (2, "train"),
    ]
    assert [c[-3] for c in calls] == [f"output_dir={out / 'run'}"] * 2
    assert [c[-4] for c in calls] == ["rounds=1", "rounds=2"]
    # round 1's generator is kept: another one than round 2's
    assert results[0]["generated"] != results[2]["generated"]
    # round 2, reached by resuming, is the straight 2-round run's
    straight = dafkd_run
    a = read_checkpoint(out / "round-2" / "checkpoint.pt")
    b = read_checkpoint(straight / "checkpoint.pt")
    assert a.round == b.round == 2
    assert a.arrays.keys() == b.arrays.keys()
    assert all(np.array_equal(a.arrays[k], b.arrays[k]) for k in a.arrays)
    assert div.main([str(straight), "--samples", "40"])["generated"] == results[2]["generated"]
    table = (out / "table.md").read_text()
    assert table.count("\n| 1 | ") == 2 and table.count("\n| 2 | ") == 2
    # a second call runs nothing: every round is kept
    calls.clear()
    assert rounds_mod.main(argv) == results and not calls
    with pytest.raises(SystemExit):
        rounds_mod.main([*argv, "rounds=3"])
