"""Strategy logic through the in-process grid (same ServerApp/ClientApp code, no Ray)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord
from helpers import SMALL_GAN, TINY_RUN

from clients.fedavg import FedAvgClient
from clients.fedgo import FedGOClient
from fedgo_app.inprocess import run_inprocess
from fedgo_flwr.config.experiment import ConfigError
from fedgo_flwr.learning.task import make_partition, sample_clients
from fedgo_flwr.protocol import RoundIntake
from fedgo_flwr.protocol.fedgo import CRITIC_KEY, GENERATOR_KEY
from strategies import load_experiment
from strategies._prefl import seeded_generator

ROOT = Path(__file__).resolve().parents[2]
TINY = [*TINY_RUN, "rounds=2"]


def run(tmp_path: Path, *overrides: str) -> list[dict]:
    cfg = load_experiment(ROOT / "conf/default.yaml", [*TINY, f"output_dir={tmp_path}", *overrides])
    run_inprocess(cfg)
    return [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def test_inprocess_matches_its_own_rerun(tmp_path):
    a = run(tmp_path / "a", "strategy.name=scaffold")
    b = run(tmp_path / "b", "strategy.name=scaffold")
    assert [r["test_accuracy"] for r in a] == [r["test_accuracy"] for r in b]


def test_rounds_record_the_clients_handler_time_around_their_training(tmp_path):
    """The train handler's whole time (set-up, training, reply) comes back with each reply and
    is summed per round; it includes the training time (benchmarks/overhead.py splits on it)."""
    rows = [r for r in run(tmp_path) if r["round"] > 0]
    assert len(rows) == 2
    for r in rows:
        assert r["client_handler_time_sum"] >= r["client_time_sum"] > 0


def test_feddf_records_distillation_and_diagnostics(tmp_path):
    rows = run(tmp_path, "strategy.name=feddf", "strategy.distill.epochs=2", "data.alpha=1.0")
    last = rows[-1]
    for key in (
        "distill_loss",
        "teacher_time",
        "distill_time",
        "ensemble_test_accuracy",
        "init_test_accuracy",
        "pl_acc_uniform",
        "pl_acc_oracle",
        "pl_acc_entropy",
    ):
        assert key in last, key
    assert last["distill_steps"] > 0 and np.isfinite(last["distill_loss"])
    assert 0 <= last["pl_acc_oracle"] <= 1
    # Distillation changed the model: the result differs from the parameter average.
    assert last["test_loss"] != pytest.approx(last["init_test_loss"], rel=1e-6)


def test_fedavg_runs_without_server_data(tmp_path):
    """``data.server_fraction: 0``: every sample is a client's, and FedAvg needs none on the
    server (FedDF and FedGO on server data refuse it, tests/unit/test_config.py)."""
    rows = run(tmp_path, "data.server_fraction=0")
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert all(np.isfinite(r["test_loss"]) for r in rows)
    assert [r["clients_replied"] for r in rows[1:]] == [2, 2]
    partition = json.loads((tmp_path / "partition.json").read_text())
    assert partition["server_size"] == 0


@pytest.mark.parametrize("strategy", ["fedavg", "feddf"])
def test_batch_norm_model_runs_and_its_buffers_are_averaged(tmp_path, strategy):
    # BatchNorm buffers (running statistics, the 0-d num_batches_tracked) travel with the
    # weights and are averaged too; the saved model loads back into the architecture.
    rows = run(tmp_path, "model.name=cnn_bn", f"strategy.name={strategy}")
    assert len(rows) == 3 and all(np.isfinite(r["test_loss"]) for r in rows)
    state = torch.load(tmp_path / "model.pt")
    tracked = [v for k, v in state.items() if k.endswith("num_batches_tracked")]
    assert tracked and all(t.ndim == 0 and int(t) > 0 for t in tracked)
    from fedgo_flwr.models.classifiers import build_model

    build_model("cnn_bn", (1, 8, 8), 10).load_state_dict(state)


def test_feddf_with_fedgo_weighting_is_rejected_before_the_run():
    with pytest.raises(
        ConfigError, match="strategy.weighting = 'fedgo': 'fedgo' needs client discriminators"
    ):
        load_experiment(
            ROOT / "conf/default.yaml", ["strategy.name=feddf", "strategy.weighting=fedgo"]
        )


def test_feddf_protocol_with_validation_split(tmp_path):
    rows = run(
        tmp_path,
        "strategy.name=feddf",
        "strategy.distill.protocol=feddf",
        "strategy.val_fraction=0.2",
        "strategy.distill.max_steps=60",
        "strategy.distill.eval_every=20",
        "strategy.distill.patience=40",
    )
    assert 0 < rows[-1]["distill_steps"] <= 60


def test_a_crashing_client_is_survived(tmp_path, monkeypatch):
    """The first sampled client raises in every round; rounds complete with the other one."""
    crash = {r: sample_clients(0, r, 4, 2)[0] for r in (1, 2)}
    original = FedAvgClient.train

    def flaky(self, job):
        if job.partition_id == crash[job.server_round]:
            raise RuntimeError("injected crash")
        return original(self, job)

    monkeypatch.setattr(FedAvgClient, "train", flaky)
    rows = run(tmp_path, "strategy.name=feddf", "strategy.distill.epochs=1", "data.alpha=1.0")
    for row in rows[1:]:
        assert row["clients_sampled"] == 2
        assert row["clients_replied"] == 1 and row["clients_failed"] == 1
        assert np.isfinite(row["test_accuracy"])
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"]


FEDGO = [
    "strategy.name=fedgo",
    "strategy.distill.epochs=2",
    "strategy.generator.steps=5",
    "strategy.discriminator.epochs=1",
    "data.alpha=1.0",
    *SMALL_GAN,
]


def test_fedgo_prefl_stage_saves_and_reports(tmp_path):
    rows = run(tmp_path, *FEDGO)
    prefl = json.loads((tmp_path / "prefl.json").read_text())
    assert prefl["generator"]["steps"] == 5
    assert sorted(prefl["discriminators"]) == ["0", "1", "2", "3"]  # all K, not just sampled
    assert prefl["missing_discriminators"] == []
    assert prefl["bytes"]["generator"] > 0 and prefl["bytes"]["discriminator"] > 0
    assert (tmp_path / "generator.pt").exists() and (tmp_path / "discriminators.pt").exists()
    assert {"pl_acc_fedgo", "pl_acc_fedgo_sigmoid", "pl_acc_domain", "pl_acc_oracle"} <= set(
        rows[-1]
    )
    assert 0 <= prefl["disc_stats"]["mean_sigmoid"] <= 1
    assert 1 <= prefl["disc_stats"]["mean_odds_double_sigmoid"] <= np.e


def test_fedgo_with_identical_discriminators_equals_nk_weighted_feddf(tmp_path):
    """Thm 3.6's weights with one shared discriminator reduce to n_k / sum n_i: the whole run
    must then match FedDF with data-size weighting, round by round."""
    run(tmp_path / "first", *FEDGO)
    states = torch.load(tmp_path / "first" / "discriminators.pt")
    same = {pid: states[0] for pid in states}
    torch.save(same, tmp_path / "same.pt")
    fedgo = run(
        tmp_path / "fedgo",
        *FEDGO,
        f"strategy.discriminator.path={tmp_path / 'same.pt'}",
        f"strategy.generator.path={tmp_path / 'first' / 'generator.pt'}",
    )
    feddf = run(
        tmp_path / "feddf",
        "strategy.name=feddf",
        "strategy.weighting=data_size",
        "strategy.distill.epochs=2",
        "data.alpha=1.0",
    )
    for a, b in zip(fedgo[1:], feddf[1:], strict=True):
        assert a["pl_acc_fedgo"] == a["pl_acc_data_size"]
        assert a["test_accuracy"] == b["test_accuracy"]
        assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-6)


def test_fedgo_reuses_saved_discriminators_exactly(tmp_path):
    first = run(tmp_path / "a", *FEDGO)
    again = run(
        tmp_path / "b",
        *FEDGO,
        f"strategy.discriminator.path={tmp_path / 'a' / 'discriminators.pt'}",
        f"strategy.generator.path={tmp_path / 'a' / 'generator.pt'}",
    )
    assert [r["test_accuracy"] for r in first] == [r["test_accuracy"] for r in again]
    assert json.loads((tmp_path / "b" / "prefl.json").read_text())["discriminators"] == {
        "source": str(tmp_path / "a" / "discriminators.pt")
    }


def spy_bn_statistics(monkeypatch) -> list[bool]:
    """Per server distillation: whether the student's BatchNorm running statistics came out
    of it unchanged."""
    import strategies.feddf as feddf_module

    original, kept = feddf_module.distill, []

    def spy(student, *args, **kwargs):
        before = {k: v.clone() for k, v in student.state_dict().items() if "running" in k}
        assert before, "the student has no BatchNorm statistics"
        result = original(student, *args, **kwargs)
        after = student.state_dict()
        kept.append(all(torch.equal(v, after[k]) for k, v in before.items()))
        return result

    monkeypatch.setattr(feddf_module, "distill", spy)
    return kept


@pytest.mark.parametrize(("bn_stats", "kept"), [("auto", True), ("update", False)])
def test_fedgo_on_generated_data(tmp_path, monkeypatch, bn_stats, kept):
    seen = spy_bn_statistics(monkeypatch)
    rows = run(
        tmp_path,
        *FEDGO,
        "model.name=cnn_bn",
        "strategy.distill_data=generated",
        "strategy.generated_size=64",
        f"strategy.distill.bn_stats={bn_stats}",
    )
    assert rows[-1]["distill_steps"] == 2 * 1  # 64 samples, batch 64, 2 epochs
    assert "pl_acc_fedgo" not in rows[-1]  # no labels for generated data
    # generated images' statistics must not replace those of the clients' real data
    assert seen == [kept, kept]


@pytest.mark.parametrize(("bn_stats", "kept"), [("auto", False), ("batch", True)])
def test_distillation_on_real_data_updates_batchnorm_statistics(
    tmp_path, monkeypatch, bn_stats, kept
):
    seen = spy_bn_statistics(monkeypatch)
    run(
        tmp_path,
        "strategy.name=feddf",
        "strategy.distill.epochs=1",
        "model.name=cnn_bn",
        f"strategy.distill.bn_stats={bn_stats}",
    )
    assert seen == [kept, kept]


def test_fedgo_without_server_data_distils_on_generated_data(tmp_path):
    """Data-free FedGO (G2/untrained generator + D2): ``data.server_fraction 0`` and every
    sample is a client's; the generator is not trained (no server data), the ensemble is
    distilled on its samples."""
    rows = run(
        tmp_path,
        *FEDGO,
        "data.server_fraction=0",
        "strategy.generator.steps=0",
        "strategy.distill_data=generated",
        "strategy.generated_size=64",
    )
    prefl = json.loads((tmp_path / "prefl.json").read_text())
    assert prefl["generator"] == {"source": "untrained (generator.steps 0)"}
    assert prefl["missing_discriminators"] == []
    assert rows[-1]["distill_steps"] == 2 and np.isfinite(rows[-1]["test_loss"])
    cfg = load_experiment(ROOT / "conf/default.yaml", [*TINY, "data.server_fraction=0"])
    assert len(make_partition(cfg).server) == 0


@pytest.mark.parametrize(
    ("reference", "extra"),
    [
        ("server", ("strategy.discriminator.reference_size=20",)),
        (
            "mixture",
            (
                "strategy.discriminator.spectral_norm=true",
                "strategy.discriminator.label_smoothing=0.1",
                "strategy.discriminator.patience=1",
                "strategy.discriminator.epochs=3",
            ),
        ),
    ],
)
def test_fedgo_discriminators_against_server_images(tmp_path, reference, extra):
    """``discriminator.reference``: the server sends images of its own share with the
    discriminator message; with ``server`` no generator is trained or sent."""
    rows = run(tmp_path, *FEDGO, f"strategy.discriminator.reference={reference}", *extra)
    prefl = json.loads((tmp_path / "prefl.json").read_text())
    assert prefl["missing_discriminators"] == []
    sent = prefl["reference"]
    cfg = load_experiment(ROOT / "conf/default.yaml", [*TINY, "data.alpha=1.0"])
    server_size = len(make_partition(cfg).server)
    images = 20 if reference == "server" else server_size
    assert sent["kind"] == reference and sent["images"] == images
    assert sent["bytes_per_client"] > 0 and sent["bytes_per_client"] % images == 0
    if reference == "server":
        assert prefl["generator"]["source"].startswith("not needed")
    else:
        assert prefl["generator"]["steps"] == 5
        for client in prefl["discriminators"].values():
            assert 1 <= client["disc_best_epoch"] <= client["disc_epochs"] <= 3
    assert np.isfinite(rows[-1]["test_loss"]) and "pl_acc_fedgo_sigmoid_clip20" in rows[-1]
    again = run(tmp_path / "again", *FEDGO, f"strategy.discriminator.reference={reference}", *extra)
    assert [r["test_accuracy"] for r in rows] == [r["test_accuracy"] for r in again]


G3 = [
    *FEDGO,
    "strategy.generator.steps=0",
    "strategy.generator.federated_rounds=2",
    "strategy.generator.local_epochs=1",
]


def test_fedgo_g3_fedgan_then_data_free_distillation(tmp_path):
    """Scenario G3 + D2 (FedGO Table 2): no server data; the generator is trained by FedGAN
    rounds at the clients, then serves the discriminators and the generated distillation set."""
    rows = run(
        tmp_path,
        *G3,
        "data.server_fraction=0",
        "strategy.distill_data=generated",
        "strategy.generated_size=64",
    )
    gen = json.loads((tmp_path / "prefl.json").read_text())["generator"]
    assert gen["source"] == "trained federatedly (G3, FedGAN)"
    assert [r["round"] for r in gen["rounds"]] == [1, 2]
    assert all(r["clients"] == [0, 1, 2, 3] and r["left_out"] == [] for r in gen["rounds"])
    assert gen["bytes_per_client_per_round"] > 0
    cfg = load_experiment(ROOT / "conf/default.yaml", [*TINY, *G3, "data.server_fraction=0"])
    gp = cfg.strategy.params.generator
    initial = seeded_generator(cfg.seed, gp, (1, 8, 8)).state_dict()
    trained = torch.load(tmp_path / "generator.pt")
    assert any(not torch.equal(initial[k], trained[k]) for k in initial)  # FedGAN moved it
    assert rows[-1]["distill_steps"] == 2 and np.isfinite(rows[-1]["test_loss"])


def test_fedgan_averages_by_data_size_and_leaves_out_a_failed_client(tmp_path, monkeypatch):
    """FedGAN's server step: the n_k-weighted mean of the clients' generators and critics;
    a client that fails its round is left out of the mean and named."""

    def fake(self, job):
        if job.partition_id == 2:
            raise RuntimeError("client 2 fails its FedGAN round")
        gp = job.params.generator
        value = float(job.partition_id + 1)
        pair = {}
        for key, net in (
            (GENERATOR_KEY, gp.build(job.data.input_shape, seed=0)),
            (CRITIC_KEY, gp.build_critic(job.data.input_shape, seed=0)),  # as the client does
        ):
            state = net.state_dict()
            pair[key] = ArrayRecord(
                {
                    k: torch.full_like(v, value) if v.is_floating_point() else v
                    for k, v in state.items()
                }
            )
        return pair, {}

    monkeypatch.setattr(FedGOClient, "train_fedgan", fake)
    # rule mean: FedGAN's own average (the default consensus rule weighs each by its trust)
    run(tmp_path, *G3, "strategy.generator.federated_rounds=1", "strategy.aggregation.rule=mean")
    gen = json.loads((tmp_path / "prefl.json").read_text())["generator"]
    assert gen["rounds"][0]["clients"] == [0, 1, 3] and gen["rounds"][0]["left_out"] == [2]
    cfg = load_experiment(ROOT / "conf/default.yaml", [*TINY, "data.alpha=1.0"])
    sizes = {p: len(idx) for p, idx in enumerate(make_partition(cfg).clients) if p != 2}
    expected = sum(n * (p + 1) for p, n in sizes.items()) / sum(sizes.values())
    state = torch.load(tmp_path / "generator.pt")
    floats = [v for v in state.values() if v.is_floating_point()]
    assert floats and all(torch.allclose(v, torch.full_like(v, expected)) for v in floats)


def test_fedgan_resumes_after_its_last_finished_round(tmp_path, monkeypatch):
    straight = tmp_path / "straight"
    run(straight, *G3)
    original = RoundIntake.take

    def dying(self, msg, *args, **kwargs):
        if self.what.startswith("FedGAN round 2"):
            raise KeyboardInterrupt  # the server stops inside FedGAN round 2
        return original(self, msg, *args, **kwargs)

    stopped = tmp_path / "stopped"
    with monkeypatch.context() as m:
        m.setattr(RoundIntake, "take", dying)
        with pytest.raises(KeyboardInterrupt):
            run(stopped, *G3)
    assert torch.load(stopped / "fedgan.pt")["round"] == 1
    run(stopped, *G3, "resume=true")
    a, b = torch.load(straight / "generator.pt"), torch.load(stopped / "generator.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    rounds = json.loads((stopped / "prefl.json").read_text())["generator"]["rounds"]
    assert [r["round"] for r in rounds] == [1, 2]


def test_byzantine_discriminators(tmp_path):
    """FedGO App. F.8: m seeded clients' discriminators output their maximum everywhere. When
    every client is Byzantine all odds are equal, and FedGO is n_k weighting exactly."""
    rows = run(tmp_path / "all", *FEDGO, "strategy.byzantine=4")
    assert json.loads((tmp_path / "all" / "prefl.json").read_text())["byzantine_clients"] == [
        0,
        1,
        2,
        3,
    ]
    for row in rows[1:]:
        assert row["pl_acc_fedgo"] == row["pl_acc_data_size"]
        assert row["pl_acc_fedgo_sigmoid"] == row["pl_acc_data_size"]
    run(tmp_path / "one", *FEDGO, "strategy.byzantine=1")
    liars = json.loads((tmp_path / "one" / "prefl.json").read_text())["byzantine_clients"]
    assert len(liars) == 1 and 0 <= liars[0] < 4
    with pytest.raises(ConfigError, match="strategy.byzantine"):
        run(tmp_path / "many", *FEDGO, "strategy.byzantine=5")


def test_missing_discriminator_gets_neutral_weight(tmp_path, monkeypatch):
    original = FedGOClient.train_discriminator

    def flaky(self, job):
        if job.partition_id == 2:
            raise RuntimeError("injected crash in the discriminator round")
        return original(self, job)

    monkeypatch.setattr(FedGOClient, "train_discriminator", flaky)
    rows = run(tmp_path, *FEDGO)
    prefl = json.loads((tmp_path / "prefl.json").read_text())
    assert prefl["missing_discriminators"] == [2]
    assert np.isfinite(rows[-1]["test_accuracy"])
