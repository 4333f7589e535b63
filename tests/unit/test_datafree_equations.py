"""Hand computations that pin the data-free terms (Co-Boosting, DENSE, DeepInversion) closer
than tests/unit/test_datafree.py does: each test here fails under a change of one operator,
constant or argument of fedgo_flwr/datafree/{losses,ensemble,synthesis}.py (docs/mutation.md)."""

from __future__ import annotations

import math
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from helpers import Linear
from torch import nn

from fedgo_flwr.config.schema import Checker, ConfigError
from fedgo_flwr.datafree import (
    BNStatistics,
    Generator,
    SynthesisSettings,
    adversarial_kl,
    diversify,
    fedgo_multipliers,
    hard_cross_entropy,
    image_prior_losses,
    kd_loss,
    synthesize,
    to_model_input,
    weight_step,
    weighted_logits,
)

# -- losses ----------------------------------------------------------------------------------


def test_losses_name_the_class_dimension() -> None:
    """The losses take softmax over the class dimension by name: an implicit dimension is
    deprecated in torch and warns on every call (once per synthesis step)."""
    s = torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 0.5]])
    t = torch.tensor([[1.0, 0.0, 0.0], [2.0, 0.0, 1.0]])
    y = torch.tensor([0, 2])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hard_cross_entropy(s, y)
        adversarial_kl(s, t, 3.0, mask=True)
        kd_loss(s, t)


def bn_model(mean: tuple[float, float], var: tuple[float, float]) -> nn.Module:
    bn = nn.BatchNorm2d(2).eval()
    bn.running_mean.copy_(torch.tensor(mean))
    bn.running_var.copy_(torch.tensor(var))
    return nn.Sequential(bn)


def test_bn_statistics_is_the_two_norms_of_both_gaps_averaged_over_models() -> None:
    """DeepInversion eq. 4: ``||mu(x) - mu||_2 + ||sigma^2(x) - sigma^2||_2`` per layer, with
    the batch's biased variance, summed over a model's layers and averaged over the models."""
    # Channel c holds m_c +- s_c (four values each): mean m_c, biased variance s_c^2.
    m, s = torch.tensor([1.0, 2.0]), torch.tensor([2.0, 3.0])
    sign = torch.tensor([1.0, -1.0, 1.0, -1.0]).view(2, 1, 1, 2)
    x = m.view(1, 2, 1, 1) + sign * s.view(1, 2, 1, 1)  # (2, 2, 1, 2)
    assert torch.allclose(x.mean((0, 2, 3)), m) and torch.allclose(x.var((0, 2, 3), False), s**2)
    off = bn_model((0.0, 0.0), (1.0, 1.0))  # gaps: means (1, 2), variances (3, 8)
    at = bn_model((1.0, 2.0), (4.0, 9.0))  # the batch's own statistics: gap 0
    one = math.sqrt(1 + 4) + math.sqrt(9 + 64)
    stats = BNStatistics([off, at])
    off(x)
    at(x)
    assert math.isclose(float(stats.loss()), one / 2, rel_tol=1e-6)
    stats.remove()
    assert stats.layers == 0
    stats.remove()  # a second call is harmless
    stats = BNStatistics([off])
    off(x)
    assert math.isclose(float(stats.loss()), one, rel_tol=1e-6)
    stats.remove()


def test_image_priors_by_hand() -> None:
    """Total variation: the mean squared vertical plus the mean squared horizontal neighbour
    difference; L2: the mean squared value. An image one pixel high or wide has no TV."""
    x = torch.tensor([[0.0, 1.0, 3.0], [2.0, 2.0, 0.0], [1.0, 4.0, 4.0]]).view(1, 1, 3, 3)
    # Vertical differences (2, 1, -3), (-1, 2, 4): 35 / 6; horizontal (1, 2), (0, -2), (3, 0):
    # 18 / 6; squares 0 + 1 + 9 + 4 + 4 + 0 + 1 + 16 + 16 = 51 over 9 values.
    tv, l2 = image_prior_losses(x)
    assert math.isclose(float(tv), 35 / 6 + 3, rel_tol=1e-6)
    assert math.isclose(float(l2), 51 / 9, rel_tol=1e-6)
    for shape in ((2, 1, 1, 4), (2, 1, 4, 1), (1, 1, 1, 1)):
        line = torch.arange(1.0, 9.0)[: math.prod(shape)].view(shape)
        tv, l2 = image_prior_losses(line)
        assert float(tv) == 0.0, shape
        assert math.isclose(float(l2), float(line.pow(2).mean()), rel_tol=1e-6)
    # Two by two: the smallest image with both differences.
    tv, _ = image_prior_losses(torch.tensor([[0.0, 1.0], [3.0, 5.0]]).view(1, 1, 2, 2))
    assert math.isclose(float(tv), (9 + 16) / 2 + (1 + 4) / 2, rel_tol=1e-6)


# -- synthesis settings ----------------------------------------------------------------------

# (field, the last accepted value, the first rejected one)
BOUNDS = [
    ("batch_size", 1, 0),
    ("steps", 1, 0),
    ("lr", 1e-9, 0.0),
    ("beta1", 0.0, -0.1),
    ("beta1", 0.999, 1.0),
    ("grad_clip", 0.0, -1.0),
    ("hardness", 0.0, -0.5),
    ("adv_temperature", 1e-3, 0.0),
    ("ce_weight", 0.0, -1.0),
    ("adv_weight", 0.0, -1.0),
    ("bn_weight", 0.0, -1.0),
    ("tv_weight", 0.0, -1.0),
    ("l2_weight", 0.0, -1.0),
]


def check(settings: SynthesisSettings) -> None:
    settings.check(Checker(prefix="synthesis.", obj=settings))


@pytest.mark.parametrize(("field", "ok", "bad"), BOUNDS)
def test_synthesis_settings_bounds(field: str, ok: float, bad: float) -> None:
    check(SynthesisSettings(**{field: ok}))
    with pytest.raises(ConfigError) as err:
        check(SynthesisSettings(**{field: bad}))
    assert err.value.key == f"synthesis.{field}" and err.value.value == bad
    assert err.value.problem.startswith("must be ")  # the message says what is accepted


def test_synthesis_settings_defaults_and_sources() -> None:
    check(SynthesisSettings())
    check(SynthesisSettings(source="pixels"))
    with pytest.raises(ConfigError) as err:
        check(SynthesisSettings(source="noise"))
    assert err.value.key == "synthesis.source" and "generator, pixels" in err.value.problem


# -- ensemble weights (eqs. 11-12) -----------------------------------------------------------

LABELS = torch.tensor([0, 1])
RIGHT = F.one_hot(LABELS, 3).float() * 5
WRONG = F.one_hot((LABELS + 1) % 3, 3).float() * 5


def test_weight_step_clips_each_weight_to_at_most_one() -> None:
    """Eq. 12's Normalize clips to [0, 1]: the better member's 0.9 + 0.3 stops at 1, the worse
    one's 0.5 - 0.3 is 0.2 (both weights non-zero, so neither gradient vanishes)."""
    new = weight_step(torch.tensor([0.9, 0.5]), torch.stack([RIGHT, WRONG]), LABELS, 0.3)
    assert torch.allclose(new, torch.tensor([1.0, 0.2]))


def test_weight_step_leaves_w_alone_where_one_member_decides_each_sample() -> None:
    """With one-hot multipliers (member 0 alone on sample 0, member 1 alone on sample 1) the
    mixed logits ``w_k m_k z_k / w_k m_k`` are ``z_k`` whatever ``w``: the gradient of eq. 11
    is 0 and eq. 12 returns ``w``. Without the multipliers member 0 (always right) would gain."""
    z, w = torch.stack([RIGHT, WRONG]), torch.tensor([0.5, 0.5])
    one_hot = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    assert torch.equal(weight_step(w, z, LABELS, 0.1, one_hot), w)
    assert torch.allclose(weight_step(w, z, LABELS, 0.1), torch.tensor([0.6, 0.4]))


def test_weight_step_follows_the_multiplied_weights() -> None:
    """Member 0 always says class 0, member 1 always class 1, on one sample of each: eq. 11's
    loss is symmetric in the share ``r = w_0 m_0 / (w_0 m_0 + w_1 m_1)`` of member 0 and least
    at ``r = 1/2``. Multipliers (1, 3) give ``r = 1/4``, so eq. 12 raises ``w_0``; (3, 1) the
    opposite."""
    z = torch.zeros(2, 2, 3)
    z[0, :, 0], z[1, :, 1] = 5.0, 5.0
    w = torch.tensor([0.5, 0.5])
    low = torch.tensor([[1.0, 1.0], [3.0, 3.0]])
    assert torch.allclose(weight_step(w, z, LABELS, 0.1, low), torch.tensor([0.6, 0.4]))
    assert torch.allclose(weight_step(w, z, LABELS, 0.1, low.flip(0)), torch.tensor([0.4, 0.6]))


def test_fedgo_multipliers_keep_the_discriminators_dtype() -> None:
    """The data sizes are cast to the discriminator logits' dtype and device before the log,
    whatever their own (counts arrive as int64 or float64)."""
    z = torch.randn(3, 4)
    for sizes in (
        torch.tensor([10, 30, 60]),
        torch.tensor([10.0, 30.0, 60.0], dtype=torch.float64),
    ):
        out = fedgo_multipliers(z, sizes)
        assert out.dtype == torch.float32
        assert torch.allclose(out.sum(0), torch.ones(4))


def test_weighted_logits_keep_the_logits_dtype_and_name_the_shapes() -> None:
    """Weights of another dtype (float64 data sizes or multipliers) are cast to the logits'
    dtype, for one weight per member and per sample alike: the ensemble stays float32. A
    per-sample weight of the wrong shape is named against the ``(n, N)`` it must have."""
    z = torch.randn(2, 4, 3)
    for w in (torch.tensor([1.0, 3.0], dtype=torch.float64), torch.rand(2, 4, dtype=torch.float64)):
        out = weighted_logits(z, w)
        assert out.dtype == torch.float32
        assert torch.allclose(out, weighted_logits(z, w.float()))
    message = "per-sample weights must be (n, N) = (2, 4), got (2, 3)"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        weighted_logits(z, torch.ones(2, 3))


# -- diversification (eq. 10) ----------------------------------------------------------------


def draw(seed: int, shape: tuple[int, int]) -> torch.Tensor:
    """``u ~ U[-1, 1]^C`` per sample, as :func:`diversify` draws it from a seeded generator."""
    g = torch.Generator()
    g.manual_seed(seed)
    return torch.rand(shape, generator=g) * 2 - 1


def test_diversify_paper_step_is_unit_direction_for_any_gradient_size() -> None:
    """Eq. 10 normalises the gradient: the step has L2 norm ``eps`` whether the gradient is
    tiny (here norms well below 1) or not, and ``eps = 1`` is a step like any other."""
    torch.manual_seed(3)
    w = torch.randn(3, 64) * 1e-3
    x = torch.randn(4, 1, 8, 8)
    g = draw(7, (4, 3)) @ w  # grad_x u^T W x
    assert float(g.norm(dim=1).max()) < 0.1
    for eps in (0.05, 1.0):
        gen = torch.Generator()
        gen.manual_seed(7)
        delta = (diversify(x, Linear(w), eps, gen) - x).flatten(1)
        assert torch.allclose(delta, eps * g / g.norm(dim=1, keepdim=True), atol=1e-6)


def test_diversify_code_step_is_the_sign_of_the_softmax_gradient_at_temperature_four() -> None:
    """The authors' variant: ``sign(grad_x u^T softmax(W x / T))``, ``T = 4`` by default. By the
    softmax Jacobian ``grad_z u^T p = p * (u - u^T p) / T`` and ``grad_x = W^T`` of it (compared
    where that gradient is clearly away from 0, so float rounding cannot flip a sign)."""
    torch.manual_seed(4)
    w = torch.randn(3, 64)
    x = torch.randn(16, 1, 8, 8)
    u = draw(11, (16, 3))

    def gradient(temperature: float) -> torch.Tensor:
        p = F.softmax(x.flatten(1) @ w.t() / temperature, dim=1)
        return (p * (u - (u * p).sum(1, keepdim=True)) / temperature) @ w

    def step(**kwargs: float) -> torch.Tensor:
        gen = torch.Generator()
        gen.manual_seed(11)
        return ((diversify(x, Linear(w), 0.1, gen, variant="code", **kwargs) - x) / 0.1).flatten(1)

    for temperature in (1.0, 4.0):
        g = gradient(temperature)
        clear = g.abs() > 1e-3 * g.abs().amax(1, keepdim=True)
        assert clear.float().mean() > 0.5
        assert torch.allclose(step(temperature=temperature)[clear], g.sign()[clear], atol=1e-5)
    default = step()
    assert torch.equal(default, step(temperature=4.0))
    for other in (3.0, 5.0):  # on this batch the temperature changes some signs
        assert (default != step(temperature=other)).sum() >= 5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        diversify(x, Linear(w), 0.1, torch.Generator(), variant="code")


# -- synthesis (Alg. 1 lines 5-9) ------------------------------------------------------------

SHAPE = (1, 4, 4)


class Recording(Linear):
    """A linear client model that keeps every input it is called with."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__(weight)
        self.inputs: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.inputs.append(x.detach().clone())
        return super().forward(x)


class LatentRecorder(nn.Module):
    """A generator ``sigmoid(W z)`` that keeps every latent batch it is called with."""

    def __init__(self, nz: int) -> None:
        super().__init__()
        self.project = nn.Linear(nz, math.prod(SHAPE))
        self.codes: list[torch.Tensor] = []

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        self.codes.append(z.detach().clone())
        return torch.sigmoid(self.project(z)).view(-1, *SHAPE)


def seeded(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def synth_on(models, student, settings, seed: int = 0, **kw):
    """``synthesize`` on CPU over 3 classes of ``SHAPE`` images, the members weighted equally."""
    return synthesize(
        models,
        torch.ones(len(models)),
        student,
        settings,
        num_classes=3,
        image_shape=SHAPE,
        rng=seeded(seed),
        device=torch.device("cpu"),
        **kw,
    )


def run(settings: SynthesisSettings, client: nn.Module | None = None, seed: int = 0, **kw):
    torch.manual_seed(1)
    client = client or Linear(torch.randn(3, math.prod(SHAPE)))
    return synth_on([client], Linear(torch.randn(3, math.prod(SHAPE))), settings, seed, **kw)


def pixels(**kw) -> SynthesisSettings:
    return SynthesisSettings(**{"source": "pixels", "batch_size": 6, "steps": 2, **kw})


def test_pixel_synthesis_takes_adams_first_step_of_size_lr() -> None:
    """Adam's first step moves every parameter by ``lr * g / (|g| + 1e-8)``: each pixel logit by
    ``lr`` (F-ADI optimises the logits behind ``sigmoid``; the models see ``2 sigmoid - 1``)."""
    for lr in (0.01, 0.2):
        client = Recording(torch.randn(3, math.prod(SHAPE)))
        run(pixels(lr=lr, adv_weight=0.0), client)
        first, second = (torch.logit((x + 1) / 2, eps=0) for x in client.inputs)
        assert torch.allclose((second - first).abs(), torch.full_like(first, lr), atol=1e-3)


def test_synthesis_settings_reach_the_optimiser() -> None:
    """``beta1`` shapes Adam's later steps (the first is ``lr * sign`` for any ``beta1``)."""
    kept = []
    for beta1 in (0.0, 0.5):
        torch.manual_seed(0)  # the same client for both
        client = Recording(torch.randn(3, math.prod(SHAPE)))
        run(pixels(steps=3, lr=0.1, beta1=beta1, adv_weight=0.0), client)
        kept.append(client.inputs[-1])
    assert not torch.allclose(kept[0], kept[1], atol=1e-4)


def test_synthesis_draws_from_its_rng_alone() -> None:
    """Labels and starting pixels come from ``rng``: the global seed changes nothing, and the
    labels are uniform over all classes (0 included)."""
    out = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        client = Recording(torch.randn(3, math.prod(SHAPE)))
        student = Linear(torch.randn(3, math.prod(SHAPE)))
        res = synth_on([client], student, pixels(batch_size=60, steps=1), seed=5)
        out.append((res, client.inputs[0]))
    assert torch.equal(out[0][0].labels, out[1][0].labels)
    assert torch.equal(out[0][1], out[1][1])
    assert set(out[0][0].labels.tolist()) == {0, 1, 2}


def test_latent_codes_train_only_with_optimise_z() -> None:
    """``optimise_z`` adds the latent codes to Adam's parameters (the authors' code) or keeps
    them fixed while only the generator trains."""
    for optimise_z in (True, False):
        torch.manual_seed(0)
        gen = LatentRecorder(nz=5)
        run(pixels(source="generator", reset=False, optimise_z=optimise_z), generator=gen, nz=5)
        first, second = gen.codes
        assert first.shape == (6, 5)
        assert torch.equal(first, second) != optimise_z


def test_generator_gradient_is_clipped_to_grad_clip() -> None:
    """After the last step the generator keeps that step's gradient, clipped to norm
    ``grad_clip`` (0: not clipped)."""
    norms = {}
    for clip in (0.0, 1e-3):
        torch.manual_seed(0)
        gen = LatentRecorder(nz=5)
        run(pixels(source="generator", reset=False, grad_clip=clip), generator=gen, nz=5)
        norms[clip] = float(torch.stack([p.grad.norm() for p in gen.parameters()]).norm())
    assert norms[0.0] > 1e-2 and norms[1e-3] == pytest.approx(1e-3, rel=1e-4)


def test_synthesis_default_latent_size_and_its_errors() -> None:
    """``nz`` defaults to the generator's 256; a generator source without a generator and an
    unknown source are refused."""
    res = run(pixels(source="generator", steps=1), generator=Generator(SHAPE, ngf=4))
    assert res.images.shape == (6, *SHAPE)
    with pytest.raises(ValueError, match="^source 'generator' needs a generator$"):
        run(pixels(source="generator"))
    with pytest.raises(ValueError, match="^unknown synthesis source 'noise'; choose one of"):
        run(pixels(source="noise"))


class NaNModel(Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * float("nan")


def test_synthesis_refuses_no_steps_and_a_loss_that_is_never_finite() -> None:
    """``steps = 0`` would keep no iterate; NaN logits on every step leave no best one (NaN
    never compares below the running best), and the error says where to look."""
    with pytest.raises(ValueError, match=r"^synthesis needs steps >= 1, got 0$"):
        run(pixels(steps=0))
    message = (
        "synthesis: the loss was not finite in any of its 2 steps (last: nan); the ensemble's "
        "logits on the synthetic batch are not finite numbers (a client model that produces "
        "them should have been left out: fedgo_flwr.learning.distill.teacher_logits_problem)"
    )
    with pytest.raises(FloatingPointError, match=f"^{re.escape(message)}$"):
        run(pixels(), NaNModel(torch.randn(3, math.prod(SHAPE))))


def test_synthesis_without_terms_keeps_the_first_batch_at_loss_zero() -> None:
    """Every term weighted 0: the loss is 0 (the images' sum times 0, so that backward still
    runs), Adam's steps are 0 and the first batch is the one kept."""
    zero = {f"{t}_weight": 0.0 for t in ("ce", "adv", "bn", "tv", "l2")}
    client = Recording(torch.randn(3, math.prod(SHAPE)))
    res = run(pixels(steps=3, **zero), client)
    assert res.terms == {} and res.best_loss == 0.0 and res.last_loss == 0.0
    assert len(client.inputs) == 3
    for seen in client.inputs:
        assert torch.equal(seen, client.inputs[0])
    assert torch.equal(to_model_input(res.images), client.inputs[0])


class Constant(nn.Module):
    """A generator of constant images ``1/2 + a`` with ``a`` rounded to a multiple of 1/4 (its
    gradient passes the rounding as if it were not there): one parameter, the codes unread."""

    def __init__(self, a: float) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.tensor(a))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        rounded = self.a + (torch.round(self.a * 4) / 4 - self.a).detach()
        return (0.5 + rounded).expand(len(z), *SHAPE)


def test_synthesis_keeps_the_earlier_of_two_iterates_of_equal_loss() -> None:
    """The L2 prior alone on constant model inputs ``2a``: Adam's first step (``lr = 1/2``)
    takes ``a`` from 1/4 to -1/4, the inputs from 1/2 to -1/2, at the same loss 1/4. A later
    iterate replaces the kept one only when its loss is lower."""
    zero = {f"{t}_weight": 0.0 for t in ("ce", "adv", "bn", "tv")}
    settings = SynthesisSettings(
        source="generator", batch_size=2, steps=2, lr=0.5, reset=False, grad_clip=0.0, **zero
    )
    settings.l2_weight = 1.0
    members = [Linear(torch.zeros(3, math.prod(SHAPE)))]
    res = synth_on(
        members, Linear(torch.zeros(3, math.prod(SHAPE))), settings, generator=Constant(0.25), nz=4
    )
    assert res.best_loss == 0.25 and res.last_loss == 0.25
    assert torch.equal(res.images, torch.full((2, *SHAPE), 0.75))


def test_synthesis_terms_are_the_weighted_losses_of_the_kept_images() -> None:
    """Every kept term is its weight times its loss on the kept images, recomputed here from
    the returned batch: ``L_H`` (eq. 6, exponent ``hardness``), ``L_A`` (eq. 7 at
    ``adv_temperature``, DENSE's mask), the batch-norm gap (one channel: ``|mean - 0.3| +
    |var - 2|``) and the image priors; the best loss is their sum."""
    torch.manual_seed(1)
    bn = nn.BatchNorm2d(1)
    bn.running_mean.fill_(0.3)
    bn.running_var.fill_(2.0)
    weight = torch.randn(3, math.prod(SHAPE))
    client = nn.Sequential(bn, Linear(weight))
    student = Linear(weight / 2**0.5 + torch.randn(3, math.prod(SHAPE)))  # agrees, in part
    settings = pixels(
        ce_weight=2.0,
        hardness=2.0,
        adv_weight=0.5,
        adv_temperature=3.0,
        adv_mask=True,
        bn_weight=0.7,
        tv_weight=0.1,
        l2_weight=0.01,
        lr=0.1,
    )
    res = synth_on([client], student, settings)
    x = to_model_input(res.images)
    with torch.no_grad():
        teacher, s_out = client.eval()(x), student(x)
    tv, l2 = image_prior_losses(x)
    expected = {
        "ce": 2.0 * hard_cross_entropy(teacher, res.labels, 2.0),
        "adv": 0.5 * adversarial_kl(s_out, teacher, 3.0, mask=True),
        "bn": 0.7 * ((x.mean() - 0.3).abs() + (x.var(unbiased=False) - 2.0).abs()),
        "tv": 0.1 * tv,
        "l2": 0.01 * l2,
    }
    assert set(res.terms) == set(expected)
    for k, v in expected.items():
        assert res.terms[k] == pytest.approx(float(v), rel=1e-4, abs=1e-7), k
    assert res.best_loss == pytest.approx(sum(res.terms.values()), rel=1e-5)
    # The settings above matter on this batch: unmasked or at T = 1 the term differs.
    for kw in ({"temperature": 3.0}, {"temperature": 1.0, "mask": True}):
        assert float(adversarial_kl(s_out, teacher, **kw)) != pytest.approx(
            float(expected["adv"]) / 0.5, rel=1e-3
        )


def test_synthesis_applies_sample_weights_and_teacher_norm() -> None:
    """Per-sample multipliers that keep member 0 alone, and ``std`` normalisation of a member
    that is member 0 times 3 (both rescaled to the lower scale), each give the synthesis of
    member 0 by itself."""
    torch.manual_seed(1)
    a = Linear(torch.randn(3, math.prod(SHAPE)))
    b = Linear(torch.randn(3, math.prod(SHAPE)))
    triple = Linear(a.weight.detach() * 3)
    settings = pixels(steps=3, lr=0.1)

    def synth(models: list[nn.Module], **kw) -> object:
        torch.manual_seed(2)
        student = Linear(torch.randn(3, math.prod(SHAPE)))
        return synth_on(models, student, settings, **kw)

    alone = synth([a])
    only_a = synth([a, b], sample_weights=lambda x: torch.tensor([[1.0], [0.0]]).expand(2, len(x)))
    normed = synth([a, triple], teacher_norm="std")
    for res in (only_a, normed):
        assert res.best_loss == pytest.approx(alone.best_loss, rel=1e-5)
        assert torch.allclose(res.images, alone.images, atol=1e-5)
    assert synth([a, triple]).best_loss != pytest.approx(alone.best_loss, rel=1e-3)
