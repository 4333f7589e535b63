"""Tests for :mod:`fedgo_flwr.gan` (FedGO pre-FL stage: WGAN-GP generator, client discriminators).

Covers the shapes/ranges of every model, the App. F.7.3 / Table 14 parameter counts, the gradient
penalty, CPU determinism of both training loops, a 2-D WGAN-GP that learns a shifted Gaussian,
client discriminators whose logits rank the clients correctly for FedGO's weighting (Eq. (9)),
the discriminators' logits on a data set (views, missing clients), and the GAN settings' checks.
Everything is small: the whole file runs in a few seconds on 2 CPU cores.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from fedgo_flwr import gan
from fedgo_flwr.config.schema import ConfigError, build_section
from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.gan.settings import DiscriminatorConfig, GanConfig, GeneratorConfig
from fedgo_flwr.learning.distill import view_batches
from fedgo_flwr.models.classifiers import count_parameters
from fedgo_flwr.weighting import WeightingInputs, compute_weights, discriminator_odds

IMAGE_SHAPES = ((3, 32, 32), (1, 8, 8))
VECTOR_SHAPE = (2,)
ALL_SHAPES = (*IMAGE_SHAPES, VECTOR_SHAPE)
IMAGE_ONLY = {"dcgan", "resnet", "cnn4", "cnn_mlp", "resnet8"}

# Small widths keep the shape tests fast; the architecture is the same as with the defaults.
SMALL_GEN = {"dcgan": {"width": 8}, "resnet": {"width": 8}, "mlp": {"hidden": 16}}
SMALL_CRITIC = {"dcgan": {"width": 8}, "resnet": {"width": 8}, "mlp": {"hidden": 16}}
SMALL_DISC = {
    "cnn4": {"width": 8},
    "cnn_mlp": {"width": 8},
    "resnet8": {"width": 8},
    "mlp": {"hidden": 16},
}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _gaussian(mean: tuple[float, float], n: int, seed: int, scale: float = 1.0) -> ArrayDataset:
    """``n`` points of ``N(mean, scale^2 I)`` as a float feature data set (labels unused)."""
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(n, 2)) * scale + np.asarray(mean)).astype(np.float32)
    return ArrayDataset(x, np.zeros(n, dtype=np.int64), num_classes=1)


def _images(shape: tuple[int, ...], n: int, seed: int) -> ArrayDataset:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)
    return ArrayDataset(x, np.zeros(n, dtype=np.int64), num_classes=1, flip=True)


class ShiftedNormal(nn.Module):
    """A frozen "generator" whose samples are ``N(mean, scale^2 I)`` in 2-D (``z`` is 2-D)."""

    def __init__(self, mean: tuple[float, float], scale: float = 1.0) -> None:
        super().__init__()
        self.latent_dim = 2
        self.output_shape = (2,)
        self.scale = scale
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32))

    def forward(self, z: Tensor) -> Tensor:
        return self.scale * z + self.mean


def _state_equal(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# ------------------------------------------------------------------------------------------
# Registries and shapes
# ------------------------------------------------------------------------------------------


def test_name_tuples() -> None:
    assert gan.GENERATOR_NAMES == ("dcgan", "resnet", "mlp")
    assert gan.CRITIC_NAMES == ("dcgan", "resnet", "mlp")
    assert gan.DISCRIMINATOR_NAMES == ("cnn4", "cnn_mlp", "resnet8", "mlp")


@pytest.mark.parametrize(
    ("builder", "names"),
    [
        (lambda n: gan.build_generator(n, 8, (2,)), gan.GENERATOR_NAMES),
        (lambda n: gan.build_critic(n, (2,)), gan.CRITIC_NAMES),
        (lambda n: gan.build_discriminator(n, (2,)), gan.DISCRIMINATOR_NAMES),
    ],
)
def test_unknown_names_list_the_valid_ones(builder, names: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match="nope") as info:
        builder("nope")
    for name in names:
        assert name in str(info.value)


@pytest.mark.parametrize("shape", ALL_SHAPES, ids=str)
@pytest.mark.parametrize("name", gan.GENERATOR_NAMES)
def test_generator_shapes_and_ranges(name: str, shape: tuple[int, ...]) -> None:
    if name in IMAGE_ONLY and len(shape) != 3:
        with pytest.raises(ValueError, match=rf"{name}.*\(2,\)"):
            gan.build_generator(name, 16, shape)
        return
    g = gan.build_generator(name, 16, shape, seed=0, **SMALL_GEN[name])
    assert g.latent_dim == 16 and tuple(g.output_shape) == shape
    z = torch.randn(5, 16, generator=_gen(0))
    for mode in (True, False):
        out = g.train(mode)(z)
        assert out.shape == (5, *shape)
        assert torch.isfinite(out).all()
        if len(shape) == 3:
            assert out.abs().max() <= 1.0  # tanh: same range as the normalised images


def test_mlp_generator_vector_output_is_unbounded_and_images_use_tanh() -> None:
    g = gan.build_generator("mlp", 2, (2,), seed=0, hidden=4, depth=1)
    assert not g.tanh
    with torch.no_grad():
        g.net[-1].bias.fill_(5.0)  # far outside [-1, 1], like the four-Gaussian toy's means
        assert float(g(torch.zeros(3, 2)).min()) > 3.0
    assert gan.build_generator("mlp", 2, (1, 8, 8), hidden=4).tanh
    assert gan.build_generator("mlp", 2, (2,), hidden=4, out_activation="tanh").tanh


@pytest.mark.parametrize("shape", ALL_SHAPES, ids=str)
@pytest.mark.parametrize("name", gan.CRITIC_NAMES)
def test_critic_shapes(name: str, shape: tuple[int, ...]) -> None:
    if name in IMAGE_ONLY and len(shape) != 3:
        with pytest.raises(ValueError, match=rf"{name}.*\(2,\)"):
            gan.build_critic(name, shape)
        return
    c = gan.build_critic(name, shape, seed=0, **SMALL_CRITIC[name])
    out = c(torch.randn(4, *shape, generator=_gen(1)))
    assert out.shape == (4,) and torch.isfinite(out).all()
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in c.modules())


def test_critic_layer_norm_variant() -> None:
    c = gan.build_critic("dcgan", (3, 32, 32), width=8, norm="layer")
    assert any(isinstance(m, nn.GroupNorm) for m in c.modules())
    assert c(torch.randn(2, 3, 32, 32)).shape == (2,)
    with pytest.raises(ValueError, match="norm"):
        gan.build_critic("dcgan", (3, 32, 32), norm="batch")


@pytest.mark.parametrize("shape", ALL_SHAPES, ids=str)
@pytest.mark.parametrize("name", gan.DISCRIMINATOR_NAMES)
def test_discriminator_shapes_return_raw_logits(name: str, shape: tuple[int, ...]) -> None:
    if name in IMAGE_ONLY and len(shape) != 3:
        with pytest.raises(ValueError, match=rf"{name}.*\(2,\)"):
            gan.build_discriminator(name, shape)
        return
    d = gan.build_discriminator(name, shape, seed=0, **SMALL_DISC[name])
    x = torch.randn(6, *shape, generator=_gen(2))
    with torch.no_grad():
        z = d.eval()(x)
        assert z.shape == (6,) and torch.isfinite(z).all()
        # Raw logits, not probabilities: large inputs push |z| far beyond 1.
        assert float(d(x * 1e4).abs().max()) > 1.0
    assert not any(isinstance(m, nn.Sigmoid) for m in d.modules())


@pytest.mark.parametrize("name", ["cnn4", "cnn_mlp", "resnet8"])
def test_discriminator_rejects_too_small_images(name: str) -> None:
    with pytest.raises(ValueError, match=rf"{name}.*\(1, 2, 2\)"):
        gan.build_discriminator(name, (1, 2, 2))


@pytest.mark.parametrize(
    ("name", "expected"),
    [("cnn4", 662_528), ("cnn_mlp", 142_336), ("resnet8", 1_230_528)],
)
def test_discriminator_parameter_counts_match_paper_table_14(name: str, expected: int) -> None:
    d = gan.build_discriminator(name, (3, 32, 32))
    assert count_parameters(d) == expected
    assert gan.count_bytes(d) == 4 * expected  # no buffers without BatchNorm


def test_batchnorm_variant_adds_buffers_to_count_bytes() -> None:
    d = gan.build_discriminator("cnn4", (3, 32, 32), norm="batch")
    params = count_parameters(d)
    assert params == 662_528 + 2 * (128 + 256)
    buffers = sum(b.numel() * b.element_size() for b in d.buffers())
    assert buffers > 0 and gan.count_bytes(d) == 4 * params + buffers
    # ResNet generator of gan_cifar_resnet.py: App. G's "4.61MB" generator.
    g = gan.build_generator("resnet", 128, (3, 32, 32))
    assert count_parameters(g) == 1_204_483
    assert 4.55 < gan.count_bytes(g) / 2**20 < 4.62


@pytest.mark.parametrize(
    ("hw", "plan"),
    [((32, 32), (3, 4, 4)), ((8, 8), (2, 2, 2)), ((64, 64), (4, 4, 4)), ((28, 28), (2, 7, 7))],
)
def test_upsampling_plan(hw: tuple[int, int], plan: tuple[int, int, int]) -> None:
    assert gan.upsampling_plan(*hw) == plan


def test_upsampling_plan_rejects_odd_sides() -> None:
    with pytest.raises(ValueError, match="7x7"):
        gan.upsampling_plan(7, 7)
    with pytest.raises(ValueError, match="dcgan"):
        gan.build_generator("dcgan", 8, (3, 7, 7))


def test_build_seed_is_reproducible_and_leaves_global_rng_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = gan.build_discriminator("cnn4", (1, 8, 8), seed=7, width=4)
    b = gan.build_discriminator("cnn4", (1, 8, 8), seed=7, width=4)
    assert torch.equal(torch.rand(3), expected)
    assert _state_equal(a, b)
    c = gan.build_discriminator("cnn4", (1, 8, 8), seed=8, width=4)
    assert not _state_equal(a, c)


# ------------------------------------------------------------------------------------------
# Gradient penalty
# ------------------------------------------------------------------------------------------


def _linear_critic(weight: list[float]) -> nn.Module:
    critic = nn.Sequential(nn.Flatten(), nn.Linear(len(weight), 1))
    with torch.no_grad():
        critic[1].weight.copy_(torch.tensor([weight]))
        critic[1].bias.fill_(0.3)
    return critic


def test_gradient_penalty_is_zero_for_unit_norm_linear_critic() -> None:
    critic = _linear_critic([0.6, 0.8])  # ‖w‖ = 1: 1-Lipschitz with unit gradient everywhere
    real = torch.randn(64, 2, generator=_gen(0)) + 4
    fake = torch.randn(64, 2, generator=_gen(1))
    norms = gan.interpolate_gradient_norms(critic, real, fake, rng=_gen(2))
    assert torch.allclose(norms, torch.ones(64), atol=1e-6)
    gp = gan.gradient_penalty(critic, real, fake, rng=_gen(2)).item()
    assert gp == pytest.approx(0.0, abs=1e-10)
    # Scaling the weight by 3 gives ‖∇D‖ = 3 and a penalty of (3 - 1)^2 = 4.
    gp3 = gan.gradient_penalty(_linear_critic([1.8, 2.4]), real, fake, rng=_gen(2))
    assert gp3.item() == pytest.approx(4.0, rel=1e-5)


def test_gradient_penalty_is_finite_non_negative_and_differentiable() -> None:
    critic = gan.build_critic("dcgan", (1, 8, 8), seed=0, width=4)
    real = torch.rand(8, 1, 8, 8, generator=_gen(0)) * 2 - 1
    fake = torch.rand(8, 1, 8, 8, generator=_gen(1)) * 2 - 1
    gp = gan.gradient_penalty(critic, real, fake, rng=_gen(3))
    assert gp.dim() == 0 and torch.isfinite(gp) and gp.item() >= 0.0
    gp.backward()
    # Every weight gets a finite gradient (the output bias does not affect ∇_x D, so it gets none).
    weights = [p for name, p in critic.named_parameters() if name.endswith("weight")]
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in weights)
    assert all(float(p.grad.abs().sum()) > 0 for p in weights)


def test_gradient_penalty_drives_gradient_norm_toward_one() -> None:
    gen = _gen(0)
    real = torch.randn(128, 2, generator=gen) + 2
    fake = torch.randn(128, 2, generator=gen) - 2
    for start in ([3.0, 4.0], [0.06, 0.08]):  # ‖w‖ = 5 and 0.1
        critic = _linear_critic(start)
        opt = torch.optim.SGD(critic.parameters(), lr=0.1)
        before = gan.interpolate_gradient_norms(critic, real, fake, rng=_gen(1)).mean().item()
        for _ in range(60):
            opt.zero_grad()
            gan.gradient_penalty(critic, real, fake, rng=gen).backward()
            opt.step()
        after = gan.interpolate_gradient_norms(critic, real, fake, rng=_gen(1)).mean().item()
        assert abs(after - 1.0) < 0.1 < abs(before - 1.0)


# ------------------------------------------------------------------------------------------
# WGAN-GP training
# ------------------------------------------------------------------------------------------


def _tiny_wgan(seed: int) -> tuple[nn.Module, nn.Module, dict[str, float]]:
    g = gan.build_generator("dcgan", 8, (1, 8, 8), seed=0, width=4)
    c = gan.build_critic("dcgan", (1, 8, 8), seed=1, width=4)
    stats = gan.train_wgan_gp(
        g, c, _images((1, 8, 8), 40, seed=0), steps=3, batch_size=16, rng=_gen(seed)
    )
    return g, c, stats


def test_wgan_gp_is_deterministic_given_the_generator_seed() -> None:
    g1, c1, s1 = _tiny_wgan(seed=5)
    g2, c2, s2 = _tiny_wgan(seed=5)
    assert _state_equal(g1, g2) and _state_equal(c1, c2)
    assert s1["critic_loss"] == s2["critic_loss"] and s1["generator_loss"] == s2["generator_loss"]
    g3, _, _ = _tiny_wgan(seed=6)
    assert not _state_equal(g1, g3)
    assert s1["steps"] == 3 and s1["critic_steps"] == 15 and s1["seconds"] >= 0
    for key in ("critic_loss", "generator_loss", "wasserstein", "gradient_penalty", "grad_norm"):
        assert math.isfinite(s1[key])
    # The reported penalty E[(‖∇‖ - 1)²] and mean norm come from the same norms (Jensen).
    assert s1["gradient_penalty"] >= (s1["grad_norm"] - 1.0) ** 2 - 1e-6
    assert all(p.requires_grad for p in c1.parameters())


def test_wgan_gp_snapshots_of_a_long_run_are_the_short_runs() -> None:
    """``on_step`` sees every step; the generator after step k of a 5-step run is, bit for bit,
    the generator of a k-step run (what benchmarks/discriminator_variants.py relies on to keep
    several generator budgets from one training)."""
    data = _images((1, 8, 8), 40, seed=0)

    def models() -> tuple[nn.Module, nn.Module]:
        return (
            gan.build_generator("dcgan", 8, (1, 8, 8), seed=0, width=4),
            gan.build_critic("dcgan", (1, 8, 8), seed=1, width=4),
        )

    g, c = models()
    seen: list[int] = []
    snaps: dict[int, dict[str, torch.Tensor]] = {}

    def keep(step: int) -> None:
        seen.append(step)
        snaps[step] = {k: v.clone() for k, v in g.state_dict().items()}

    gan.train_wgan_gp(g, c, data, steps=5, batch_size=16, rng=_gen(3), on_step=keep)
    assert seen == [1, 2, 3, 4, 5]
    for k in (2, 4):
        short, critic = models()
        gan.train_wgan_gp(short, critic, data, steps=k, batch_size=16, rng=_gen(3))
        assert all(torch.equal(snaps[k][n], v) for n, v in short.state_dict().items())
    assert not all(torch.equal(snaps[2][n], v) for n, v in snaps[4].items())


def _tiny_models() -> tuple[nn.Module, nn.Module]:
    return (
        gan.build_generator("dcgan", 8, (1, 8, 8), seed=0, width=4),
        gan.build_critic("dcgan", (1, 8, 8), seed=1, width=4),
    )


class _Stop(Exception):
    pass


def _stop_at(step: int):
    def on_step(done: int) -> None:
        if done == step:
            raise _Stop

    return on_step


@pytest.mark.parametrize("lr_decay", [False, True])
def test_wgan_gp_stopped_and_resumed_ends_with_the_uninterrupted_generator(
    tmp_path, lr_decay
) -> None:
    """A training stopped after step 3 of 7 goes on from its snapshot (both models, both
    optimisers, the schedules, the RNG, the place in a pass of shuffled, flipped batches: 36
    images at batch 8 make passes of 4 batches, 3 critic steps a generator step, so step 3 ends
    inside a pass) and ends bit for bit where the uninterrupted training ends; the snapshot is
    gone at the end."""
    data = _images((1, 8, 8), 36, seed=0)
    kw = {"steps": 7, "batch_size": 8, "n_critic": 3, "augment": True, "lr_decay": lr_decay}
    g, c = _tiny_models()
    straight = gan.train_wgan_gp(g, c, data, rng=_gen(3), **kw)
    snap = tmp_path / "training.pt"
    g1, c1 = _tiny_models()
    with pytest.raises(_Stop):  # a snapshot after every step; the run ends at step 3
        gan.train_wgan_gp(
            g1, c1, data, rng=_gen(3), resume_file=snap, save_every=0, on_step=_stop_at(3), **kw
        )
    assert snap.is_file()
    g2, c2 = _tiny_models()  # a new process: fresh models and a fresh RNG
    seen: list[int] = []
    resumed = gan.train_wgan_gp(
        g2, c2, data, rng=_gen(3), resume_file=snap, save_every=0, on_step=seen.append, **kw
    )
    assert seen == [4, 5, 6, 7] and resumed["resumed_at"] == 3 and "resumed_at" not in straight
    assert _state_equal(g, g2) and _state_equal(c, c2)
    assert resumed["generator_loss"] == straight["generator_loss"]
    assert not snap.exists()


def test_wgan_gp_a_snapshot_of_another_training_is_left_out(tmp_path, caplog) -> None:
    data = _images((1, 8, 8), 30, seed=0)
    snap = tmp_path / "training.pt"
    g, c = _tiny_models()
    with pytest.raises(_Stop):
        gan.train_wgan_gp(
            g,
            c,
            data,
            steps=5,
            batch_size=16,
            rng=_gen(3),
            resume_file=snap,
            save_every=0,
            on_step=_stop_at(2),
        )
    g1, c1 = _tiny_models()
    with caplog.at_level("WARNING"):
        stats = gan.train_wgan_gp(
            g1, c1, data, steps=4, batch_size=16, rng=_gen(3), resume_file=snap
        )
    assert "resumed_at" not in stats and "starting from step 0" in caplog.text
    g2, c2 = _tiny_models()
    gan.train_wgan_gp(g2, c2, data, steps=4, batch_size=16, rng=_gen(3))
    assert _state_equal(g1, g2)  # from the start, as without a snapshot
    snap.write_bytes(b"not a snapshot")
    g3, c3 = _tiny_models()
    with caplog.at_level("WARNING"):
        stats = gan.train_wgan_gp(
            g3, c3, data, steps=4, batch_size=16, rng=_gen(3), resume_file=snap
        )
    assert "resumed_at" not in stats and _state_equal(g3, g2) and not snap.exists()


@pytest.mark.parametrize(("n", "batch"), [(30, 8), (32, 8), (5, 8)])
def test_wgan_gp_real_batches_are_batches_pass_after_pass(n, batch) -> None:
    """The resumable batch stream draws what ``batches`` draws pass after pass (a permutation a
    pass, a flip mask a batch), other draws from the same RNG between batches included, and a
    copy restored from its state goes on with the same batches."""
    from fedgo_flwr.data import batches
    from fedgo_flwr.gan.wgan_gp import _RealBatches

    data = _images((1, 8, 8), n, seed=1)
    rng_a, rng_b = _gen(9), _gen(9)
    drop = n >= batch

    def old_stream():
        while True:
            yield from (
                x
                for x, _ in batches(
                    data, batch, shuffle=True, rng=rng_a, augment=True, drop_last=drop
                )
            )

    old = old_stream()
    new = _RealBatches(data, batch, rng_b, True, torch.device("cpu"))
    for i in range(12):
        assert torch.equal(next(old), next(new)), i
        torch.rand(3, generator=rng_a), torch.rand(3, generator=rng_b)  # z, alpha between batches
        if i == 6:
            state, rng_state = new.state(), rng_b.get_state()
    copy = _RealBatches(data, batch, _gen(0), True, torch.device("cpu"))
    copy.restore(state)
    copy.rng.set_state(rng_state)
    replay = _RealBatches(data, batch, _gen(9), True, torch.device("cpu"))
    rng_c = replay.rng
    for _ in range(7):
        next(replay)
        torch.rand(3, generator=rng_c)
    for _ in range(5):
        assert torch.equal(next(copy), next(replay))
        torch.rand(3, generator=copy.rng), torch.rand(3, generator=rng_c)


def test_wgan_gp_zero_steps_and_validation() -> None:
    g = gan.build_generator("mlp", 2, (2,), hidden=4)
    c = gan.build_critic("mlp", (2,), hidden=4)
    before = {k: v.clone() for k, v in g.state_dict().items()}
    stats = gan.train_wgan_gp(g, c, _gaussian((0, 0), 8, 0), steps=0, rng=_gen(0))
    assert stats["steps"] == 0 and math.isnan(stats["critic_loss"])
    assert all(torch.equal(before[k], v) for k, v in g.state_dict().items())
    with pytest.raises(ValueError, match="steps"):
        gan.train_wgan_gp(g, c, _gaussian((0, 0), 8, 0), steps=-1, rng=_gen(0))
    with pytest.raises(ValueError, match="n_critic"):
        gan.train_wgan_gp(g, c, _gaussian((0, 0), 8, 0), steps=1, n_critic=0, rng=_gen(0))


def test_wgan_gp_learns_a_shifted_gaussian() -> None:
    data = _gaussian((4.0, 4.0), 512, seed=0)
    target = torch.tensor([4.0, 4.0])
    g = gan.build_generator("mlp", 2, (2,), seed=1, hidden=32)
    c = gan.build_critic("mlp", (2,), seed=1, hidden=32)
    before = float((gan.sample(g, 2000, rng=_gen(9)).mean(0) - target).norm())
    stats = gan.train_wgan_gp(g, c, data, steps=300, lr=1e-3, lr_decay=True, rng=_gen(1))
    after = float((gan.sample(g, 2000, rng=_gen(9)).mean(0) - target).norm())
    assert before > 5.0
    assert after < 0.25 * before, (before, after, stats)


# ------------------------------------------------------------------------------------------
# Client discriminators (Alg. 3)
# ------------------------------------------------------------------------------------------


def test_train_discriminator_is_deterministic_and_leaves_generator_untouched() -> None:
    data = _images((1, 8, 8), 40, seed=1)
    g = gan.build_generator("dcgan", 8, (1, 8, 8), seed=0, width=4).train()
    g_before = {k: v.clone() for k, v in g.state_dict().items()}
    runs = []
    for _ in range(2):
        d = gan.build_discriminator("cnn4", (1, 8, 8), seed=3, width=4)
        stats = gan.train_discriminator(
            d, g, data, epochs=1, batch_size=16, rng=_gen(11), augment=True
        )
        runs.append((d, stats))
    assert _state_equal(runs[0][0], runs[1][0])
    assert runs[0][1]["loss"] == runs[1][1]["loss"]
    assert runs[0][1]["steps"] == 3 and runs[0][1]["epochs"] == 1
    assert runs[0][1]["num_examples"] == 40
    # The generator is frozen: same weights and BN statistics, and its train mode is restored.
    assert all(torch.equal(g_before[k], v) for k, v in g.state_dict().items())
    assert g.training
    d_other = gan.build_discriminator("cnn4", (1, 8, 8), seed=3, width=4)
    gan.train_discriminator(d_other, g, data, epochs=1, batch_size=16, rng=_gen(12))
    assert not _state_equal(runs[0][0], d_other)


def _features(*parts: np.ndarray) -> ArrayDataset:
    x = np.concatenate(parts).astype(np.float32)
    return ArrayDataset(x, np.zeros(len(x), dtype=np.int64), num_classes=1)


def _separation(disc: nn.Module) -> float:
    real = _gaussian((3.0, 3.0), 1000, seed=50).x
    fake = (torch.randn(1000, 2, generator=_gen(51)) - 3.0).numpy()
    z = gan.discriminator_logits({0: disc}, _features(real, fake))[0, 0]
    return float(((z[:1000] > 0).float().mean() + (z[1000:] < 0).float().mean()) / 2)


@pytest.mark.parametrize("loss", gan.DISCRIMINATOR_LOSSES)
def test_discriminator_separates_data_from_a_fixed_generator(loss: str) -> None:
    d = gan.build_discriminator("mlp", (2,), seed=0, hidden=32)
    stats = gan.train_discriminator(
        d,
        ShiftedNormal((-3.0, -3.0)),
        _gaussian((3.0, 3.0), 512, seed=1),
        epochs=5,
        lr=1e-3,
        rng=_gen(0),
        loss=loss,
    )
    assert stats["steps"] == 5 * 8
    assert 0.0 <= stats["fake_accuracy"] <= 1.0 and 0.0 <= stats["real_accuracy"] <= 1.0
    assert math.isfinite(stats["loss"])
    assert _separation(d) > 0.95


def test_client_discriminators_rank_their_own_data_first() -> None:
    """Two clients at different modes against one wide generator: each client's discriminator
    scores its own data above the other's, so FedGO's odds and weights pick the owner."""
    wide = ShiftedNormal((0.0, 0.0), scale=4.0)
    means = ((3.0, 3.0), (-3.0, 3.0))
    discs = []
    for k, mean in enumerate(means):
        d = gan.build_discriminator("mlp", (2,), seed=k, hidden=32)
        gan.train_discriminator(
            d, wide, _gaussian(mean, 512, seed=10 + k), epochs=10, lr=1e-3, rng=_gen(k)
        )
        discs.append(d)
    xa = _gaussian(means[0], 300, seed=20).x
    xb = _gaussian(means[1], 300, seed=21).x
    z = gan.discriminator_logits(dict(enumerate(discs)), _features(xa, xb), batch_size=128)[:, 0]
    assert z.shape == (2, 600)
    own_a = (z[0, :300] > z[1, :300]).float().mean()
    own_b = (z[1, 300:] > z[0, 300:]).float().mean()
    assert own_a > 0.95 and own_b > 0.95
    phi = discriminator_odds(z, mode="double_sigmoid")  # the paper's Φ ∈ (1, e)
    assert (phi[0, :300] > phi[1, :300]).float().mean() > 0.95
    inputs = WeightingInputs(
        logits=torch.zeros(2, 600, 3), num_examples=torch.tensor([512, 512]), disc_logits=z
    )
    w = compute_weights("fedgo", inputs)
    assert float(w[0, :300].mean()) > 0.5 and float(w[1, 300:].mean()) > 0.5


def test_train_discriminator_validation_and_zero_epochs() -> None:
    d = gan.build_discriminator("mlp", (2,), hidden=4)
    data = _gaussian((0.0, 0.0), 8, seed=0)
    with pytest.raises(ValueError, match="double_sigmoid"):
        gan.train_discriminator(d, ShiftedNormal((0, 0)), data, epochs=1, rng=_gen(0), loss="x")
    with pytest.raises(ValueError, match="latent_dim"):
        gan.train_discriminator(d, nn.Identity(), data, epochs=1, rng=_gen(0))
    stats = gan.train_discriminator(d, ShiftedNormal((0, 0)), data, epochs=0, rng=_gen(0))
    assert stats["steps"] == 0 and math.isnan(stats["loss"])


# ------------------------------------------------------------------------------------------
# Sampling and server-side evaluation
# ------------------------------------------------------------------------------------------


def test_sample_is_reproducible_and_batch_size_independent() -> None:
    g = gan.build_generator("dcgan", 8, (1, 8, 8), seed=0, width=4).train()
    a = gan.sample(g, 10, rng=_gen(3), batch_size=4)
    b = gan.sample(g, 10, 8, rng=_gen(3), batch_size=256)
    assert a.shape == (10, 1, 8, 8) and a.dtype == torch.float32 and a.device.type == "cpu"
    # Same latent codes whatever the batch size; the convolutions may round differently per
    # batch size (kernel blocking), so equal up to float error, not bit for bit.
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert a.abs().max() <= 1.0
    assert not torch.equal(a, gan.sample(g, 10, rng=_gen(4)))
    assert g.training  # mode restored
    assert gan.sample(g, 0, rng=_gen(3)).shape == (0, 1, 8, 8)


def _logits_reference(
    discs: dict[int, nn.Module], data: ArrayDataset, views: int, num_clients: int
) -> Tensor:
    """The loop FedGO's strategy ran before :func:`gan.discriminator_logits` existed."""
    out = torch.zeros(num_clients, views, len(data))
    for pid, disc in discs.items():
        disc.eval()
        with torch.no_grad():
            parts: list[list[Tensor]] = [[] for _ in range(views)]
            for v, x in view_batches(data, views, 512, torch.device("cpu")):
                parts[v].append(disc(x).float().cpu().reshape(-1))
        out[pid] = torch.stack([torch.cat(p) for p in parts])
    return out


def _small_discs(*pids: int) -> dict[int, nn.Module]:
    return {
        pid: gan.build_discriminator("cnn_mlp", (1, 8, 8), seed=pid, width=4).train()
        for pid in pids
    }


def test_discriminator_logits_match_direct_forward_per_view() -> None:
    data = _images((1, 8, 8), 7, seed=4)
    discs = _small_discs(0, 2)
    z = gan.discriminator_logits(discs, data, views=2, num_clients=4, batch_size=3)
    assert z.shape == (4, 2, 7) and z.dtype == torch.float32 and z.device.type == "cpu"
    x, _ = data.to_tensors()
    for pid, disc in discs.items():
        assert disc.training  # train/eval mode restored
        with torch.no_grad():
            disc.eval()
            torch.testing.assert_close(z[pid, 0], disc(x), rtol=0, atol=1e-6)
            torch.testing.assert_close(z[pid, 1], disc(x.flip(-1)), rtol=0, atol=1e-6)
    assert not torch.equal(z[0, 0], z[0, 1])  # view 1 really is the flipped images
    assert not torch.equal(z[0], z[2])
    # Clients without a discriminator get the neutral logit 0 everywhere.
    assert torch.equal(z[1], torch.zeros(2, 7)) and torch.equal(z[3], torch.zeros(2, 7))


def test_discriminator_logits_equal_the_strategys_former_loop_bit_for_bit() -> None:
    data = _images((1, 8, 8), 600, seed=5)  # more than one batch of 512
    discs = _small_discs(3, 0)
    for views in (1, 2):
        z = gan.discriminator_logits(discs, data, views=views, num_clients=5)
        assert torch.equal(z, _logits_reference(discs, data, views, 5))


def test_discriminator_logits_rows_and_edge_cases() -> None:
    data = _images((1, 8, 8), 5, seed=6)
    discs = _small_discs(1)
    assert gan.discriminator_logits(discs, data).shape == (2, 1, 5)  # K = largest id + 1
    assert gan.discriminator_logits({}, data).shape == (0, 1, 5)
    assert torch.equal(gan.discriminator_logits({}, data, num_clients=3), torch.zeros(3, 1, 5))
    assert gan.discriminator_logits(discs, data.subset(np.arange(0)), views=2).shape == (2, 2, 0)
    with pytest.raises(ValueError, match=r"\[1\]"):
        gan.discriminator_logits(discs, data, num_clients=1)
    with pytest.raises(ValueError, match=r"\[-1\]"):
        gan.discriminator_logits({-1: discs[1]}, data, num_clients=3)
    with pytest.raises(ValueError, match="views"):
        gan.discriminator_logits(discs, data, views=0)


# ------------------------------------------------------------------------------------------
# Settings (strategy.generator / strategy.discriminator)
# ------------------------------------------------------------------------------------------


def test_gan_settings_defaults_pass_their_checks() -> None:
    cfg = build_section(GanConfig, {}, "strategy.")
    assert cfg == GanConfig()
    assert cfg.generator.name in gan.GENERATOR_NAMES
    assert cfg.discriminator.name in gan.DISCRIMINATOR_NAMES
    assert cfg.discriminator.loss in gan.DISCRIMINATOR_LOSSES
    built = build_section(
        GanConfig,
        {"generator": {"name": "mlp", "steps": 0, "gp_lambda": 0}, "discriminator": {"lr": 1}},
        "strategy.",
    )
    assert built.generator.steps == 0 and built.generator.gp_lambda == 0.0
    assert built.discriminator.lr == 1.0


def test_generator_model_kwargs() -> None:
    assert GeneratorConfig(name="dcgan", width=16).model_kwargs() == {"width": 16}
    assert GeneratorConfig(name="resnet", width=8).model_kwargs() == {"width": 8}
    assert GeneratorConfig(name="mlp", width=16).model_kwargs() == {}


@pytest.mark.parametrize(
    ("cls", "key", "value"),
    [
        (GeneratorConfig, "name", "nope"),
        (GeneratorConfig, "latent_dim", 0),
        (GeneratorConfig, "width", 0),
        (GeneratorConfig, "steps", -1),
        (GeneratorConfig, "batch_size", 0),
        (GeneratorConfig, "lr", 0.0),
        (GeneratorConfig, "n_critic", 0),
        (GeneratorConfig, "gp_lambda", -1),
        (DiscriminatorConfig, "name", "nope"),
        (DiscriminatorConfig, "epochs", 0),
        (DiscriminatorConfig, "batch_size", 0),
        (DiscriminatorConfig, "lr", -2e-4),
        (DiscriminatorConfig, "loss", "nope"),
    ],
)
def test_each_bad_gan_setting_names_its_own_key(cls: type, key: str, value: object) -> None:
    section = "generator" if cls is GeneratorConfig else "discriminator"
    with pytest.raises(ConfigError) as info:
        build_section(cls, {key: value}, f"strategy.{section}.")
    assert info.value.key == f"strategy.{section}.{key}"
    assert info.value.value == value
    # The same through the nested section, as the clients build it.
    with pytest.raises(ConfigError) as nested:
        build_section(GanConfig, {section: {key: value}}, "strategy.")
    assert nested.value.key == f"strategy.{section}.{key}"


def test_bad_gan_setting_message_names_key_value_and_choices() -> None:
    with pytest.raises(
        ConfigError, match=r"^strategy\.generator\.gp_lambda = -1\.0: must be >= 0$"
    ):
        build_section(GeneratorConfig, {"gp_lambda": -1}, "strategy.generator.")
    with pytest.raises(ConfigError, match="cnn4, cnn_mlp, resnet8, mlp"):
        build_section(DiscriminatorConfig, {"name": "cnn5"}, "strategy.discriminator.")
