"""Data-free distillation math (Co-Boosting, DENSE, F-ADI): fedgo_flwr/datafree/."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import Linear
from torch import nn

from fedgo_flwr.datafree import (
    BNStatistics,
    BoostSettings,
    DataFreeDistillation,
    Generator,
    PoolLogits,
    SynthesisSettings,
    SyntheticPool,
    adversarial_kl,
    diversify,
    fedgo_multipliers,
    frozen,
    hard_cross_entropy,
    kd_loss,
    member_logits,
    reset_generator,
    synthesize,
    to_model_input,
    weight_step,
    weighted_logits,
)
from fedgo_flwr.models.classifiers import build_model
from fedgo_flwr.runtime.kernels import use_channels_last

SHAPE = (1, 8, 8)
CLASSES = 3


def models(n: int, seed: int = 0, name: str = "cnn") -> list[nn.Module]:
    torch.manual_seed(seed)
    return [build_model(name, SHAPE, CLASSES) for _ in range(n)]


def rng(seed: int = 0) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


# -- weighted ensemble ------------------------------------------------------------------------


def test_weighted_logits_divides_by_the_weight_sum() -> None:
    z = torch.randn(3, 5, CLASSES)
    uniform = weighted_logits(z, torch.full((3,), 1 / 3))
    assert torch.allclose(uniform, z.mean(0), atol=1e-6)
    w = torch.tensor([0.2, 0.5, 0.1])
    assert torch.allclose(weighted_logits(z, w), weighted_logits(z, 7 * w), atol=1e-6)
    expected = (w.view(3, 1, 1) * z).sum(0) / w.sum()
    assert torch.allclose(weighted_logits(z, w), expected, atol=1e-6)


def test_weighted_logits_per_sample_and_all_zero() -> None:
    z = torch.randn(2, 4, CLASSES)
    w = torch.tensor([[1.0, 0.0, 0.5, 0.2], [0.0, 1.0, 0.5, 0.6]])
    out = weighted_logits(z, w)
    assert torch.allclose(out[0], z[0, 0]) and torch.allclose(out[1], z[1, 1])
    assert torch.allclose(out[3], 0.25 * z[0, 3] + 0.75 * z[1, 3], atol=1e-6)
    assert torch.equal(weighted_logits(z, torch.zeros(2)), torch.zeros(4, CLASSES))
    with pytest.raises(ValueError, match="per-sample weights"):
        weighted_logits(z, torch.ones(2, 3))


def test_weight_step_moves_each_weight_by_the_step_towards_the_better_member() -> None:
    labels = torch.tensor([0, 1, 2, 0])
    right = F.one_hot(labels, CLASSES).float() * 5
    wrong = F.one_hot((labels + 1) % CLASSES, CLASSES).float() * 5
    z = torch.stack([right, wrong])
    w = torch.tensor([0.5, 0.5])
    new = weight_step(w, z, labels, 0.05)
    assert torch.allclose(new, torch.tensor([0.55, 0.45]))
    assert torch.equal(w, torch.tensor([0.5, 0.5]))  # input untouched
    # Eq. 12's Normalize: each weight clipped to [0, 1].
    assert torch.equal(
        weight_step(torch.tensor([1.0, 0.0]), z, labels, 0.3), torch.tensor([1.0, 0.0])
    )
    # Repeated steps drive the wrong member's weight to 0 and the ensemble to the right one.
    for _ in range(20):
        w = weight_step(w, z, labels, 0.05)
    assert w[1] == 0 and w[0] > 0.5
    assert torch.equal(weighted_logits(z, w).argmax(1), labels)


# -- losses ----------------------------------------------------------------------------------


def test_hard_cross_entropy_weights_by_detached_difficulty() -> None:
    torch.manual_seed(1)
    logits = torch.randn(6, CLASSES, requires_grad=True)
    y = torch.tensor([0, 1, 2, 0, 1, 2])

    def parts() -> tuple[torch.Tensor, torch.Tensor]:
        p = F.softmax(logits, 1)[torch.arange(6), y]
        return p, F.cross_entropy(logits, y, reduction="none")

    p, ce = parts()
    loss = hard_cross_entropy(logits, y)
    assert torch.allclose(loss, ((1 - p) * ce).mean())
    (g,) = torch.autograd.grad(loss, logits)
    p, ce = parts()
    (g_ref,) = torch.autograd.grad(((1 - p).detach() * ce).mean(), logits)
    assert torch.allclose(g, g_ref)  # d(x) is not differentiated
    p, ce = parts()
    (g_full,) = torch.autograd.grad(((1 - p) * ce).mean(), logits)
    assert not torch.allclose(g, g_full)
    assert torch.allclose(hard_cross_entropy(logits, y, 0.0), F.cross_entropy(logits, y))
    assert torch.allclose(hard_cross_entropy(logits, y, 2.0), ((1 - p) ** 2 * ce).mean())


def test_adversarial_kl_is_minus_the_tempered_kl_and_masks_agreement() -> None:
    s = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    t = torch.tensor([[1.0, 0.0, 0.0], [2.0, 0.0, 0.0]])
    for temp in (1.0, 3.0):
        p = F.softmax(t / temp, 1)
        kl = (p * (p.log() - F.log_softmax(s / temp, 1))).sum(1) * temp**2
        assert torch.allclose(adversarial_kl(s, t, temp), -kl.mean())
        # DENSE: only sample 1 (arg-max 1 vs 0) disagrees; the mean stays over both.
        assert torch.allclose(adversarial_kl(s, t, temp, mask=True), -kl[1] / 2)
    assert adversarial_kl(t, t).abs() < 1e-7


def test_kd_loss_is_t_squared_batchmean_kl() -> None:
    torch.manual_seed(2)
    s, t = torch.randn(4, CLASSES), torch.randn(4, CLASSES)
    p = F.softmax(t / 4, 1)
    ref = (p * (p.log() - F.log_softmax(s / 4, 1))).sum() / 4 * 16
    assert torch.allclose(kd_loss(s, t), ref, atol=1e-6)
    assert kd_loss(t, t) < 1e-6


def test_bn_statistics_loss_is_zero_at_the_running_statistics() -> None:
    bn = nn.BatchNorm2d(2).eval()
    bn.running_mean.copy_(torch.tensor([1.0, -1.0]))
    bn.running_var.copy_(torch.tensor([4.0, 1.0]))
    model = nn.Sequential(bn)
    stats = BNStatistics([model])
    assert stats.layers == 1
    x = torch.randn(512, 2, 4, 4)
    x = (x - x.mean((0, 2, 3), keepdim=True)) / x.std((0, 2, 3), unbiased=False, keepdim=True)
    x = x * torch.tensor([2.0, 1.0]).view(1, 2, 1, 1) + torch.tensor([1.0, -1.0]).view(1, 2, 1, 1)
    model(x)
    assert stats.loss() < 1e-4
    stats.reset()
    model(x + 1)  # both means off by 1: ||(1, 1)||_2
    assert math.isclose(float(stats.loss()), math.sqrt(2), rel_tol=1e-4)
    stats.remove()
    stats.reset()
    model(x + 1)
    assert float(stats.loss()) == 0.0  # hooks gone
    assert BNStatistics(models(1)).layers == 0


# -- diversification -------------------------------------------------------------------------


def test_diversify_paper_step_has_l2_norm_epsilon_along_the_projected_gradient() -> None:
    torch.manual_seed(3)
    w = torch.randn(CLASSES, 64)
    lin = Linear(w)
    x = torch.randn(5, *SHAPE)
    eps = 8 / 255
    out = diversify(x, lin, eps, rng(7), variant="paper")
    delta = (out - x).flatten(1)
    assert torch.allclose(delta.norm(dim=1), torch.full((5,), eps), atol=1e-6)
    u = torch.rand((5, CLASSES), generator=rng(7)) * 2 - 1  # the same draw
    g = u @ w  # grad_x u^T W x
    assert torch.allclose(delta, eps * g / g.norm(dim=1, keepdim=True), atol=1e-6)
    # A fresh draw each call: two uses of the same batch differ.
    r = rng(7)
    assert not torch.allclose(diversify(x, lin, eps, r), diversify(x, lin, eps, r))


def test_diversify_code_variant_is_a_sign_step_and_zero_epsilon_is_identity() -> None:
    ens = models(2)
    x = torch.randn(4, *SHAPE)

    def a(v: torch.Tensor) -> torch.Tensor:
        return weighted_logits(member_logits(ens, v), torch.ones(2))

    out = diversify(x, a, 0.1, rng(0), variant="code")
    moved = (out - x).abs()
    assert torch.allclose(moved[moved > 1e-7], torch.tensor(0.1), atol=1e-6)
    assert (moved > 1e-7).float().mean() > 0.5
    assert torch.equal(diversify(x, a, 0.0, rng(0)), x)
    with pytest.raises(ValueError, match="diversification"):
        diversify(x, a, 0.1, rng(0), variant="nope")


# -- generator and pool ----------------------------------------------------------------------


def test_generator_shapes_range_and_seeded_reset() -> None:
    g = Generator((3, 32, 32), nz=16, ngf=8)
    out = g(torch.randn(4, 16))
    assert out.shape == (4, 3, 32, 32) and out.min() >= 0 and out.max() <= 1
    assert Generator(SHAPE, nz=16, ngf=8)(torch.randn(2, 16)).shape == (2, *SHAPE)
    with pytest.raises(ValueError, match="multiples of 4"):
        Generator((3, 30, 32))
    a, b = Generator(SHAPE, nz=16, ngf=8), Generator(SHAPE, nz=16, ngf=8)
    reset_generator(a, rng(5))
    reset_generator(b, rng(5))
    for pa, pb in zip(a.state_dict().values(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb)
    assert abs(float(a.project.weight.detach().std()) - 0.02) < 0.005
    assert torch.all(to_model_input(torch.tensor([0.0, 0.5, 1.0])) == torch.tensor([-1.0, 0, 1]))


def test_pool_grows_by_each_batch_quantises_and_round_trips() -> None:
    pool = SyntheticPool(SHAPE, CLASSES, flip=False)
    assert len(pool) == 0
    imgs = torch.rand(5, *SHAPE)
    pool.add(imgs, torch.tensor([0, 1, 2, 0, 1]))
    pool.add(torch.rand(3, *SHAPE), torch.tensor([2, 2, 2]))
    assert len(pool) == 8
    data = pool.dataset()
    assert data.x.dtype.name == "uint8" and data.y.tolist() == [0, 1, 2, 0, 1, 2, 2, 2]
    assert torch.equal(torch.from_numpy(data.x[:5]), (imgs * 255).round().to(torch.uint8))
    seen = sorted(int(v) for _, y in pool.batches(3, rng(0), False, torch.device("cpu")) for v in y)
    assert seen == sorted(data.y.tolist())
    copy = SyntheticPool(SHAPE, CLASSES, flip=False)
    copy.load_state_dict(pool.state_dict())
    assert len(copy) == 8 and (copy.dataset().x == data.x).all()
    with pytest.raises(ValueError, match="pool batch"):
        pool.add(torch.rand(2, 3, 8, 8), torch.tensor([0, 1]))


# -- synthesis -------------------------------------------------------------------------------


def small(**kw) -> SynthesisSettings:
    base = {"batch_size": 6, "steps": 4}
    base.update(kw)
    return SynthesisSettings(**base)


def test_synthesize_keeps_the_best_iterate_and_leaves_the_models_alone() -> None:
    ens, (student,) = models(2), models(1, seed=9)
    before = [{k: v.clone() for k, v in m.state_dict().items()} for m in (*ens, student)]
    gen = Generator(SHAPE, nz=16, ngf=8)
    res = synthesize(
        ens,
        torch.full((2,), 0.5),
        student,
        small(),
        num_classes=CLASSES,
        image_shape=SHAPE,
        rng=rng(0),
        device=torch.device("cpu"),
        generator=gen,
        nz=16,
    )
    assert res.images.shape == (6, *SHAPE) and res.labels.shape == (6,)
    assert res.best_loss <= res.last_loss or math.isclose(res.best_loss, res.last_loss)
    assert set(res.terms) == {"ce", "adv"}
    assert math.isclose(sum(res.terms.values()), res.best_loss, rel_tol=1e-5)
    for m, state in zip((*ens, student), before, strict=True):
        for k, v in m.state_dict().items():
            assert torch.equal(v, state[k])
        assert all(p.grad is None and p.requires_grad for p in m.parameters())
    again = synthesize(
        ens,
        torch.full((2,), 0.5),
        student,
        small(),
        num_classes=CLASSES,
        image_shape=SHAPE,
        rng=rng(0),
        device=torch.device("cpu"),
        generator=Generator(SHAPE, nz=16, ngf=8),
        nz=16,
    )
    assert torch.equal(res.images, again.images) and torch.equal(res.labels, again.labels)


def test_synthesize_pixels_with_bn_statistics() -> None:
    ens, (student,) = models(2, name="cnn_bn"), models(1, seed=9)
    for m in ens:  # running statistics away from their defaults
        m.train()
        m(torch.randn(64, *SHAPE) * 3 + 1)
    res = synthesize(
        ens,
        torch.full((2,), 0.5),
        student,
        small(source="pixels", lr=0.1, bn_weight=1.0, tv_weight=1e-3, adv_weight=0.0),
        num_classes=CLASSES,
        image_shape=SHAPE,
        rng=rng(0),
        device=torch.device("cpu"),
    )
    assert set(res.terms) == {"ce", "bn", "tv"} and res.terms["bn"] > 0
    assert res.images.min() >= 0 and res.images.max() <= 1
    # The hooks are removed after the call: no BN hooks remain on the models.
    assert all(not m._forward_hooks for model in ens for m in model.modules())


def test_more_synthesis_steps_lower_the_class_loss() -> None:
    torch.manual_seed(4)
    ens, (student,) = [Linear(torch.randn(CLASSES, 64)) for _ in range(2)], models(1, seed=9)
    losses = []
    for steps in (1, 40):
        res = synthesize(
            ens,
            torch.full((2,), 0.5),
            student,
            small(steps=steps, adv_weight=0.0, hardness=0.0, lr=0.05),
            num_classes=CLASSES,
            image_shape=SHAPE,
            rng=rng(0),
            device=torch.device("cpu"),
            generator=Generator(SHAPE, nz=16, ngf=8),
            nz=16,
        )
        losses.append(res.best_loss)
    assert losses[1] < 0.5 * losses[0]


# -- the epoch loop --------------------------------------------------------------------------


def loop(seed: int = 0, teacher_norm: str = "none", **boost) -> DataFreeDistillation:
    settings = {"batch_size": 4}
    settings.update(boost)
    (student,) = models(1, seed=9)
    return DataFreeDistillation(
        models(3),
        student,
        small(),
        BoostSettings(**settings),
        num_classes=CLASSES,
        image_shape=SHAPE,
        flip=True,
        rng=rng(seed),
        device=torch.device("cpu"),
        epochs=4,
        nz=16,
        ngf=8,
        teacher_norm=teacher_norm,
    )


def test_epoch_grows_the_pool_and_learns_weights() -> None:
    run = loop()
    assert torch.allclose(run.weights, torch.full((3,), 1 / 3))
    assert math.isclose(run.mu, 0.1 / 3)
    for e in range(1, 4):
        stats = run.run_epoch()
        assert len(run.pool) == 6 * e and stats["pool_size"] == 6 * e
        assert stats["distill_steps"] == math.ceil(6 * e / 4)
        assert stats["weight_steps"] == math.ceil(6 * e / 4)
    assert not torch.allclose(run.weights, torch.full((3,), 1 / 3))
    assert torch.all((run.weights >= 0) & (run.weights <= 1))
    assert math.isclose(run.step_size(), 0.1 / 3 * 0.99**3)


def test_share_caps_bound_every_learned_share_and_name_the_capped() -> None:
    """Uncapped, the weight steps move one member's share above 1/3 (measured 0.338); with
    caps just above 1/3 no share ever exceeds its cap after a step, and the capped members are
    listed for the strategy's WARNING."""
    cap = 0.3334
    free = loop(seed=1, mu=0.5)
    capped = loop(seed=1, mu=0.5)
    capped.share_caps = torch.full((3,), cap)
    seen: set[int] = set()
    for _ in range(3):
        free.run_epoch()
        capped.run_epoch()
        shares = capped.weights / capped.weights.sum()
        assert float(shares.max()) <= cap + 1e-6, shares
        seen.update(capped.capped)
    assert float((free.weights / free.weights.sum()).max()) > cap + 1e-3, free.weights
    assert seen and all(0 <= i < 3 for i in seen)
    with pytest.raises(ValueError, match="share_caps"):
        DataFreeDistillation(
            models(3),
            models(1)[0],
            small(),
            BoostSettings(),
            num_classes=CLASSES,
            image_shape=SHAPE,
            flip=True,
            rng=rng(0),
            device=torch.device("cpu"),
            epochs=1,
            nz=16,
            ngf=8,
            share_caps=torch.ones(2),
        )


def test_switches_reweight_off_and_code_order() -> None:
    off = loop(reweight=False)
    for _ in range(2):
        assert off.run_epoch()["weight_steps"] == 0
    assert torch.equal(off.weights, torch.full((3,), 1 / 3))
    code = loop(order="code")
    assert code.run_epoch()["weight_steps"] == 0  # the first epoch has no pool yet
    assert code.run_epoch()["weight_steps"] == math.ceil(6 / 4)  # the old pool only


def test_diversify_off_distils_on_the_pool_as_stored() -> None:
    """Without DHS the student sees every pool image as stored or flipped, nothing else."""
    run = loop(diversify=False)
    seen: list[torch.Tensor] = []
    run.student.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach()))
    run._diversified = lambda x: pytest.fail("diversified without DHS")  # type: ignore[method-assign]
    for _ in range(2):
        run.run_epoch()
    stored = torch.cat(list(run.pool.inputs(0, 5)))
    views = torch.cat([stored, stored.flip(-1)])
    distilled = torch.cat([x for x in seen if x.shape[0] != 6][-3:])  # the last pass: 12 images
    assert distilled.shape[0] == 12
    assert all(bool((views == row).all((1, 2, 3)).any()) for row in distilled)
    x = torch.randn(2, *SHAPE)
    assert torch.equal(loop(diversify=False)._diversified(x), x)
    assert not torch.equal(loop()._diversified(x), x)


def sample_counter(model: nn.Module) -> list[int]:
    count = [0]
    model.register_forward_pre_hook(lambda _m, args: count.__setitem__(0, count[0] + len(args[0])))
    return count


PASSES = [
    ({"diversify": False, "reweight": False}, "distill"),  # DENSE: the distillation only
    ({"diversify": False}, "both"),  # no DHS: the re-weighting reads the stored pool too
    ({"order": "code"}, "reweight"),  # the old pool, as stored, from the second epoch on
    ({"diversify": False, "teacher_norm": "std"}, "both"),  # rescaled over each batch read
]


@pytest.mark.parametrize(("boost", "cached"), PASSES)
def test_cached_pool_logits_give_the_uncached_run(boost: dict, cached: str) -> None:
    """With ``cache_logits`` the client models see each pool image once per orientation (when it
    joins the pool), not once per pass, and the run is the uncached run: the same student,
    weights and losses up to float rounding (the models' logits on an image, computed in another
    batch, can differ in the last bit: 7e-9 seen here). The passes over the pool as stored read
    the cache; reading the wrong orientation moves the student by 1e-2."""
    runs, counts, losses = {}, {}, {}
    for cache in (True, False):
        run = loop(seed=5, cache_logits=cache, **boost)
        counts[cache] = sample_counter(run.models[0])
        losses[cache] = [run.run_epoch() for _ in range(5)]
        runs[cache] = run
    assert runs[False].pool_logits is None and runs[True].pool_logits is not None
    assert torch.allclose(runs[True].weights, runs[False].weights, atol=1e-6)
    for k, v in runs[False].student.state_dict().items():
        assert torch.allclose(v.float(), runs[True].student.state_dict()[k].float(), atol=1e-5), k
    for a, b in zip(losses[True], losses[False], strict=True):
        assert a["distill_loss"] == pytest.approx(b["distill_loss"], rel=1e-3)
        assert a["synthesis_loss"] == pytest.approx(b["synthesis_loss"], rel=1e-3)
    pools = [6 * e for e in range(1, 6)]  # pool size in each epoch's passes
    read = {"distill": sum(pools), "both": 2 * sum(pools), "reweight": sum(pools[:-1])}[cached]
    saved = read - 2 * pools[-1]  # every image cached in two orientations
    assert counts[False][0] - counts[True][0] == saved
    assert len(runs[True].pool_logits) == pools[-1]


def test_diversified_runs_keep_no_cache() -> None:
    """Co-Boosting in the paper's order reads only diversified pool batches: nothing to cache."""
    assert loop().pool_logits is None


def test_pool_logits_read_by_index_and_flip() -> None:
    nets = models(2, seed=1)
    for m in nets:
        m.eval()
    x = torch.randn(5, *SHAPE)
    cache = PoolLogits(nets, flip=True, device=torch.device("cpu"))
    cache.add(x[:3])
    cache.add(x[3:])
    flipped = torch.tensor([True, False, True])
    out = cache.read(np.array([4, 0, 1]), flipped)
    picked = torch.where(flipped[:, None, None, None], x[[4, 0, 1]].flip(-1), x[[4, 0, 1]])
    with torch.no_grad():
        expected = torch.stack([m(picked) for m in nets])
    assert out.shape == (2, 3, CLASSES)
    assert torch.allclose(out, expected, atol=1e-6)
    with pytest.raises(IndexError, match="only 5 images cached"):
        cache.read(np.array([5]), torch.tensor([False]))
    plain = PoolLogits(nets, flip=False, device=torch.device("cpu"))
    plain.add(x)
    with pytest.raises(ValueError, match="stored orientation only"):
        plain.read(np.array([0]), torch.tensor([True]))


@pytest.mark.parametrize("boost", [{}, {"diversify": False}])
def test_resumed_run_equals_an_uninterrupted_one(boost: dict) -> None:
    """Also with the pool's logits cached (no DHS): the resumed engine computes them again."""
    full = loop(seed=3, **boost)
    for _ in range(3):
        full.run_epoch()
    first = loop(seed=3, **boost)
    first.run_epoch()
    state = first.state_dict()
    resumed = loop(seed=99, **boost)  # a different rng: the state must carry it
    resumed.load_state_dict(state)
    for _ in range(2):
        resumed.run_epoch()
    assert torch.equal(full.weights, resumed.weights)
    assert (full.pool.dataset().x == resumed.pool.dataset().x).all()
    for k, v in full.student.state_dict().items():
        assert torch.equal(v, resumed.student.state_dict()[k]), k


def test_frozen_restores_modes_and_flags() -> None:
    m = nn.Sequential(nn.Linear(2, 2), nn.Dropout())
    m.train()
    m[0].bias.requires_grad_(False)
    with frozen([m]):
        assert not m.training and not any(p.requires_grad for p in m.parameters())
    assert m.training and m[0].weight.requires_grad and not m[0].bias.requires_grad


# -- FedGO's odds weights in the data-free loop ------------------------------------------------


def test_fedgo_multipliers_equal_fedgo_weighting_and_reduce_to_data_size():
    from fedgo_flwr.weighting import WeightingInputs, compute_weights

    torch.manual_seed(5)
    z = torch.randn(3, 7) * 4
    sizes = torch.tensor([10.0, 30.0, 60.0])
    for mode in ("double_sigmoid", "sigmoid"):
        ref = compute_weights(
            "fedgo",
            WeightingInputs(logits=torch.zeros(3, 7, CLASSES), num_examples=sizes, disc_logits=z),
            disc_mode=mode,
        )
        assert torch.allclose(fedgo_multipliers(z, sizes, mode), ref.float(), atol=1e-6)
    same = fedgo_multipliers(torch.full((3, 7), 2.5), sizes)
    assert torch.allclose(same, (sizes / sizes.sum()).view(3, 1).expand(3, 7), atol=1e-7)
    # Differentiable in the discriminator logits (the generator sees the weights move).
    zg = z.clone().requires_grad_(True)
    fedgo_multipliers(zg, sizes)[0].sum().backward()
    assert zg.grad is not None and zg.grad.abs().sum() > 0


def test_weight_step_through_per_sample_multipliers():
    labels = torch.tensor([0, 1])
    right = F.one_hot(labels, CLASSES).float() * 5
    wrong = F.one_hot((labels + 1) % CLASSES, CLASSES).float() * 5
    z = torch.stack([right, wrong])
    w = torch.tensor([0.5, 0.5])
    # The multipliers already favour member 0 on sample 0 and member 1 on sample 1.
    m = torch.tensor([[0.9, 0.1], [0.1, 0.9]])
    new = weight_step(w, z, labels, 0.1, m)
    assert torch.allclose(new, torch.tensor([0.6, 0.4]))
    mixed = weighted_logits(z, w[:, None] * m)
    assert torch.allclose(mixed[0], 0.9 * right[0] + 0.1 * wrong[0])


def test_engine_ensemble_with_sample_weights():
    run = loop()
    x = torch.randn(5, *SHAPE)
    plain = run.ensemble(x)
    run.sample_weights = lambda v: torch.full((3, v.shape[0]), 1 / 3)
    assert torch.allclose(run.ensemble(x), plain, atol=1e-6)
    run.sample_weights = lambda v: torch.tensor([1.0, 0.0, 0.0]).view(3, 1).expand(3, v.shape[0])
    assert torch.allclose(run.ensemble(x), member_logits(run.models, x)[0], atol=1e-6)
    stats = run.run_epoch()
    assert stats["pool_size"] == 6


def test_synthesis_maximises_the_student_ensemble_disagreement() -> None:
    """Eq. 7's L_A enters the synthesis loss with its own (negative) sign: with the adversarial
    term alone, the loss kept is minus beta times the tempered KL between the ensemble and the
    student on the images kept, and the steps raise that KL."""
    ens, (student,) = models(3), models(1, seed=9)
    w = torch.tensor([0.5, 0.3, 0.2])
    settings = small(source="pixels", lr=0.1, steps=8, ce_weight=0.0, adv_weight=2.0)

    def kl(images: torch.Tensor) -> float:
        x = to_model_input(images)
        with torch.no_grad():
            teacher = weighted_logits(member_logits(ens, x), w)
            return float(-adversarial_kl(student(x), teacher))

    for m in (*ens, student):
        m.eval()
    first = synthesize(
        ens,
        w,
        student,
        small(source="pixels", steps=1, ce_weight=0.0, adv_weight=2.0),
        num_classes=CLASSES,
        image_shape=SHAPE,
        rng=rng(3),
        device=torch.device("cpu"),
    )
    result = synthesize(
        ens,
        w,
        student,
        settings,
        num_classes=CLASSES,
        image_shape=SHAPE,
        rng=rng(3),
        device=torch.device("cpu"),
    )
    assert result.best_loss < 0
    assert math.isclose(result.best_loss, -2.0 * kl(result.images), rel_tol=1e-4)
    assert kl(result.images) > kl(first.images)  # same start (seed 3), eight steps uphill


def test_paper_order_reweights_on_diversified_pool_batches() -> None:
    """Alg. 1 (paper order): the weights are learned on the diversified pool (eq. 10 then eq.
    12); the code order re-weights on the stored pool before it grows."""
    seen = {}
    for order in ("paper", "code"):
        run = loop(order=order)
        calls: list[bool] = []
        original = run.reweight_pass
        run.reweight_pass = lambda diversified, f=original, c=calls: (
            c.append(diversified) or f(diversified)
        )  # type: ignore[method-assign]
        run.run_epoch()
        run.run_epoch()
        seen[order] = calls
    assert seen["paper"] == [True, True]
    assert seen["code"] == [False]  # epoch 0 has no pool to re-weight yet


def test_channels_last_switch_places_every_model_of_the_engine() -> None:
    """``resources.channels_last`` reaches the data-free server: client models, student and
    generator run in that format (the same math: the epoch's losses match the default's)."""

    def conv_weights(run: DataFreeDistillation) -> list[torch.Tensor]:
        mods = [*run.models, run.student, run.generator]
        return [p for m in mods for p in m.parameters() if p.dim() == 4]

    default = loop(seed=2)
    use_channels_last(True)
    try:
        fast = loop(seed=2)
    finally:
        use_channels_last(False)
    assert all(w.is_contiguous(memory_format=torch.channels_last) for w in conv_weights(fast))
    assert not all(
        w.is_contiguous(memory_format=torch.channels_last) for w in conv_weights(default)
    )
    a, b = default.run_epoch(), fast.run_epoch()
    assert a["distill_loss"] == pytest.approx(b["distill_loss"], rel=1e-4)
