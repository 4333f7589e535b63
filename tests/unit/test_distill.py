"""The distillation engine: teacher views, pseudo-labels, both protocols, determinism."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedgo_flwr.config.schema import ConfigError, build_section
from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.learning.distill import (
    DistillConfig,
    TeacherBank,
    _batch,
    distill,
)
from fedgo_flwr.models.classifiers import build_model
from fedgo_flwr.weighting import WeightingInputs, compute_weights, pseudo_labels

CPU = torch.device("cpu")


def images(n: int = 48, seed: int = 0, flip: bool = True) -> ArrayDataset:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, 1, 8, 8), dtype=np.uint8)
    return ArrayDataset(
        x=x, y=rng.integers(0, 10, size=n).astype(np.int64), num_classes=10, flip=flip
    )


def cnn(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return build_model("cnn", (1, 8, 8), 10)


def test_once_per_round_targets_equal_recomputing_teachers_on_the_augmented_batch():
    data = images()
    teachers = [cnn(s) for s in range(3)]
    bank = TeacherBank(data, augment=True, batch_size=16)
    for t in teachers:
        bank.add(t, CPU)
    logits = bank.logits
    assert logits.shape == (3, 2, len(data), 10)
    weights = torch.stack(
        [
            compute_weights(
                "entropy", WeightingInputs(logits=logits[:, v], num_examples=torch.ones(3))
            )
            for v in range(2)
        ],
        dim=1,
    )
    targets = pseudo_labels(logits, weights)
    torch.testing.assert_close(targets.sum(-1), torch.ones(2, len(data)))

    idx = torch.tensor([0, 5, 7, 11])
    flip = torch.tensor([True, False, True, False])
    x, t = _batch(data, targets, idx, flip, CPU)
    with torch.no_grad():
        direct = torch.stack([m.eval()(x) for m in teachers])  # (K, B, C) on the augmented x
    w = compute_weights("entropy", WeightingInputs(logits=direct, num_examples=torch.ones(3)))
    expected = F.softmax((w.unsqueeze(-1) * direct).sum(0), dim=-1)
    torch.testing.assert_close(t, expected, rtol=1e-5, atol=1e-6)


def test_no_flip_view_for_non_flippable_data():
    bank = TeacherBank(images(flip=False), augment=True)
    bank.add(cnn(0), CPU)
    assert bank.logits.shape[1] == 1


def test_one_hot_weights_reproduce_that_teachers_softmax():
    logits = torch.randn(3, 1, 5, 4)
    weights = torch.zeros(3, 1, 5)
    weights[1] = 1.0
    torch.testing.assert_close(pseudo_labels(logits, weights), logits[1].softmax(-1))
    with pytest.raises(ValueError):
        pseudo_labels(logits, torch.ones(3, 5))


def test_cosine_decay_across_rounds():
    s = DistillConfig(lr=1e-3, decay_rounds=100)
    assert s.round_lr(1) == pytest.approx(1e-3)
    assert s.round_lr(51) == pytest.approx(5e-4)
    assert s.round_lr(101) == pytest.approx(0.0, abs=1e-12)
    assert s.round_lr(500) == pytest.approx(0.0, abs=1e-12)
    assert DistillConfig(lr=1e-3, lr_decay=False).round_lr(80) == 1e-3


def test_defaults_pass_their_check():
    assert build_section(DistillConfig, {}, "strategy.distill.") == DistillConfig()
    built = build_section(DistillConfig, {"lr": 1, "protocol": "feddf"}, "strategy.distill.")
    assert built.lr == 1.0 and isinstance(built.lr, float) and built.protocol == "feddf"


@pytest.mark.parametrize(
    ("key", "value", "problem"),
    [
        ("protocol", "magic", "unknown; choose one of fedgo, feddf"),
        ("epochs", 0, "must be >= 1"),
        ("batch_size", 0, "must be >= 1"),
        ("decay_rounds", 0, "must be >= 1"),
        ("max_steps", 0, "must be >= 1"),
        ("eval_every", 0, "must be >= 1"),
        ("lr", 0, "must be > 0"),
        ("temperature", -1, "must be > 0"),
        ("grad_clip", 0, "must be > 0"),
        ("patience", 0, "must be >= 1"),
        ("bn_stats", "freeze", "unknown; choose one of auto, update, batch, eval"),
    ],
)
def test_a_bad_value_names_its_own_key(key, value, problem):
    with pytest.raises(ConfigError) as err:
        build_section(DistillConfig, {key: value}, "strategy.distill.")
    assert err.value.key == f"strategy.distill.{key}"
    assert err.value.problem == problem
    assert str(err.value) == f"strategy.distill.{key} = {err.value.value!r}: {problem}"


def test_the_error_message_names_key_and_value():
    with pytest.raises(ConfigError, match=r"^strategy\.distill\.lr = 0\.0: must be > 0$"):
        build_section(DistillConfig, {"lr": 0}, "strategy.distill.")


def agreement(a: nn.Module, b: nn.Module, data: ArrayDataset) -> float:
    x, _ = data.to_tensors()
    with torch.no_grad():
        return (a.eval()(x).argmax(1) == b.eval()(x).argmax(1)).float().mean().item()


def test_fedgo_protocol_student_learns_the_teacher():
    data = images(n=128)
    teacher, student = cnn(1), cnn(2)
    bank = TeacherBank(data, augment=True)
    bank.add(teacher, CPU)
    targets = pseudo_labels(bank.logits, torch.ones(1, 2, len(data)))
    before = agreement(student, teacher, data)
    settings = DistillConfig(epochs=30, batch_size=32, lr=3e-3, lr_decay=False)
    res = distill(
        student,
        data,
        targets,
        settings,
        server_round=1,
        rng=torch.Generator().manual_seed(0),
        device=CPU,
    )
    assert res.steps == 30 * 4
    assert agreement(student, teacher, data) > max(0.9, before + 0.3)


def test_distillation_is_deterministic():
    data = images()
    bank = TeacherBank(data, augment=True)
    bank.add(cnn(1), CPU)
    targets = pseudo_labels(bank.logits, torch.ones(1, 2, len(data)))
    outs = []
    for _ in range(2):
        student = cnn(2)
        distill(
            student,
            data,
            targets,
            DistillConfig(epochs=2, batch_size=16),
            server_round=3,
            rng=torch.Generator().manual_seed(5),
            device=CPU,
        )
        outs.append(torch.cat([p.flatten() for p in student.parameters()]))
    assert torch.equal(outs[0], outs[1])


def test_feddf_protocol_keeps_the_best_student_and_stops_early():
    data = images()
    bank = TeacherBank(data, augment=False)
    bank.add(cnn(1), CPU)
    targets = pseudo_labels(bank.logits, torch.ones(1, 1, len(data)))
    student = cnn(2)
    initial = {k: v.clone() for k, v in student.state_dict().items()}
    calls = []

    def validate(model: nn.Module) -> float:  # the initial student is the best one
        calls.append(1)
        return 1.0 if len(calls) == 1 else 0.5

    settings = DistillConfig(
        protocol="feddf", max_steps=1000, eval_every=10, patience=30, batch_size=16
    )
    res = distill(
        student,
        data,
        targets,
        settings,
        server_round=1,
        rng=torch.Generator().manual_seed(0),
        device=CPU,
        validate=validate,
    )
    assert res.steps == 30 and res.best_step == 0 and res.best_val_accuracy == 1.0
    for k, v in student.state_dict().items():
        torch.testing.assert_close(v, initial[k])
    with pytest.raises(ValueError, match="validation"):
        distill(cnn(2), data, targets, settings, server_round=1, rng=torch.Generator(), device=CPU)
    assert math.isfinite(res.loss)


def distil_bn_student(bn_stats: str, generated: bool, protocol: str) -> dict[str, torch.Tensor]:
    data = images(n=64)
    bank = TeacherBank(data, augment=False)
    bank.add(cnn(1), CPU)
    targets = pseudo_labels(bank.logits, torch.ones(1, 1, len(data)))
    torch.manual_seed(2)
    student = build_model("cnn_bn", (1, 8, 8), 10)
    calls = itertools.count()
    settings = DistillConfig(
        protocol=protocol, epochs=2, batch_size=16, max_steps=8, eval_every=4, bn_stats=bn_stats
    )
    distill(
        student,
        data,
        targets,
        settings,
        server_round=1,
        rng=torch.Generator().manual_seed(0),
        device=CPU,
        validate=lambda _: float(next(calls)),  # rising: the feddf protocol keeps the last
        generated=generated,
    )
    return {k: v.clone() for k, v in student.state_dict().items()}


@pytest.mark.parametrize("protocol", ["fedgo", "feddf"])
def test_batchnorm_statistics_by_mode(protocol):
    torch.manual_seed(2)
    start = build_model("cnn_bn", (1, 8, 8), 10).state_dict()
    stats = [k for k in start if "running" in k or "num_batches" in k]
    weights = [k for k in start if k not in stats]
    assert stats
    update = distil_bn_student("update", True, protocol)
    batch = distil_bn_student("batch", False, protocol)
    eval_ = distil_bn_student("eval", False, protocol)
    assert all(not torch.equal(start[k], update[k]) for k in stats if "running" in k)
    # batch: the weights learn exactly as in train mode, the statistics are put back
    assert all(torch.equal(update[k], batch[k]) for k in weights)
    assert all(torch.equal(start[k], batch[k]) for k in stats)
    # eval: the statistics normalise and stay; the weights learn, differently
    assert all(torch.equal(start[k], eval_[k]) for k in stats if "running" in k)
    assert any(not torch.equal(start[k], eval_[k]) for k in weights)
    assert any(not torch.equal(update[k], eval_[k]) for k in weights)
    # auto: batch on generated data, update on real data
    auto_generated = distil_bn_student("auto", True, protocol)
    auto_real = distil_bn_student("auto", False, protocol)
    assert all(torch.equal(batch[k], auto_generated[k]) for k in start)
    assert all(torch.equal(update[k], auto_real[k]) for k in start)
