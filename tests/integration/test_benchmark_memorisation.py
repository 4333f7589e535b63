"""``benchmarks/reference_memorisation.py``: do server-referenced discriminators score the server
images they were trained against lower than images they never saw?"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from benchmark_scripts import load_benchmark
from helpers import ROOT, TINY_RUN, held_one_thread

from fedgo_app.inprocess import run_inprocess
from fedgo_flwr.learning.task import make_partition
from strategies import load_experiment

SERVER_REFERENCE = [
    "strategy.name=fedgo",
    "strategy.weighting=fedgo",
    "strategy.discriminator.reference=server",
    "strategy.discriminator.reference_size=20",
    "strategy.discriminator.spectral_norm=true",
    "strategy.discriminator.epochs=2",
    "strategy.distill.epochs=1",
    "data.alpha=1.0",
]


@pytest.fixture(scope="module")
def memo():
    return load_benchmark("reference_memorisation")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("memo") / "run"
    with held_one_thread():
        run_inprocess(
            load_experiment(
                ROOT / "conf/default.yaml", [*TINY_RUN, f"output_dir={out}", *SERVER_REFERENCE]
            )
        )
    return out


def test_the_auc_by_hand(memo):
    seen = torch.tensor([[0.0, 1.0], [2.0, 3.0], [0.0, 2.0]])
    unseen = torch.tensor([[2.0, 3.0], [0.0, 1.0], [1.0, 3.0]])
    # row 0: every unseen logit above every seen one; row 1: below; row 2: 3 of 4 pairs above
    assert memo.memorisation_aucs(seen, unseen) == [1.0, 0.0, 0.75]
    assert memo.memorisation_aucs(torch.ones(1, 3), torch.ones(1, 2)) == [0.5]  # all tied


def test_a_runs_discriminators_on_the_reference_and_on_unseen_images(memo, run_dir, capsys):
    cfg = load_experiment(ROOT / "conf/default.yaml", [*TINY_RUN, *SERVER_REFERENCE])
    server = len(make_partition(cfg).server)
    with held_one_thread():
        rest = memo.main([str(run_dir)])
        test = memo.main([str(run_dir), "--unseen", "test"])
    assert rest["seen"] == test["seen"] == 20  # reference_size
    assert rest["unseen"] == f"{server - 20} server images outside the reference"
    assert test["unseen"] == "120 the test split"  # data.test_subset
    for result in (rest, test):
        assert sorted(result["memo_auc"]) == [0, 1, 2, 3]  # every client's discriminator
        aucs = list(result["memo_auc"].values())
        assert all(0.0 <= a <= 1.0 for a in aucs)
        assert result["memo_auc_mean"] == pytest.approx(np.mean(aucs))
        assert result["discriminator"] == {"epochs": 2, "spectral_norm": True, "reference_size": 20}
    assert capsys.readouterr().out.count('"memo_auc"') == 2


def test_a_run_without_server_reference_is_refused(memo, tmp_path):
    out = tmp_path / "fedavg"
    with held_one_thread():
        run_inprocess(load_experiment(ROOT / "conf/default.yaml", [*TINY_RUN, f"output_dir={out}"]))
    with pytest.raises(SystemExit, match="not a run with strategy.discriminator.reference"):
        memo.main([str(out)])


def test_longer_training_against_a_small_reference_memorises_it(memo, run_dir, tmp_path):
    """20 reference images: 10 epochs against them leave the discriminators scoring them lower
    than the other server images, more so than 2 epochs (the measure sees memorisation)."""
    out = tmp_path / "ten"
    overrides = [*TINY_RUN, f"output_dir={out}", *SERVER_REFERENCE]
    with held_one_thread():
        run_inprocess(
            load_experiment(
                ROOT / "conf/default.yaml", [*overrides, "strategy.discriminator.epochs=10"]
            )
        )
        short, long = memo.main([str(run_dir)]), memo.main([str(out)])
    assert long["memo_auc_mean"] > short["memo_auc_mean"] > 0.5
    assert long["mean_logit_seen"] < long["mean_logit_unseen"]
