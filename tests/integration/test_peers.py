"""The Table-3 peers (issue 16): each algorithm's distinctive piece against a hand computation,
its reductions to the method it extends, and a short run through the in-process grid."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, RecordDict
from torch import nn

from clients.base import ClientJob
from clients.dafkd import DaFKDClient, gradient_penalty
from clients.fedgkd import kd_term
from clients.fedtgp import FedTGPClient, class_prototypes, prototype_term
from clients.feduv import FedUVClient, iid_gamma, uniformity_term, variance_term
from fedgo_flwr.config import ConfigError, TrainConfig
from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.features import FeatureTap
from fedgo_flwr.gan.settings import GeneratorConfig
from fedgo_flwr.inprocess import run_inprocess
from fedgo_flwr.messages import to_numpy, to_record
from fedgo_flwr.models import MODEL_NAMES, build_model
from fedgo_flwr.protocol.dafkd import DISC_HEAD_KEY, GENERATOR_KEY, DaFKDClientConfig
from fedgo_flwr.protocol.fedgkd import FedGKDConfig
from fedgo_flwr.protocol.fedtgp import PROTOS_KEY
from fedgo_flwr.protocol.feduv import FedUVConfig
from fedgo_flwr.rng import derive_seed, make_rng
from fedgo_flwr.training import train_local
from strategies import load_experiment
from strategies._gkd import buffer_average
from strategies.dafkd import DaFKD, logits_and_discriminator
from strategies.feddf import FedDF
from strategies.feddisco import disco_weights, discrepancy
from strategies.fedtgp import TrainableGlobalPrototypes, adaptive_margin, tgp_loss

ROOT = Path(__file__).resolve().parents[2]
TINY = ["data.num_clients=4", "fraction=0.5", "train.local_epochs=1"]
CPU = torch.device("cpu")


def run(tmp_path: Path, *overrides: str, rounds: int = 2) -> list[dict]:
    cfg = load_experiment(
        ROOT / "conf/default.yaml",
        [f"rounds={rounds}", *TINY, f"output_dir={tmp_path}", *overrides],
    )
    run_inprocess(cfg)
    return [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def accuracies(rows: list[dict]) -> list[float]:
    return [r["test_accuracy"] for r in rows]


def toy_images(n: int = 48, seed: int = 0) -> ArrayDataset:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, size=n).astype(np.int64)
    return ArrayDataset(x=x, y=y, num_classes=10)


def job(
    model: nn.Module, data: ArrayDataset, params, server_round: int = 2, **content
) -> ClientJob:
    return ClientJob(
        cfg=None,  # type: ignore[arg-type]  # the hooks read only params, data and model
        params=params,
        partition_id=0,
        server_round=server_round,
        data=data,
        device=CPU,
        rng=make_rng(0),
        content=RecordDict(content),
        state=RecordDict(),
        model=model,
    )


def trained(hook_of=None, features=False) -> dict[str, torch.Tensor]:
    """The weights after local training of a seeded cnn, with ``hook_of(model, data)`` as the
    batch loss (none if ``None``)."""
    torch.manual_seed(0)
    model = build_model("cnn", (1, 8, 8), 10)
    data = toy_images()
    train_local(
        model,
        data,
        TrainConfig(local_epochs=2, batch_size=8, lr=0.05),
        rng=make_rng(3),
        device=CPU,
        augment=False,
        batch_loss=None if hook_of is None else hook_of(model, data),
        features=features,
    )
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


# -- the shared per-batch hook and the feature tap -------------------------------------------
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_feature_tap_reads_the_output_layers_input(name):
    shape = (10,) if name == "mlp" else (3, 16, 16)
    model = build_model(name, shape, 7).eval()
    with FeatureTap(model) as tap:
        logits = model(torch.randn(3, *shape))
        z = tap.read(logits)
        torch.testing.assert_close(tap.layer(z), logits)
    assert z.shape[0] == 3 and z.ndim == 2


def test_feature_tap_refuses_a_model_whose_output_is_not_its_last_linear():
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh())
    with FeatureTap(model) as tap, pytest.raises(ValueError, match="last nn.Linear"):
        tap.read(model(torch.randn(2, 4)))
    with pytest.raises(ValueError, match="no nn.Linear"):
        FeatureTap(nn.Sequential(nn.Tanh()))


def test_a_zero_batch_loss_with_features_trains_bit_identically():
    plain = trained()
    hooked = trained(lambda m, d: lambda b: b.logits.sum() * 0 + b.features.sum() * 0, True)
    assert same(plain, hooked)
    # and a non-zero term does change training (the hook is really in the objective)
    moved = trained(lambda m, d: lambda b: b.features.pow(2).mean(), True)
    assert not same(plain, moved)


# -- FedUV -------------------------------------------------------------------------------------
def test_feduv_gamma_is_the_std_of_one_hot_outputs():
    assert iid_gamma(10) == pytest.approx(1 / math.sqrt(10), abs=1e-7)
    assert iid_gamma(4) == pytest.approx(0.5, abs=1e-7)


def test_feduv_variance_term():
    gamma = iid_gamma(5)
    one_hot = torch.eye(5) * 1e4  # saturated, pairwise distinct predictions of every class
    assert variance_term(one_hot, gamma).item() < 1e-6
    same_pred = torch.zeros(6, 5)  # every std is 0
    assert variance_term(same_pred, gamma).item() == pytest.approx(gamma)
    logits = torch.randn(8, 5, generator=torch.Generator().manual_seed(0)) * 0.1
    logits.requires_grad_(True)
    before = torch.softmax(logits, 1).std(0).mean().item()
    variance_term(logits, gamma).backward()
    with torch.no_grad():
        after = torch.softmax(logits - 10 * logits.grad, 1).std(0).mean().item()
    assert after > before  # its gradient spreads the class probabilities over the batch


def test_feduv_uniformity_term():
    simplex = torch.eye(4)  # equidistant points: sigma is their common squared distance
    assert uniformity_term(simplex).item() == pytest.approx(math.exp(-1), rel=1e-6)
    z = torch.randn(6, 3, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(uniformity_term(z), uniformity_term(7.5 * z))  # scale-free
    d2 = torch.pdist(z).pow(2)
    sigma = d2.median()
    assert uniformity_term(z).item() == pytest.approx(torch.exp(-d2 / sigma).mean().item())
    u = z / z.norm(dim=1, keepdim=True)
    fixed = torch.exp(-2.0 * torch.pdist(u).pow(2)).mean().item()
    assert uniformity_term(z, "fixed", t=2.0).item() == pytest.approx(fixed, rel=1e-6)
    flat = torch.ones(5, 3, requires_grad=True)  # no non-zero distance: 0, finite, no NaN
    value = uniformity_term(flat)
    value.backward()
    assert value.item() == 0 and torch.isfinite(flat.grad).all()


def test_feduv_with_zero_weights_trains_as_fedavg_and_reports_its_terms():
    client = FedUVClient()
    plain = trained()
    zero = FedUVConfig(variance_weight=0.0, uniformity_weight=0.0)
    assert same(plain, trained(lambda m, d: client.batch_loss(job(m, d, zero)), True))
    assert client.sums["batches"] == 12 and client.sums["uv_unif"] > 0


def test_feduv_end_to_end(tmp_path):
    rows = run(tmp_path, "strategy.name=feduv")
    assert all(math.isfinite(r["uv_var"]) and math.isfinite(r["uv_unif"]) for r in rows[1:])
    assert rows[-1]["test_accuracy"] > rows[0]["test_accuracy"]


# -- FedDisco ----------------------------------------------------------------------------------
COUNTS = np.array([[30, 0, 0], [10, 10, 10], [5, 20, 0], [1, 1, 8]])
UNIFORM = np.full(3, 1 / 3)


def test_feddisco_kl_discrepancy():
    d = discrepancy(COUNTS, UNIFORM)
    assert d[0] == pytest.approx(math.log(3))  # one class: log C
    assert d[1] == pytest.approx(0.0, abs=1e-12)  # balanced: 0
    p = np.array([5, 20, 0]) / 25
    assert d[2] == pytest.approx(float(np.sum(p[p > 0] * np.log(p[p > 0] * 3))))
    l1 = discrepancy(COUNTS, UNIFORM, "l1")
    assert l1[0] == pytest.approx(4 / 3)


def test_feddisco_weights():
    sizes = COUNTS.sum(1) / COUNTS.sum()
    np.testing.assert_allclose(disco_weights(COUNTS, 0, 0, UNIFORM), sizes)
    np.testing.assert_allclose(disco_weights(COUNTS, 0, 0.1, UNIFORM), (sizes + 0.1) / 1.4)
    a, b = 0.5, 0.1
    d = discrepancy(COUNTS, UNIFORM)
    d = d / d.sum()
    raw = np.maximum(sizes - a * d + b, 0)
    w = disco_weights(COUNTS, a, b, UNIFORM)
    np.testing.assert_allclose(w, raw / raw.sum())
    assert w.sum() == pytest.approx(1) and (w >= 0).all()
    perm = [2, 0, 3, 1]
    np.testing.assert_allclose(disco_weights(COUNTS[perm], a, b, UNIFORM), w[perm])
    # the same size, more skew: a smaller weight
    skewed = np.array([[10, 10, 10], [20, 5, 5], [30, 0, 0]])
    ws = disco_weights(skewed, a, b, UNIFORM)
    assert ws[0] > ws[1] > ws[2]
    # d_k > (n_k + b) / a: exactly 0; every ReLU 0: None
    assert disco_weights(COUNTS, 5.0, 0.0, UNIFORM)[0] == 0
    assert disco_weights(COUNTS[[0, 2, 3]], 100.0, 0.0, UNIFORM, metric="l1") is None


def test_feddisco_end_to_end_and_its_reduction_to_fedavg(tmp_path):
    rows = run(tmp_path / "disco", "strategy.name=feddisco", "data.alpha=0.1")
    assert all(r["disco_weight_min"] < r["disco_weight_max"] for r in rows[1:])
    reduced = run(tmp_path / "ab0", "strategy.name=feddisco", "strategy.a=0", "strategy.b=0")
    fedavg = run(tmp_path / "fedavg", "strategy.name=fedavg")
    assert accuracies(reduced) == accuracies(fedavg)


# -- FedGKD / FedGKD+ --------------------------------------------------------------------------
def test_fedgkd_kd_term_and_scales():
    s = torch.tensor([[1.0, 0.0, -1.0], [0.5, 0.5, 2.0]])
    t = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 0.0]])
    tau = 2.0
    ps, pt = torch.softmax(s / tau, 1), torch.softmax(t / tau, 1)
    hand = (pt * (pt.log() - ps.log())).sum(1).mean()
    torch.testing.assert_close(kd_term(s, t, tau), hand)
    assert kd_term(s, s, tau).item() == pytest.approx(0.0, abs=1e-7)
    assert FedGKDConfig(gamma=0.01, temperature=3.0).kd_weight() == pytest.approx(0.005)
    assert FedGKDConfig(0.01, 3.0, "code").kd_weight() == pytest.approx(0.09)


def test_fedgkd_buffer_average_keeps_dtypes():
    models = [{"w": np.full(2, v, np.float32), "n": np.array(v, np.int64)} for v in (1.0, 2.0, 6.0)]
    avg = buffer_average(models)
    np.testing.assert_allclose(avg["w"], [3.0, 3.0])
    assert avg["w"].dtype == np.float32 and avg["n"].dtype == np.int64


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


# -- FedTGP ------------------------------------------------------------------------------------
def test_fedtgp_adaptive_margin():
    def upload(points, counts):
        return np.array(points, dtype=np.float32).reshape(-1, 1), np.array(counts)

    uploads = [upload([0, 1, 3, 0], [5, 1, 2, 0])]  # class 3 absent
    delta, gaps = adaptive_margin(uploads, 4, threshold=100.0)
    np.testing.assert_allclose(gaps, [1, 1, 2, 1])  # the absent class gets the smallest gap
    assert delta == pytest.approx(2.0)
    assert adaptive_margin(uploads, 4, threshold=0.5)[0] == 0.5
    # class means are unweighted over the clients holding the class
    two = [upload([0, 1, 0, 0], [1, 1, 0, 0]), upload([2, 9, 0, 0], [3, 0, 0, 0])]
    _, gaps = adaptive_margin(two, 4, 100.0)
    assert gaps[0] == pytest.approx(0.0)  # mean of class 0 is 1.0, class 1 is 1.0


def test_fedtgp_loss_by_hand():
    p = torch.tensor([[0.0, 0.0]])
    generated = torch.tensor([[3.0, 4.0], [0.0, 1.0]])  # distances 5 and 1
    y = torch.tensor([0])
    margin = 0.5
    hand = -math.log(math.exp(-5.5) / (math.exp(-5.5) + math.exp(-1.0)))
    assert tgp_loss(p, y, generated, margin).item() == pytest.approx(hand, rel=1e-5)


def test_fedtgp_training_moves_each_prototype_to_its_class():
    rng = np.random.default_rng(0)
    centres = np.eye(3, 4) * 5
    protos = [(centres + rng.normal(0, 0.3, (3, 4))).astype(np.float32) for _ in range(4)]
    torch.manual_seed(0)
    tgp = TrainableGlobalPrototypes(3, 4, 8)
    x = torch.as_tensor(np.concatenate(protos))
    y = torch.arange(3).repeat(4)
    frozen = tgp().detach().clone()
    opt = torch.optim.SGD(tgp.parameters(), lr=0.05)
    for _ in range(300):
        loss = tgp_loss(x, y, tgp(), margin=1.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    nearest = torch.cdist(torch.as_tensor(centres, dtype=torch.float32), tgp()).argmin(1)
    assert nearest.tolist() == [0, 1, 2]
    assert not torch.equal(frozen, tgp().detach())


def test_fedtgp_client_term_and_upload():
    z = torch.tensor([[1.0, 2.0], [0.0, 0.0], [3.0, 3.0]])
    y = torch.tensor([1, 0, 1])
    protos = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    hand = ((0**2 + 1**2) + (0**2 + 1**2) + (2**2 + 2**2)) / 6
    assert prototype_term(z, y, protos).item() == pytest.approx(hand)
    l2 = (1 + 1 + math.sqrt(8)) / 3
    assert prototype_term(z, y, protos, "l2").item() == pytest.approx(l2, rel=1e-5)
    torch.manual_seed(0)
    model = build_model("cnn_bn", (1, 8, 8), 10)
    data = toy_images(20)
    means, counts = class_prototypes(model, data, 7, CPU)
    np.testing.assert_array_equal(counts, np.bincount(data.y, minlength=10))
    model.eval()
    with torch.no_grad(), FeatureTap(model) as tap:
        feats = tap.read(model(torch.as_tensor(data.x)))
    c = int(data.y[0])
    np.testing.assert_allclose(means[c], feats[data.y == c].mean(0).numpy(), rtol=1e-5, atol=1e-6)
    absent = [k for k in range(10) if counts[k] == 0]
    assert all((means[k] == 0).all() for k in absent)


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


def test_dafkd_gradient_penalty_by_hand():
    w = torch.tensor([[[[3.0, 0.0], [0.0, 0.0]], [[4.0, 0.0], [0.0, 1.0]]]])  # (1, 2, 2, 2)

    def disc(x):  # linear: the gradient is w for every sample and interpolate
        return (x * w).flatten(1).sum(1)

    real, fake = torch.randn(3, 2, 2, 2), torch.randn(3, 2, 2, 2)
    rng = torch.Generator().manual_seed(0)
    sample = (math.sqrt(9 + 16 + 1) - 1) ** 2
    assert gradient_penalty(disc, real, fake, rng).item() == pytest.approx(sample, rel=1e-5)
    per_pixel = torch.tensor([5.0, 0.0, 0.0, 1.0])  # norms over the 2 channels at each pixel
    channel = ((per_pixel - 1) ** 2).mean().item()
    assert gradient_penalty(disc, real, fake, rng, "channel").item() == pytest.approx(channel)


def test_dafkd_server_reads_the_clients_discriminator():
    torch.manual_seed(0)
    model = build_model("cnn_bn", (1, 8, 8), 10)
    head = nn.Linear(128, 1)
    data = toy_images(10)
    heads = {k: v.detach().numpy() for k, v in head.state_dict().items()}
    logits, disc = logits_and_discriminator(model, heads, data, 1, 4, CPU)
    model.eval()
    with torch.no_grad(), FeatureTap(model) as tap:
        x = torch.as_tensor(data.x)
        out = model(x)
        expected = head(tap.read(out)).squeeze(1)
    torch.testing.assert_close(logits[0], out)
    torch.testing.assert_close(disc[0], expected, rtol=1e-5, atol=1e-6)


def dafkd_job(params: DaFKDClientConfig, server_round: int, state: RecordDict | None = None):
    cfg = load_experiment(ROOT / "conf/dafkd.yaml", [])
    torch.manual_seed(0)
    model = build_model("cnn", (1, 8, 8), 10)
    gen = params.generator.build((1, 8, 8), seed=derive_seed(cfg.seed, "gen-init"))
    return ClientJob(
        cfg=cfg,
        params=params,
        partition_id=2,
        server_round=server_round,
        data=toy_images(32),
        device=CPU,
        rng=make_rng(0),
        content=RecordDict({GENERATOR_KEY: ArrayRecord(gen.state_dict())}),
        state=state if state is not None else RecordDict(),
        model=model,
    )


def test_dafkd_client_gates_its_gan_and_keeps_its_head():
    gen = GeneratorConfig(latent_dim=8, width=8)
    params = DaFKDClientConfig(generator=gen, disc_rounds=1, generator_rounds=1)
    state = RecordDict()
    first = dafkd_job(params, 1, state)
    stats, extra = DaFKDClient().train(first)
    assert stats.metrics["gan_d_loss"] > 0 and stats.metrics["gan_g_loss"] > 0
    head1 = to_numpy(extra[DISC_HEAD_KEY])
    gen_sent = to_numpy(first.content[GENERATOR_KEY])
    assert any(
        not np.array_equal(v, gen_sent[k]) for k, v in to_numpy(extra[GENERATOR_KEY]).items()
    )
    # second participation: past both limits, so head and generator come back unchanged
    stats, extra = DaFKDClient().train(dafkd_job(params, 5, state))
    assert "gan_d_loss" not in stats.metrics and "gan_g_loss" not in stats.metrics
    for k, v in to_numpy(extra[DISC_HEAD_KEY]).items():
        np.testing.assert_array_equal(v, head1[k])
    np.testing.assert_array_equal(to_numpy(state["dafkd_head"])["participations"], 2)
    for k, v in to_numpy(extra[GENERATOR_KEY]).items():
        np.testing.assert_array_equal(v, gen_sent[k])


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


def test_distill_size_copies_only_the_drawn_server_images(tmp_path):
    """``distill_size`` draws its images by index from the server's share: the same images as a
    draw from the whole copied share, without copying the share (a memory map of the data
    cache: 25,000 CIFAR images at 1,000 clients, where 2,000 are distilled on)."""
    from fedgo_flwr.task import load_bundle, make_partition, new_model
    from strategies.base import ServerResources

    cfg = load_experiment(
        ROOT / "conf/feddf.yaml",
        [*TINY, f"output_dir={tmp_path}", "strategy.distill_size=40"],
    )
    bundle = load_bundle(cfg.data)
    resources = ServerResources(bundle, make_partition(cfg), torch.device("cpu"), tmp_path)
    nodes = {p: p + 1 for p in range(cfg.data.num_clients)}
    strategy = FedDF(cfg, nodes, new_model(cfg, bundle), resources)
    assert getattr(strategy, "_server_unlabeled", None) is None  # the share was never copied
    share = bundle.train.subset(resources.partition.server)
    draw = np.random.default_rng(derive_seed(cfg.seed, "distill-size"))
    expected = share.subset(np.sort(draw.choice(len(share), 40, False)))
    assert len(strategy.distill_set) == 40
    assert np.array_equal(strategy.distill_set.x, expected.x)
    assert np.array_equal(strategy.distill_set.y, expected.y)
    # Without distill_size the whole share is distilled on, shared with server_unlabeled.
    cfg.strategy.params.distill_size = None
    whole = FedDF(cfg, nodes, new_model(cfg, bundle), resources)
    assert len(whole.distill_set) == len(share) and whole._server_unlabeled is not None


# -- FedDF with clients of several architectures (FedDF Alg. 3) ----------------------------
MIXED = ["model.name=cnn", "model.client_models=[cnn, mlp]", "strategy.distill.epochs=1"]


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
    # round 2's mlp clients start from the prototype fused in round 1, not the initial weights


def test_fedgo_accepts_mixed_architectures_and_gkd_refuses_them():
    load_experiment(ROOT / "conf/fedgo.yaml", MIXED)
    with pytest.raises(ConfigError, match="model.client_models"):
        load_experiment(ROOT / "conf/fedgkd_plus.yaml", MIXED)
    with pytest.raises(ConfigError, match="strategy.aggregation.rule"):
        load_experiment(ROOT / "conf/feddf.yaml", [*MIXED, "strategy.aggregation.rule=median"])
