"""The Table-3 peers (issue 16): each algorithm's distinctive piece (FedUV's terms, FedDisco's
weights, FedGKD's KD term, FedTGP's prototypes, DaFKD's gradient penalty and heads, the
feature tap they share) against a hand computation, without a federated run
(``tests/integration/test_peer_runs.py`` has the runs)."""

from __future__ import annotations

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
from clients.fedtgp import class_prototypes, prototype_term
from clients.feduv import FedUVClient, iid_gamma, uniformity_term, variance_term
from fedgo_flwr.config.experiment import ConfigError, TrainConfig
from fedgo_flwr.config.names import MODEL_NAMES
from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.gan.settings import GeneratorConfig
from fedgo_flwr.learning.training import train_local
from fedgo_flwr.models.classifiers import build_model
from fedgo_flwr.models.features import FeatureTap
from fedgo_flwr.protocol import declaration
from fedgo_flwr.protocol.dafkd import DISC_HEAD_KEY, GENERATOR_KEY, DaFKDClientConfig
from fedgo_flwr.protocol.fedgkd import FedGKDConfig
from fedgo_flwr.runtime.messages import to_numpy
from fedgo_flwr.runtime.rng import derive_seed, make_rng
from strategies import load_experiment
from strategies._gkd import buffer_average
from strategies.dafkd import logits_and_discriminator
from strategies.feddf import FedDF
from strategies.feddisco import disco_weights, discrepancy
from strategies.fedtgp import TrainableGlobalPrototypes, adaptive_margin, tgp_loss

ROOT = Path(__file__).resolve().parents[2]
TINY = ["data.num_clients=4", "fraction=0.5", "train.local_epochs=1"]
CPU = torch.device("cpu")


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
    zero = declaration("feduv").Config(variance_weight=0.0, uniformity_weight=0.0)
    assert same(plain, trained(lambda m, d: client.batch_loss(job(m, d, zero)), True))
    assert client.sums["batches"] == 12 and client.sums["uv_unif"] > 0


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


# -- DaFKD -------------------------------------------------------------------------------------
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


# -- FedDF's other distillation sets -----------------------------------------------------------
def test_distill_size_copies_only_the_drawn_server_images(tmp_path):
    """``distill_size`` draws its images by index from the server's share: the same images as a
    draw from the whole copied share, without copying the share (a memory map of the data
    cache: 25,000 CIFAR images at 1,000 clients, where 2,000 are distilled on)."""
    from fedgo_flwr.learning.task import load_bundle, make_partition, new_model
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
# round 2's mlp clients start from the prototype fused in round 1, not the initial weights


def test_fedgo_accepts_mixed_architectures_and_gkd_refuses_them():
    load_experiment(ROOT / "conf/fedgo.yaml", [*MIXED, "strategy.aggregation.rule=mean"])
    refused = r"rule = 'consensus'.*set strategy.aggregation.rule=mean"
    with pytest.raises(ConfigError, match=refused):
        load_experiment(ROOT / "conf/fedgo.yaml", MIXED)  # the default rule has no prototypes
    with pytest.raises(ConfigError, match="model.client_models"):
        load_experiment(ROOT / "conf/fedgkd_plus.yaml", MIXED)
    with pytest.raises(ConfigError, match="strategy.aggregation.rule"):
        load_experiment(ROOT / "conf/feddf.yaml", [*MIXED, "strategy.aggregation.rule=median"])
