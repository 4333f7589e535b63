"""Hand computations that pin server-side distillation (FedDF's AVGLOGITS step, FedGO's Alg. 1
distillation) closer than tests/unit/test_distill.py does: each test here fails under a change
of one operator, constant or argument of fedgo_flwr/learning/distill.py (docs/mutation.md).

The student is the closed-form ``Linear`` model, so the gradient of the KL loss is known:
``d KL(t || softmax(z / T)) / dz = (softmax(z / T) - t) / T`` per sample, divided by the batch
(``batchmean``), and Adam's first step moves every weight by ``lr * g / (|g| + 1e-8)``.
"""

from __future__ import annotations

import math
import re
import time
import warnings

import numpy as np
import pytest
import torch
from helpers import Linear
from torch import nn

from fedgo_flwr.config.schema import ConfigError, build_section
from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.learning.distill import (
    MAX_TEACHER_LOGIT,
    DistillConfig,
    TeacherBank,
    _batch,
    _kl,
    bound_teachers,
    distill,
    iter_view_batches,
    normalise_teachers,
    num_views,
    predict_views,
    teacher_logits_problem,
    teacher_scale_outliers,
    teacher_scales,
    train_mode,
    view_batches,
)
from fedgo_flwr.runtime import profiling

CPU = torch.device("cpu")

X = torch.tensor([[1.0, -2.0], [0.5, 1.0], [-1.5, 0.25], [2.0, 1.0], [-0.5, -1.0], [1.0, 3.0]])
"""Six feature vectors (D = 2)."""
W0 = torch.tensor([[0.3, -0.2], [-0.1, 0.4], [0.2, 0.1]])
"""The student's starting weights (C = 3 classes)."""
T = torch.tensor(
    [[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.2, 0.5, 0.3], [0.6, 0.3, 0.1], [0.3, 0.3, 0.4],
     [0.1, 0.1, 0.8]]
)  # fmt: skip
"""The teachers' pseudo-labels of the six samples."""


def features(n: int = 6) -> ArrayDataset:
    return ArrayDataset(x=X[:n].numpy(), y=np.zeros(n, dtype=np.int64), num_classes=3)


def kl(t: list[float], z: list[float], temperature: float = 1.0) -> float:
    """``KL(t || softmax(z / T))`` of one sample, by hand."""
    e = [math.exp(v / temperature) for v in z]
    p = [v / sum(e) for v in e]
    return sum(ti * math.log(ti / pi) for ti, pi in zip(t, p, strict=True))


def mean_kl_of_one_draw(data, targets, weight) -> float:
    """The mean KL of one pass over the 6 samples in the order, and with the flips, that a
    generator seeded 1 draws (``randperm`` then ``rand < 0.5``, as the distillation draws
    them), for the linear student ``weight``; the target of a flipped sample is its second
    view's."""
    rng = torch.Generator().manual_seed(1)
    order = torch.randperm(6, generator=rng).tolist()
    flips = (torch.rand(6, generator=rng) < 0.5).tolist()  # of the j-th sample drawn
    assert 0 < sum(flips) < 6
    x, _ = data.to_tensors()
    total = 0.0
    for i, flip in zip(order, flips, strict=True):
        xi = x[i].flip(-1) if flip else x[i]
        total += kl(targets[int(flip), i].tolist(), (weight @ xi.flatten()).tolist())
    return total / 6


def sample_kl(i: int, weight: torch.Tensor = W0, temperature: float = 1.0) -> float:
    return kl(T[i].tolist(), (weight @ X[i]).tolist(), temperature)


def grad_by_hand(n: int, temperature: float) -> torch.Tensor:
    """``d/dW`` of the batch-mean KL of the first ``n`` samples at ``W0``."""
    g = torch.zeros_like(W0)
    for i in range(n):
        p = torch.softmax(W0 @ X[i] / temperature, dim=0)
        g += torch.outer((p - T[i]) / temperature, X[i]) / n
    return g


def run(
    config: DistillConfig,
    n: int = 6,
    seed: int = 0,
    server_round: int = 1,
    validate=None,
    student: nn.Module | None = None,
) -> tuple[nn.Module, object]:
    student = Linear(W0.clone()) if student is None else student
    res = distill(
        student,
        features(n),
        T[:n].unsqueeze(0),
        config,
        server_round=server_round,
        rng=torch.Generator().manual_seed(seed),
        device=CPU,
        validate=validate,
    )
    return student, res


def rising():
    """A ``validate`` whose every answer is better than the last (the last student is kept)."""
    calls = iter(range(1_000_000))
    return lambda _model: float(next(calls))


# -- teacher checks --------------------------------------------------------------------------


def test_teacher_logits_problem_names_the_set_and_the_bound() -> None:
    assert MAX_TEACHER_LOGIT == 1e6
    ok = torch.tensor([[1e6, -1e6, 0.0]], dtype=torch.float64)
    assert teacher_logits_problem(ok) is None
    assert teacher_logits_problem(torch.zeros(0, 3)) is None
    for bad in (math.nan, math.inf, -math.inf):
        assert (
            teacher_logits_problem(torch.tensor([[0.0, bad]]), "the test split")
            == "teacher logits on the test split are not finite"
        )
    assert teacher_logits_problem(torch.tensor([[math.nan]])) == (
        "teacher logits on the server's data are not finite"
    )
    big = torch.tensor([[0.0, -2.5e6, 1.0]], dtype=torch.float64)
    assert teacher_logits_problem(big, "x") == (
        "teacher logits on x exceed 1e+06 in magnitude (max |logit| 2.5e+06)"
    )
    just_over = torch.tensor([[1e6 + 1.0]], dtype=torch.float64)
    assert teacher_logits_problem(just_over) is not None


def scaled(*scales: float) -> torch.Tensor:
    """``(K, 2, 2)`` logits: teacher ``k`` has scale ``scales[k]`` (``s * [1, -1]`` on both
    samples, plus a per-sample constant that does not count)."""
    rows = torch.tensor([[1.0, -1.0], [-1.0, 1.0]])
    shift = torch.tensor([[3.0], [-7.0]])
    return torch.stack([s * rows + shift for s in scales]).double()


def test_teacher_scales_are_the_rms_of_the_centred_logits() -> None:
    # teacher 0: samples [1, 2, 3] and [0, 0, 6], centred [-1, 0, 1] and [-2, -2, 4]:
    # squares 2 + 24 over 6 logits; teacher 1 is a per-sample constant: scale 0
    logits = torch.tensor([[[1.0, 2.0, 3.0], [0.0, 0.0, 6.0]], [[5.0, 5.0, 5.0], [-1.0] * 3]])
    torch.testing.assert_close(teacher_scales(logits), torch.tensor([math.sqrt(26 / 6), 0.0]))
    # views count as samples: (K, V, N, C)
    torch.testing.assert_close(
        teacher_scales(logits[:, None].expand(2, 2, 2, 3)), torch.tensor([math.sqrt(26 / 6), 0.0])
    )
    torch.testing.assert_close(
        teacher_scales(scaled(1.0, 2.0)), torch.tensor([1.0, 2.0], dtype=torch.float64)
    )


def test_teacher_scale_outliers_exceed_factor_times_the_lower_median() -> None:
    logits = scaled(3.0, 1.0, 10.0, 2.0)  # lower median 2 (the mean of the middle two: 2.5)
    assert teacher_scale_outliers(logits, 4.0) == [(2, pytest.approx(10.0), pytest.approx(2.0))]
    assert teacher_scale_outliers(logits, 5.0) == []  # 10 is not above 5 * 2
    assert teacher_scale_outliers(logits, 1.2) == [
        (0, pytest.approx(3.0), pytest.approx(2.0)),
        (2, pytest.approx(10.0), pytest.approx(2.0)),
    ]
    assert teacher_scale_outliers(logits, None) == []
    assert teacher_scale_outliers(torch.zeros(0, 2, 3), 2.0) == []


def test_bound_teachers_scales_the_outliers_down_to_the_median() -> None:
    logits = scaled(3.0, 1.0, 10.0, 2.0)
    out, outliers = bound_teachers(logits, 4.0)
    assert [k for k, _, _ in outliers] == [2]
    torch.testing.assert_close(out[2], logits[2] * 0.2)  # scale 10 -> the lower median 2
    torch.testing.assert_close(out[[0, 1, 3]], logits[[0, 1, 3]])
    torch.testing.assert_close(logits, scaled(3.0, 1.0, 10.0, 2.0))  # the input is left alone
    same, none = bound_teachers(logits, 5.0)
    assert same is logits and none == []
    same, none = bound_teachers(logits, None)
    assert same is logits and none == []


def test_normalise_teachers_std_rescales_each_teacher_to_the_median_scale() -> None:
    logits = scaled(3.0, 1.0, 10.0, 2.0)  # torch's median of four: the lower middle value, 2
    assert normalise_teachers(logits) is logits
    assert normalise_teachers(logits, "none") is logits
    out = normalise_teachers(logits, "std")
    for k, s in enumerate((3.0, 1.0, 10.0, 2.0)):
        torch.testing.assert_close(out[k], logits[k] * (2.0 / s))
    torch.testing.assert_close(teacher_scales(out), torch.full((4,), 2.0, dtype=torch.float64))
    # a constant teacher (scale 0) is left as it is; (K, V, N, C) logits
    four = torch.stack([scaled(1.0, 0.0, 4.0)] * 2, dim=1).float()
    out = normalise_teachers(four, "std")
    assert out.dtype == torch.float32
    torch.testing.assert_close(out[0], four[0])
    torch.testing.assert_close(out[1], four[1])
    torch.testing.assert_close(out[2], four[2] / 4)
    with pytest.raises(
        ValueError, match=r"^unknown teacher_norm 'l2'; choose one of \('none', 'std'\)$"
    ):
        normalise_teachers(logits, "l2")


def test_normalise_teachers_std_rescales_scales_below_one() -> None:
    logits = scaled(0.1, 0.4, 0.2)
    out = normalise_teachers(logits, "std")
    for k, s in enumerate((0.1, 0.4, 0.2)):  # ``scaled`` rounds ``s`` to float32
        torch.testing.assert_close(out[k], logits[k] * (0.2 / s), rtol=1e-6, atol=0)


def test_normalise_teachers_detaches_the_scales() -> None:
    """The gradient of the rescaled logits is the factor itself: none flows through it."""
    logits = scaled(1.0, 4.0, 2.0).requires_grad_(True)
    normalise_teachers(logits, "std").sum().backward()
    factor = torch.tensor([2.0, 0.5, 1.0], dtype=torch.float64).view(3, 1, 1)
    torch.testing.assert_close(logits.grad, factor.expand(3, 2, 2))


# -- views, teachers, batches ----------------------------------------------------------------


def pictures(n: int = 5, flip: bool = True) -> ArrayDataset:
    x = np.arange(n * 4, dtype=np.uint8).reshape(n, 1, 2, 2) * 10
    return ArrayDataset(x=x, y=np.zeros(n, dtype=np.int64), num_classes=3, flip=flip)


def test_num_views_counts_the_flip_only_for_flippable_images() -> None:
    assert num_views(pictures(), augment=True) == 2
    assert num_views(pictures(), augment=False) == 1
    assert num_views(pictures(flip=False), augment=True) == 1
    vectors = ArrayDataset(x=X.numpy(), y=np.zeros(6, dtype=np.int64), num_classes=3, flip=True)
    assert num_views(vectors, augment=True) == 1


def test_view_batches_cover_every_sample_once_per_view_in_order() -> None:
    data = pictures(5)
    x, _ = data.to_tensors()
    got = list(iter_view_batches(data, 2, 2, CPU))
    assert [v for v, _ in got] == [0, 1, 0, 1, 0, 1]
    starts = [0, 0, 2, 2, 4, 4]
    for (v, batch), s in zip(got, starts, strict=True):
        expected = x[s : s + 2]
        torch.testing.assert_close(batch, expected.flip(-1) if v == 1 else expected)
    one = view_batches(data, 1, 3, CPU)
    assert [v for v, _ in one] == [0, 0]
    torch.testing.assert_close(torch.cat([b for _, b in one]), x)


class Doubled(nn.Module):
    """A float64 head with a dropout: its logits depend on the mode."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.drop(x.flatten(1)) @ self.weight.t()).double()


def test_predict_views_is_each_views_logits_in_eval_mode_as_float32() -> None:
    data = pictures(5)
    weight = torch.randn(3, 4)
    model = Doubled(weight).train()
    out = predict_views(model, data, 2, 2, CPU)
    assert out.dtype == torch.float32 and out.shape == (2, 5, 3)
    x, _ = data.to_tensors()
    torch.testing.assert_close(out[0], x.flatten(1) @ weight.t())
    torch.testing.assert_close(out[1], x.flip(-1).flatten(1) @ weight.t())


def test_teacher_bank_stacks_in_key_order_under_its_teacher_norm() -> None:
    data = pictures(3)
    weights = [
        torch.full((3, 4), float(k + 1)) * torch.tensor([[1.0], [0.0], [-1.0]]) for k in range(3)
    ]
    bank = TeacherBank(data, augment=True)
    assert bank.views == 2 and len(bank) == 0
    for k in (2, 0, 1):
        bank.add(Linear(weights[k]), CPU, key=k)
    assert len(bank) == 3
    x, _ = data.to_tensors()
    for k in range(3):
        torch.testing.assert_close(bank.logits[k, 0], x.flatten(1) @ weights[k].t())
        torch.testing.assert_close(bank.logits[k, 1], x.flip(-1).flatten(1) @ weights[k].t())
    # without keys: the order of addition; ``std`` rescales to the median teacher (k = 1)
    for norm in ("none", "std"):
        bank = TeacherBank(data, augment=False, teacher_norm=norm)
        for k in (2, 0, 1):
            bank.add_logits(predict_views(Linear(weights[k]), data, 1, 8, CPU))
        logits = bank.logits
        assert logits.shape == (3, 1, 3, 3)
        for i, k in enumerate((2, 0, 1)):
            ref = x.flatten(1) @ weights[k if norm == "none" else 1].t()
            torch.testing.assert_close(logits[i, 0], ref)


def test_batch_reads_the_view_of_each_sample() -> None:
    data = pictures(4)
    targets = torch.arange(2 * 4 * 3, dtype=torch.float32).view(2, 4, 3)
    x_all, _ = data.to_tensors()
    idx = torch.tensor([3, 1])
    x, t = _batch(data, targets, idx, None, CPU)
    torch.testing.assert_close(x, x_all[[3, 1]])
    torch.testing.assert_close(t, targets[0, [3, 1]])
    x, t = _batch(data, targets, idx, torch.tensor([True, False]), CPU)
    torch.testing.assert_close(x[0], x_all[3].flip(-1))
    torch.testing.assert_close(x[1], x_all[1])
    torch.testing.assert_close(t, torch.stack([targets[1, 3], targets[0, 1]]))


def test_train_mode_puts_only_batchnorm_in_eval_mode_for_eval() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2), nn.Dropout(0.1)).eval()
    assert train_mode(model) is model
    assert all(m.training for m in model.modules())
    for mode in ("update", "batch"):
        train_mode(model.eval(), mode)
        assert all(m.training for m in model.modules())
    train_mode(model.eval(), "eval")
    assert [m.training for m in model.modules()] == [True, True, False, True]


@pytest.mark.parametrize(
    ("key", "edge", "below"),
    [
        ("epochs", 1, 0),
        ("batch_size", 1, 0),
        ("decay_rounds", 1, 0),
        ("max_steps", 1, 0),
        ("eval_every", 1, 0),
        ("lr", 1e-9, 0.0),
        ("temperature", 1e-9, 0.0),
        ("grad_clip", 0.5, 0.0),
        ("patience", 1, 0),  # 0 took no step at all
    ],
)
def test_each_bound_accepts_its_edge_and_refuses_below(key, edge, below) -> None:
    assert getattr(build_section(DistillConfig, {key: edge}, "strategy.distill."), key) == edge
    with pytest.raises(ConfigError) as err:
        build_section(DistillConfig, {key: below}, "strategy.distill.")
    assert err.value.key == f"strategy.distill.{key}"


def test_bn_mode_auto_depends_on_the_data_and_a_named_mode_does_not() -> None:
    assert DistillConfig().bn_mode(generated=True) == "batch"
    assert DistillConfig().bn_mode(generated=False) == "update"
    for mode in ("update", "batch", "eval"):
        for generated in (True, False):
            assert DistillConfig(bn_stats=mode).bn_mode(generated) == mode


def test_round_lr_is_the_cosine_of_the_round_within_decay_rounds() -> None:
    c = DistillConfig(lr=0.02, decay_rounds=4)
    for r, t in ((0, 0), (1, 0), (2, 1), (3, 2), (5, 4), (9, 4)):
        assert c.round_lr(r) == pytest.approx(0.02 * 0.5 * (1 + math.cos(math.pi * t / 4)))
    assert c.round_lr(5) == 0.0


# -- the loss and the fedgo protocol ---------------------------------------------------------


def test_kl_is_the_batch_mean_of_kl_of_the_tempered_student() -> None:
    z = torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 0.5]])
    t = T[:2]
    for temperature in (1.0, 2.0, 0.5):
        expected = (
            kl(t[0].tolist(), [2.0, 0.0, -1.0], temperature)
            + kl(t[1].tolist(), [0.0, 1.0, 0.5], temperature)
        ) / 2
        assert float(_kl(z, t, temperature)) == pytest.approx(expected, rel=1e-6)


def test_kl_names_the_class_dimension() -> None:
    """An implicit softmax dimension is deprecated in torch and warns on every call."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _kl(torch.zeros(2, 3), torch.full((2, 3), 1 / 3), 1.0)


def test_fedgo_step_is_adams_first_step_at_the_round_lr() -> None:
    """One batch of the whole set: every weight moves by ``lr_t`` against the sign of the
    batch-mean KL gradient at temperature 2, ``lr_t`` the round's cosine-decayed lr."""
    config = DistillConfig(epochs=1, batch_size=8, lr=0.01, decay_rounds=4, temperature=2.0)
    student, res = run(config, n=3, server_round=2)
    g = grad_by_hand(3, 2.0)
    assert (g.abs() > 1e-4).all()
    lr = 0.01 * 0.5 * (1 + math.cos(math.pi / 4))
    torch.testing.assert_close(student.weight.detach(), W0 - lr * g / (g.abs() + 1e-8))
    assert res.steps == 1 and res.best_step is None and res.best_val_accuracy is None
    assert res.loss == pytest.approx(sum(sample_kl(i, temperature=2.0) for i in range(3)) / 3)


def test_fedgo_loss_is_the_sample_mean_over_the_last_epoch() -> None:
    """Batches of 4 and 2: the reported loss weighs each batch by its samples. At a round past
    ``decay_rounds`` the lr is 0 and the student stays as it was."""
    config = DistillConfig(epochs=2, batch_size=4, decay_rounds=3)
    student, res = run(config, server_round=4)
    assert res.steps == 4
    torch.testing.assert_close(student.weight.detach(), W0)
    assert res.loss == pytest.approx(sum(sample_kl(i) for i in range(6)) / 6)


def test_fedgo_drops_a_last_batch_of_one_and_draws_the_order_from_rng() -> None:
    """5 samples in batches of 2: two batches an epoch, the permutation's last sample left out."""
    profiling.enable()
    try:
        config = DistillConfig(epochs=3, batch_size=2, decay_rounds=1)
        _, res = run(config, n=5, seed=3, server_round=2)
        counts = profiling.counts()["distillation"]
    finally:
        profiling.disable()
    assert res.steps == 6
    assert counts.images == 12 and counts.batch == 2
    rng = torch.Generator().manual_seed(3)
    orders = [torch.randperm(5, generator=rng) for _ in range(3)]
    kept = orders[-1][:4].tolist()
    assert res.loss == pytest.approx(sum(sample_kl(i) for i in kept) / 4)


def test_fedgo_batches_of_one_sample_and_a_set_of_one() -> None:
    """Batches of 1 take every sample (none is a lone last batch); a set of one sample is one
    batch, whose loss is the epoch's."""
    config = DistillConfig(epochs=2, batch_size=1, decay_rounds=1)
    _, res = run(config, n=3, server_round=2)
    assert res.steps == 6
    assert res.loss == pytest.approx(sum(sample_kl(i) for i in range(3)) / 3)
    _, res = run(DistillConfig(epochs=1, batch_size=4, decay_rounds=1), n=1, server_round=2)
    assert res.steps == 1 and res.loss == pytest.approx(sample_kl(0))


@pytest.mark.parametrize("protocol", ["fedgo", "feddf"])
def test_the_result_reports_the_seconds_of_the_run(protocol) -> None:
    config = DistillConfig(protocol=protocol, epochs=1, max_steps=2, batch_size=4)
    start = time.perf_counter()
    _, res = run(config, validate=rising())
    assert 0 < res.seconds <= time.perf_counter() - start


def test_distill_keeps_real_data_batchnorm_statistics_by_default() -> None:
    """``generated`` defaults to false: ``bn_stats: auto`` then updates the running
    statistics (mode ``update``)."""
    student = ModeRecorder()
    before = student.bn.running_mean.clone()
    run(DistillConfig(epochs=1, batch_size=6), student=student)
    assert not torch.equal(student.bn.running_mean, before)


@pytest.mark.parametrize(
    ("config", "server_round"),
    [
        (DistillConfig(epochs=1, batch_size=6, decay_rounds=1), 2),
        (DistillConfig(protocol="feddf", lr=0.0, batch_size=8, max_steps=1), 1),
    ],
    ids=["fedgo", "feddf"],
)
def test_each_sample_is_flipped_with_probability_one_half_from_rng(config, server_round) -> None:
    """Two views: the ``j``-th sample of the permutation is flipped where the ``j``-th draw of
    ``rand`` (drawn after the permutation) is below 0.5, and read against its view-1 targets
    there; both protocols draw their batches so."""
    data = pictures(6)
    targets = torch.stack([T, T.flip(-1)])
    weight = torch.tensor([[0.5, -0.5, 0.25, 0.0], [0.0, 0.3, -0.2, 0.1], [-0.4, 0.0, 0.0, 0.6]])
    res = distill(
        Linear(weight.clone()),
        data,
        targets,
        config,
        server_round=server_round,
        rng=torch.Generator().manual_seed(1),
        device=CPU,
        validate=rising(),
    )
    assert res.loss == pytest.approx(mean_kl_of_one_draw(data, targets, weight))


def test_distill_refuses_targets_of_the_wrong_shape() -> None:
    shapes = {(1, 5, 3): T.unsqueeze(0)[:, :5], (6, 3): T, (1, 1, 6, 3): T.view(1, 1, 6, 3)}
    for shape, bad in shapes.items():
        message = f"targets must be (V, 6, C), got {shape}"
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            distill(
                Linear(W0.clone()),
                features(),
                bad,
                DistillConfig(),
                server_round=1,
                rng=torch.Generator(),
                device=CPU,
            )


class ModeRecorder(nn.Module):
    """A linear head behind a BatchNorm layer that records the modes of every forward pass."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(2)
        self.head = nn.Linear(2, 3)
        self.modes: list[tuple[bool, bool]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.modes.append((self.training, self.bn.training))
        return self.head(self.bn(x))


@pytest.mark.parametrize(
    ("bn_stats", "modes"),
    [("update", (True, True)), ("batch", (True, True)), ("eval", (True, False))],
)
def test_every_training_step_runs_in_train_mode_after_validation(bn_stats, modes) -> None:
    """``validate`` may leave the model in eval mode: training puts it back (with the
    BatchNorm layers in eval mode for ``bn_stats: eval``) before the next step."""

    def validate(model: nn.Module) -> float:
        model.eval()
        return 0.0

    for protocol in ("fedgo", "feddf"):
        student = ModeRecorder().eval()
        config = DistillConfig(
            protocol=protocol, epochs=2, batch_size=4, max_steps=4, eval_every=1, bn_stats=bn_stats
        )
        run(config, validate=validate, student=student)
        assert student.modes == [modes] * 4


# -- the feddf protocol ----------------------------------------------------------------------


def test_feddf_steps_follow_the_cosine_schedule_over_max_steps() -> None:
    """Two steps at a tiny lr on the whole set (the gradient barely changes): Adam moves each
    weight by ``lr`` and then by the schedule's ``lr * (1 + cos(pi / 2)) / 2``, whatever the
    round."""
    config = DistillConfig(protocol="feddf", lr=1e-4, batch_size=64, max_steps=2, grad_clip=100.0)
    student, res = run(config, server_round=50, validate=rising())
    g = grad_by_hand(6, 1.0)
    assert (g.abs() > 1e-3).all()
    moved = student.weight.detach() - W0
    torch.testing.assert_close(moved, -1.5e-4 * g.sign(), rtol=0, atol=2e-6)
    assert res.steps == 2 and res.best_step == 2 and res.best_val_accuracy == 1.0


def test_feddf_clips_the_gradient_norm_to_grad_clip() -> None:
    """``clip_grad_norm_`` scales the gradient by ``c / (||g|| + 1e-6)``; at ``c = 1e-10`` the
    clipped gradient is far below Adam's ``eps = 1e-8``, which then shortens the step."""
    config = DistillConfig(protocol="feddf", lr=0.01, batch_size=64, max_steps=1, grad_clip=1e-10)
    student, _ = run(config, validate=rising())
    g = grad_by_hand(6, 1.0)
    clipped = g * 1e-10 / (float(g.norm()) + 1e-6)
    expected = W0 - 0.01 * clipped / (clipped.abs() + 1e-8)
    torch.testing.assert_close(student.weight.detach(), expected)
    assert (student.weight.detach() - W0).abs().max() < 0.01 * 0.1


def test_feddf_keeps_the_best_student_and_stops_after_patience_steps_without_gain() -> None:
    """Evaluations every 2 steps: 0.5 at step 2, 0.6 at step 6 (the best: a tie at step 8 does
    not replace it), and 4 steps after it (``patience``) the run stops, at step 10."""
    scores = iter([0.1, 0.5, 0.4, 0.6, 0.6, 0.3, 0.9, 0.9])
    seen: list[torch.Tensor] = []

    def validate(model: nn.Module) -> float:
        seen.append(model.weight.detach().clone())
        return next(scores)

    config = DistillConfig(
        protocol="feddf", lr=0.01, batch_size=2, max_steps=20, eval_every=2, patience=4
    )
    student, res = run(config, validate=validate)
    assert res.steps == 10 and len(seen) == 6
    assert res.best_step == 6 and res.best_val_accuracy == 0.6
    torch.testing.assert_close(student.weight.detach(), seen[3])
    assert not torch.equal(seen[3], seen[5])


def test_feddf_evaluates_at_the_last_step() -> None:
    calls: list[float] = []

    def validate(model: nn.Module) -> float:
        calls.append(1.0)
        return float(len(calls))

    config = DistillConfig(protocol="feddf", batch_size=2, max_steps=7, eval_every=3, patience=3)
    student, res = run(config, validate=validate)
    assert res.steps == 7 and len(calls) == 4 and res.best_step == 7  # steps 3, 6 and 7
    assert not torch.equal(student.weight.detach(), W0)


def draws(seed: int, steps: int) -> list[int]:
    """The samples that steps of batch 1 on the 6 samples draw from ``seed``."""
    rng = torch.Generator().manual_seed(seed)
    return [int(torch.randperm(6, generator=rng)[0]) for _ in range(steps)]


def test_feddf_loss_is_the_mean_of_the_last_window_or_of_the_steps_since() -> None:
    """At lr 0 the student stays put and step ``s``'s loss is the KL of the sample it draws.
    Evaluations at steps 3 and 5 (the last step): the loss is the window of steps 4 and 5.
    Stopped by patience at step 5, after the evaluation at 3: the mean of the steps since, 4
    and 5. Two steps and no evaluation before the last: the mean of both."""
    never_better = lambda _model: 0.0  # noqa: E731
    drawn = draws(2, 5)
    assert drawn[0] != drawn[1] and drawn[3] != drawn[4]
    config = DistillConfig(protocol="feddf", lr=0.0, batch_size=1, max_steps=5, eval_every=3)
    _, res = run(config, seed=2, validate=never_better)
    assert res.steps == 5
    assert res.loss == pytest.approx((sample_kl(drawn[3]) + sample_kl(drawn[4])) / 2)
    config = DistillConfig(
        protocol="feddf", lr=0.0, batch_size=1, max_steps=100, eval_every=3, patience=5
    )
    _, res = run(config, seed=2, validate=never_better)
    assert res.steps == 5 and res.best_step == 0
    assert res.loss == pytest.approx((sample_kl(drawn[3]) + sample_kl(drawn[4])) / 2)
    config = DistillConfig(protocol="feddf", lr=0.0, batch_size=1, max_steps=2, eval_every=5)
    _, res = run(config, seed=2, validate=never_better)
    assert res.steps == 2
    assert res.loss == pytest.approx((sample_kl(drawn[0]) + sample_kl(drawn[1])) / 2)


def test_feddf_needs_a_validation_split() -> None:
    with pytest.raises(
        ValueError,
        match=r"^the feddf protocol needs a labelled validation split \(validate=\.\.\.\)$",
    ):
        run(DistillConfig(protocol="feddf"))


def test_a_bounded_teacher_counts_as_one_of_k() -> None:
    """Four honest teachers agree on the true class (logit 2 against 0); a fifth names the next
    class at 30 x their scale (inside a factor of 100, above one of 10). Scaled down to 10 x
    the median it still decides every sample; at the median it is one voice of five."""
    n, c = 20, 10
    labels = torch.arange(n) % c
    honest = torch.zeros(4, n, c)
    honest[:, torch.arange(n), labels] = 2.0
    wrong = torch.zeros(1, n, c)
    wrong[0, torch.arange(n), (labels + 1) % c] = 60.0
    logits = torch.cat([honest, wrong]).double()
    accuracy = {}
    for factor in (100.0, 10.0):
        out, _ = bound_teachers(logits, factor)
        accuracy[factor] = (out.mean(0).argmax(-1) == labels).double().mean().item()
    at_the_bound = logits.clone()
    at_the_bound[4] *= 10 / 30  # what scaling to the factor (not to the median) would leave
    steered = (at_the_bound.mean(0).argmax(-1) == labels).double().mean().item()
    assert accuracy == {100.0: 0.0, 10.0: 1.0} and steered == 0.0
