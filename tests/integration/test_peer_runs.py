"""The Table-3 peers (issue 16) through the in-process grid: each one's reduction to the method
it extends, a short run, and the drops of its bad uploads (``tests/unit/test_peer_terms.py``
has the hand computations)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from clients.dafkd import DaFKDClient
from clients.fedtgp import FedTGPClient
from fedgo_app.inprocess import run_inprocess
from fedgo_flwr.protocol.dafkd import DISC_HEAD_KEY, GENERATOR_KEY
from fedgo_flwr.protocol.fedtgp import PROTOS_KEY
from fedgo_flwr.runtime.messages import to_numpy, to_record
from strategies import load_experiment
from strategies.dafkd import DaFKD
from strategies.feddf import FedDF

ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "data.num_clients=4",
    "data.train_subset=400",
    "data.test_subset=120",
    "fraction=0.5",
    "train.local_epochs=1",
]


def run(tmp_path: Path, *overrides: str, rounds: int = 2) -> list[dict]:
    cfg = load_experiment(
        ROOT / "conf/default.yaml",
        [f"rounds={rounds}", *TINY, f"output_dir={tmp_path}", *overrides],
    )
    run_inprocess(cfg)
    return [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def accuracies(rows: list[dict]) -> list[float]:
    return [r["test_accuracy"] for r in rows]


def test_feduv_end_to_end(tmp_path):
    rows = run(tmp_path, "strategy.name=feduv")
    assert all(math.isfinite(r["uv_var"]) and math.isfinite(r["uv_unif"]) for r in rows[1:])
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"]


def test_feddisco_end_to_end_and_its_reduction_to_fedavg(tmp_path):
    rows = run(tmp_path / "disco", "strategy.name=feddisco", "data.alpha=0.1")
    assert all(r["disco_weight_min"] < r["disco_weight_max"] for r in rows[1:])
    reduced = run(tmp_path / "ab0", "strategy.name=feddisco", "strategy.a=0", "strategy.b=0")
    fedavg = run(tmp_path / "fedavg", "strategy.name=fedavg")
    assert accuracies(reduced) == accuracies(fedavg)


def test_fedgkd_teacher_is_the_average_of_the_last_m_global_models(tmp_path):
    rows = run(
        tmp_path, "strategy.name=fedgkd", "strategy.buffer_length=2", "strategy.gamma=1.0", rounds=4
    )
    dist = [r["teacher_distance"] for r in rows[1:]]
    # rounds 1-2: the teacher is the model sent (empty buffer, then one model); then it differs
    assert dist[0] == 0 and dist[1] == 0 and dist[2] > 0 and dist[3] > 0
    assert "kd_loss" not in rows[1] and rows[2]["kd_loss"] > 0


def test_fedgkd_without_kd_is_fedavg_and_fedgkd_plus_is_feddf(tmp_path):
    off = ["strategy.gamma=0"]
    assert accuracies(run(tmp_path / "g", "strategy.name=fedgkd", *off)) == accuracies(
        run(tmp_path / "a", "strategy.name=fedavg")
    )
    distill = ["strategy.distill.epochs=1", "data.alpha=1.0"]
    assert accuracies(run(tmp_path / "gp", "strategy.name=fedgkd_plus", *off, *distill)) == (
        accuracies(run(tmp_path / "df", "strategy.name=feddf", *distill))
    )


def test_fedgkd_plus_sends_every_buffered_model_with_vote_weights(tmp_path):
    rows = run(
        tmp_path,
        "strategy.name=fedgkd_plus",
        "strategy.teacher=all",
        "strategy.vote_weights=val_loss",
        "strategy.val_fraction=0.2",
        "strategy.distill.epochs=1",
        "strategy.gamma=1.0",
        rounds=3,
    )
    assert rows[3]["teacher_distance"] > 0 and rows[3]["kd_loss"] > 0


# -- central training --------------------------------------------------------------------------
def test_central_trains_on_the_union_of_the_clients_data(tmp_path):
    rows = run(tmp_path, "strategy.name=central")
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"] + 0.1
    partition = json.loads((tmp_path / "partition.json").read_text())
    assert rows[1]["central_examples"] == sum(partition["client_sizes"])
    assert "clients_sampled" not in rows[1]


def test_fedtgp_without_its_term_is_fedavg(tmp_path):
    tgp = run(tmp_path / "tgp", "strategy.name=fedtgp", "strategy.lam=0", "strategy.tgp_epochs=2")
    fedavg = run(tmp_path / "fedavg", "strategy.name=fedavg")
    assert accuracies(tgp) == accuracies(fedavg)


def test_fedtgp_end_to_end(tmp_path):
    rows = run(
        tmp_path, "strategy.name=fedtgp", "strategy.lam=1.0", "strategy.tgp_epochs=5", rounds=3
    )
    assert all(math.isfinite(r["tgp_loss"]) and r["tgp_margin"] > 0 for r in rows[1:])
    assert all(0 <= r["proto_test_accuracy"] <= 1 for r in rows[1:])
    assert "proto_loss" not in rows[1] and rows[2]["proto_loss"] > 0  # prototypes from round 2


@pytest.mark.parametrize(
    "edit, reason",
    [
        # the intake checks the upload against its template; the counts are FedTGP's own check
        (lambda a: {**a, "protos": a["protos"] * np.nan}, "'protos' holds non-finite values"),
        (lambda a: {**a, "protos": a["protos"][:, :3]}, "'protos' has shape"),
        (lambda a: {**a, "counts": a["counts"] + 1}, "differ from the server's class counts"),
        (lambda a: {"protos": a["protos"]}, "keys differ from the server's"),
    ],
    ids=["nan", "shape", "counts", "keys"],
)
def test_fedtgp_drops_a_bad_upload(tmp_path, monkeypatch, edit, reason, caplog):
    original = FedTGPClient.train

    def bad(self, job):
        stats, extra = original(self, job)
        if job.partition_id == 1:
            extra[PROTOS_KEY] = to_record(edit(to_numpy(extra[PROTOS_KEY])))
        return stats, extra

    monkeypatch.setattr(FedTGPClient, "train", bad)
    rows = run(tmp_path, "strategy.name=fedtgp", "strategy.tgp_epochs=1", "fraction=1.0", rounds=1)
    assert rows[1]["clients_failed"] == 1 and rows[1]["clients_replied"] == 3
    assert reason in caplog.text


# -- DaFKD -------------------------------------------------------------------------------------
DAFKD = [
    "strategy.generator.latent_dim=8",
    "strategy.generator.width=8",
    "strategy.distill_size=64",
]


def test_dafkd_end_to_end(tmp_path, monkeypatch):
    import strategies.feddf as feddf_module

    generated = []
    original = feddf_module.distill

    def spy(*args, **kwargs):
        generated.append(kwargs["generated"])
        return original(*args, **kwargs)

    monkeypatch.setattr(feddf_module, "distill", spy)
    rows = run(tmp_path, "strategy.name=dafkd", *DAFKD, rounds=3)
    assert generated == [True, True]  # its BatchNorm statistics are put back (bn_stats: auto)
    assert "distill_steps" not in rows[1] and rows[2]["distill_steps"] > 0  # from round 2
    assert all(r["gan_d_loss"] > 0 and r["gan_g_loss"] > 0 for r in rows[1:])
    assert all(r["disc_prob_spread"] > 0 for r in rows[1:])  # not uniform weights
    assert all(math.isfinite(r["test_accuracy"]) for r in rows)


def test_dafkd_distillation_set_follows_the_generator(tmp_path, monkeypatch):
    seen = []
    original = DaFKD.begin_round

    def record(self, server_round):
        original(self, server_round)
        seen.append((server_round, self.distill_set.x.copy(), dict(self.generator)))

    monkeypatch.setattr(DaFKD, "begin_round", record)
    run(tmp_path / "a", "strategy.name=dafkd", *DAFKD, rounds=2)
    first = list(seen)
    seen.clear()
    run(tmp_path / "b", "strategy.name=dafkd", *DAFKD, rounds=2)
    for (_, x, _), (_, y, _) in zip(first, seen, strict=True):
        np.testing.assert_array_equal(x, y)  # reproducible per seed and round
    assert not np.array_equal(first[0][1], first[1][1])  # a new set every round
    g0, g1 = first[0][2], first[1][2]
    assert any(not np.array_equal(g0[k], g1[k]) for k in g0)  # from the averaged generator


@pytest.mark.parametrize(
    "key, edit, reason",
    [
        (DISC_HEAD_KEY, lambda a: {**a, "weight": a["weight"][:, :3]}, "disc_head"),
        (GENERATOR_KEY, lambda a: dict(list(a.items())[1:]), "generator"),
    ],
    ids=["head-shape", "generator-keys"],
)
def test_dafkd_drops_a_bad_upload(tmp_path, monkeypatch, key, edit, reason, caplog):
    original = DaFKDClient.train

    def bad(self, job):
        stats, extra = original(self, job)
        if job.partition_id == 1:
            extra[key] = to_record(edit(to_numpy(extra[key])))
        return stats, extra

    monkeypatch.setattr(DaFKDClient, "train", bad)
    rows = run(tmp_path, "strategy.name=dafkd", *DAFKD, "fraction=1.0", rounds=1)
    assert rows[1]["clients_failed"] == 1 and rows[1]["clients_replied"] == 3
    assert reason in caplog.text


# -- FedDF's other distillation sets -----------------------------------------------------------
def image_folders(tmp_path: Path) -> tuple[Path, Path]:
    """A 3-class 8x8 RGB image-folder data set and a public folder of 30 16x16 images."""
    from PIL import Image

    rng = np.random.default_rng(0)
    public = tmp_path / "public" / "nested"
    public.mkdir(parents=True)
    for i in range(30):
        Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(public / f"{i}.png")
    data = tmp_path / "data"
    for split, n in (("train", 16), ("test", 4)):
        for c in range(3):
            d = data / split / f"c{c}"
            d.mkdir(parents=True)
            for i in range(n):
                pixels = rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(d / f"{i}.png")
    return data, tmp_path / "public"


def test_feddf_distils_on_a_public_folder_of_another_size(tmp_path, monkeypatch):
    data, public = image_folders(tmp_path)
    sizes = []
    original = FedDF.begin_round

    def record(self, server_round):
        original(self, server_round)
        sizes.append((len(self.distill_set), tuple(self.distill_set.input_shape)))

    monkeypatch.setattr(FedDF, "begin_round", record)
    rows = run(
        tmp_path / "run",
        "strategy.name=feddf",
        "data.dataset=imagefolder",
        f"data.path={data}",
        "data.server_fraction=0",
        f"data.public_path={public}",
        "strategy.distill_size=20",
        "strategy.distill.epochs=1",
        "model.name=cnn",
    )
    assert sizes == [(20, (3, 8, 8))] * 2
    partition = json.loads((tmp_path / "run" / "partition.json").read_text())
    assert sum(partition["client_sizes"]) == 48  # nothing withheld for the server
    assert not any(k.startswith("pl_acc") for k in rows[1])  # no labels: no diagnostics


def test_a_public_folder_must_match_the_clients_channels(tmp_path):
    _, public = image_folders(tmp_path)
    with pytest.raises(ValueError, match="data.public_path.*channels differ"):
        run(tmp_path / "run", "strategy.name=feddf", f"data.public_path={public}")


# -- FedDF with clients of several architectures (FedDF Alg. 3) ----------------------------
MIXED = ["model.name=cnn", "model.client_models=[cnn, mlp]", "strategy.distill.epochs=1"]
MIXED += ["strategy.aggregation.rule=mean"]  # the one rule across architectures


def test_feddf_fuses_one_prototype_per_architecture(tmp_path, monkeypatch):
    sent = []
    original = FedDF.arrays_for

    def record(self, arch, arrays):
        out = original(self, arch, arrays)
        sent.append((arch, to_numpy(out)))
        return out

    monkeypatch.setattr(FedDF, "arrays_for", record)
    rows = run(tmp_path, "strategy.name=feddf", *MIXED, "fraction=1.0", rounds=2)
    assert all(0 <= r["test_accuracy_mlp"] <= 1 for r in rows[1:])
    assert rows[1]["clients_mlp"] == 2  # clients 1 and 3 train the mlp
    mlp = [a for arch, a in sent if arch == "mlp"]
    assert len(mlp) == 2 and any(not np.array_equal(mlp[0][k], mlp[1][k]) for k in mlp[0])
