"""benchmarks/discriminator_variants.py on digits: every variant's discriminators on the same
client models, reports and table, and the caches that make a rerun cheap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark
from helpers import SMALL_GAN

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def variants():
    return load_benchmark("discriminator_variants")


def test_variants_on_the_same_client_models(variants, tmp_path) -> None:
    args = [
        "--config", str(ROOT / "conf/fedgo.yaml"),
        "--variants", "paper", "server",
        "--test-subset", "120",
        "--work", str(tmp_path / "work"),
        "--out", str(tmp_path / "out"),
        "--override", "strategy.generator.steps=5", "train.local_epochs=1",
        "strategy.discriminator.epochs=1", "strategy.discriminator.reference_size=50",
        # 10 clients (the Byzantine report needs 10) on digits cut to 400 images, the small
        # generator of the golden runs: what is compared does not depend on their size.
        "data.num_clients=10", "data.train_subset=400", *SMALL_GAN,
    ]  # fmt: skip
    variants.main(args)
    paper = json.loads((tmp_path / "out/seed0/paper.json").read_text())
    server = json.loads((tmp_path / "out/seed0/server.json").read_text())
    # The same client models: every weighting without discriminators agrees across variants.
    for key in ("pl_uniform", "pl_n_k", "pl_oracle", "test_uniform", "owner_test_n_k"):
        assert paper[key] == server[key], key
    assert paper["pl_oracle"] >= paper["pl_uniform"]
    assert 0 <= server["auc_test"] <= 1 and 0 <= server["mean_sigmoid_test"] <= 1
    assert paper["reference_bytes_per_client"] == 0
    assert server["reference_bytes_per_client"] > 0
    assert {"pl_seen_fedgo", "pl_unseen_fedgo"} <= set(server)  # 50 of the server images sent
    assert "pl_seen_fedgo" not in paper  # the generator's samples were the negatives
    assert len(server["memo_auc"]) == 10 and all(0 <= a <= 1 for a in server["memo_auc"])
    assert "memo_auc" not in paper
    # Byzantine clients (App. F.8) on the same discriminators: under the exact odds they take
    # every sample, so the ensemble is theirs; n_k ignores the discriminators.
    assert paper["byz5_pl_n_k"] == paper["pl_n_k"]
    assert {
        "byz5_pl_fedgo",
        "byz10_pl_fedgo_single",
        "byz10_pl_fedgo_single_clip2",
        "byz10_pl_fedgo_single_cap0.1",
    } <= set(paper)
    table = (tmp_path / "out/table.md").read_text()
    assert "| paper |" in table and "| server |" in table
    assert "Memorisation AUC" in table
    # A deleted report is rebuilt from the cached discriminator logits, identically.
    (tmp_path / "out/seed0/server.json").unlink()
    variants.main(args)
    again = json.loads((tmp_path / "out/seed0/server.json").read_text())
    assert {k: v for k, v in again.items() if k != "wall_seconds"} == {
        k: v for k, v in server.items() if k != "wall_seconds"
    }
    # A variant that lacks one of the table's seeds says which seeds its row is over.
    (tmp_path / "out/seed1").mkdir()
    (tmp_path / "out/seed1/paper.json").write_text(json.dumps(paper))
    two = variants.table(tmp_path / "out")
    assert "Seeds: 0, 1 " in two
    assert "| paper | " in two and "| server (seed 0 only) | " in two


def test_memorisation_auc_is_half_for_fresh_looking_negatives_and_one_for_memorised(variants):
    import torch

    sent = torch.tensor([True, True, False, False])
    z = torch.tensor(
        [
            [-3.0, -2.0, 1.0, 2.0],  # its negatives scored below every other image: memorised
            [1.0, 2.0, 1.0, 2.0],  # the same scores on both: no trace of training on them
            [2.0, -1.0, 1.0, 0.0],  # pairs (unsent > sent): 1>-1, 0>-1; 2 of 4 -> 0.5
        ]
    )
    assert variants.memorisation_aucs(z, sent) == [1.0, 0.5, 0.5]


def test_longer_generators_come_from_one_training(variants, tmp_path, monkeypatch) -> None:
    """A variant's ``generator_steps`` gets the generator of a run with that budget, kept on
    the way of one training to the largest budget, with a sample grid of each; the weightings
    without Eq. (9)'s n_k are reported beside FedGO's."""
    import torch

    monkeypatch.setitem(
        variants.VARIANTS, "double-g7", {"loss": "double_sigmoid", "generator_steps": 7}
    )
    args = [
        "--config", str(ROOT / "conf/fedgo.yaml"),
        "--variants", "paper", "double-g7",
        "--test-subset", "60",
        "--work", str(tmp_path / "work"),
        "--out", str(tmp_path / "out"),
        "--override", "strategy.generator.steps=3", "train.local_epochs=1",
        "strategy.discriminator.epochs=1", "data.num_clients=4", "data.train_subset=200",
        *SMALL_GAN,
    ]  # fmt: skip
    variants.main(args)
    work, out = tmp_path / "work/seed0", tmp_path / "out/seed0"
    assert (work / "generator.pt").is_file() and (work / "generator-7.pt").is_file()
    assert (out / "generator-3.png").is_file() and (out / "generator-7.png").is_file()
    short = torch.load(work / "generator.pt")
    long = torch.load(work / "generator-7.pt")
    assert long["seconds"] > short["seconds"]
    assert any(not torch.equal(v, long["state"][k]) for k, v in short["state"].items())
    paper = json.loads((out / "paper.json").read_text())
    g7 = json.loads((out / "double-g7.json").read_text())
    assert (paper["generator_steps"], g7["generator_steps"]) == (3, 7)
    assert paper["pl_uniform"] == g7["pl_uniform"]  # the same client models
    assert {"pl_fedgo_odds", "pl_fedgo_single_odds"} <= set(g7)
    assert "| 7 (" in (tmp_path / "out/table.md").read_text()
