"""Tests for ``fedgo_flwr.models.classifiers``: shapes, gradients, seeding, validation, parameter
counts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from fedgo_flwr.config.names import MODEL_NAMES
from fedgo_flwr.models.classifiers import MLP, build_model, count_parameters

BATCH = 2
NUM_CLASSES = 10
IMAGE_SHAPES = [(1, 8, 8), (3, 32, 32)]
VECTOR_SHAPE = (2,)

# (name, input_shape) combinations exercised by the forward/backward test. resnet50 on
# (3, 32, 32) takes ~0.4 s for build + forward + backward at batch 2 on 2 CPU cores, so it
# is kept; resnet50 on (1, 8, 8) runs too.
CASES = [(name, shape) for name in MODEL_NAMES for shape in IMAGE_SHAPES] + [
    ("mlp", VECTOR_SHAPE),
    ("cnn", VECTOR_SHAPE),
]


def _ids(case: tuple[str, tuple[int, ...]]) -> str:
    name, shape = case
    return f"{name}-{'x'.join(map(str, shape))}"


@pytest.fixture(autouse=True)
def _restore_rng() -> Iterator[None]:
    """Keep the global torch RNG unaffected by these tests."""
    state = torch.random.get_rng_state()
    yield
    torch.random.set_rng_state(state)


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_forward_shape_and_finite_gradients(case: tuple[str, tuple[int, ...]]) -> None:
    name, shape = case
    torch.manual_seed(0)
    model = build_model(name, shape, NUM_CLASSES)
    x = torch.randn(BATCH, *shape)
    y = torch.randint(0, NUM_CLASSES, (BATCH,))

    model.eval()
    with torch.no_grad():
        assert model(x).shape == (BATCH, NUM_CLASSES)

    model.train()  # BatchNorm in train mode: fine with batch 2
    logits = model(x)
    assert logits.shape == (BATCH, NUM_CLASSES)
    assert torch.isfinite(logits).all()
    torch.nn.functional.cross_entropy(logits, y).backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, f"{name}: no gradient for {pname}"
        assert torch.isfinite(p.grad).all(), f"{name}: non-finite gradient for {pname}"


def test_cnn_on_vector_falls_back_to_mlp() -> None:
    torch.manual_seed(0)
    cnn = build_model("cnn", VECTOR_SHAPE, 3)
    torch.manual_seed(0)
    mlp = build_model("mlp", VECTOR_SHAPE, 3)
    assert isinstance(cnn, MLP)
    assert count_parameters(cnn) == count_parameters(mlp)
    for a, b in zip(cnn.state_dict().values(), mlp.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def _params(name: str, shape: tuple[int, ...], seed: int) -> list[torch.Tensor]:
    torch.manual_seed(seed)
    return [p.detach().clone() for p in build_model(name, shape, NUM_CLASSES).parameters()]


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_seeded_initialisation_is_deterministic(name: str) -> None:
    shape = (1, 8, 8)  # parameter values do not depend on H, W for the big models; keep it cheap
    first = _params(name, shape, seed=123)
    same = _params(name, shape, seed=123)
    other = _params(name, shape, seed=124)
    assert len(first) == len(same) == len(other)
    assert all(torch.equal(a, b) for a, b in zip(first, same, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))


def test_unknown_name_raises_and_lists_names() -> None:
    with pytest.raises(ValueError, match="no_such_net") as info:
        build_model("no_such_net", (3, 32, 32), NUM_CLASSES)
    for name in MODEL_NAMES:
        assert name in str(info.value)


@pytest.mark.parametrize("name", [n for n in MODEL_NAMES if n not in ("mlp", "cnn")])
@pytest.mark.parametrize("shape", [(2,), (8, 8), (1, 1, 8, 8)])
def test_incompatible_shape_raises(name: str, shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=name) as info:
        build_model(name, shape, NUM_CLASSES)
    assert str(shape) in str(info.value)


@pytest.mark.parametrize("shape", [(8, 8), (1, 1, 8, 8)])
def test_cnn_rejects_non_image_non_vector_shapes(shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="cnn"):
        build_model("cnn", shape, NUM_CLASSES)


@pytest.mark.parametrize(
    ("shape", "num_classes"), [((), 10), ((3, 0, 32), 10), ((3, 32, 32), 0), ((2,), 2.5)]
)
def test_invalid_arguments_raise(shape: tuple[int, ...], num_classes: int) -> None:
    with pytest.raises(ValueError):
        build_model("mlp", shape, num_classes)


def test_mlp_accepts_any_shape() -> None:
    model = build_model("mlp", (4, 5), 3)
    assert model(torch.randn(BATCH, 4, 5)).shape == (BATCH, 3)


@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 1, 5), (2, 3, 3)])
def test_tiny_images(shape: tuple[int, ...]) -> None:
    for name in ("cnn", "cnn_bn", "vgg11_bn", "resnet8", "resnet18", "gn_lenet", "cnn5", "lenet5"):
        model = build_model(name, shape, 4).eval()
        with torch.no_grad():
            assert model(torch.randn(BATCH, *shape)).shape == (BATCH, 4)


def test_cnn_default_is_small() -> None:
    assert count_parameters(build_model("cnn", (3, 32, 32), NUM_CLASSES)) < 300_000


def test_resnet18_parameter_count_matches_paper_variant() -> None:
    n = count_parameters(build_model("resnet18", (3, 32, 32), NUM_CLASSES))
    assert abs(n - 11_173_962) <= 0.01 * 11_173_962


def test_resnet8_is_feddf_size_with_batch_norm() -> None:
    # FedDF's CIFAR ResNet-8: 6n+2 with n = 1, widths 16/32/64, about 78k parameters.
    model = build_model("resnet8", (3, 32, 32), NUM_CLASSES)
    assert count_parameters(model) == 78_042
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert len(bns) == 9  # stem, 2 per block, and the two projection shortcuts


def test_cnn_bn_adds_batch_norm_to_the_small_cnn() -> None:
    plain = build_model("cnn", (3, 32, 32), NUM_CLASSES)
    bn = build_model("cnn_bn", (3, 32, 32), NUM_CLASSES)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in plain.modules())
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in bn.modules()) == 2
    # Convolution biases are dropped (BN has its own shift): 32 + 64 fewer, 2 x (32 + 64) more.
    assert count_parameters(bn) == count_parameters(plain) + 96
    # Batch statistics are buffers that FedAvg averages with the weights.
    assert any("running_mean" in k for k in bn.state_dict())


def test_count_parameters_trainable_only() -> None:
    model = build_model("mlp", (2,), 2)
    total = count_parameters(model)
    assert total == (2 * 64 + 64) + (64 * 64 + 64) + (64 * 2 + 2)
    model.net[1].weight.requires_grad_(False)
    assert count_parameters(model, trainable_only=True) == total - 2 * 64
    assert count_parameters(model) == total


def test_gn_lenet_matches_cpfl_size_and_layers() -> None:
    # CPFL's CIFAR-10 model (Hsieh et al. 2020 GN-LeNet): conv 3->32, 32->32, 32->64 (5x5),
    # GroupNorm with 2 groups, maps 15x15 -> 7x7 -> 3x3, Linear(576, 10): 85,354 parameters.
    model = build_model("gn_lenet", (3, 32, 32), NUM_CLASSES)
    assert count_parameters(model) == 85_354
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size) for c in convs] == [
        (3, 32, (5, 5)),
        (32, 32, (5, 5)),
        (32, 64, (5, 5)),
    ]
    norms = [m for m in model.modules() if isinstance(m, torch.nn.GroupNorm)]
    assert [(g.num_groups, g.num_channels) for g in norms] == [(2, 32), (2, 32), (2, 64)]
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    linear = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert [(x.in_features, x.out_features) for x in linear] == [(64 * 3 * 3, NUM_CLASSES)]


@pytest.mark.parametrize(
    ("shape", "num_classes"), [((3, 32, 32), 10), ((1, 28, 28), 62), ((1, 8, 8), 10)]
)
def test_gn_lenet_forward_returns_raw_logits(shape: tuple[int, ...], num_classes: int) -> None:
    torch.manual_seed(0)
    model = build_model("gn_lenet", shape, num_classes).eval()
    with torch.no_grad():
        out = model(torch.randn(3, *shape))
        single = model(torch.randn(1, *shape))  # GroupNorm: batch size 1 is fine
    assert out.shape == (3, num_classes)
    assert single.shape == (1, num_classes)
    # Raw logits, not log_softmax: the rows' exp does not sum to 1.
    assert not torch.allclose(out.exp().sum(dim=1), torch.ones(3), atol=1e-3)


def test_gn_lenet_is_deterministic_with_a_seed() -> None:
    x = torch.randn(4, 3, 32, 32)
    outs = []
    for seed in (7, 7, 8):
        torch.manual_seed(seed)
        model = build_model("gn_lenet", (3, 32, 32), NUM_CLASSES).eval()
        with torch.no_grad():
            outs.append(model(x))
    assert torch.equal(outs[0], outs[1])
    assert not torch.allclose(outs[0], outs[2])


def test_gn_lenet_rejects_vector_input_naming_the_model() -> None:
    with pytest.raises(ValueError, match="gn_lenet") as info:
        build_model("gn_lenet", (20,), NUM_CLASSES)
    assert "(20,)" in str(info.value)


# ---------------------------------------------------------------------------------------------
# Co-Boosting's models (Dai et al., ICLR 2024, Sec. 5 / App. B; the authors' registry.py)
# ---------------------------------------------------------------------------------------------


def _layers(model: torch.nn.Module, kind: type) -> list[torch.nn.Module]:
    return [m for m in model.modules() if isinstance(m, kind)]


def test_cnn5_is_the_authors_cnncifar() -> None:
    # conv3x3 3->128, pool, conv 128->128, pool, conv 128->128, fc 2048->10: 319,242.
    model = build_model("cnn5", (3, 32, 32), NUM_CLASSES)
    assert count_parameters(model) == 319_242
    convs = _layers(model, torch.nn.Conv2d)
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.padding) for c in convs] == [
        (3, 128, (3, 3), (0, 0)),
        (128, 128, (3, 3), (0, 0)),
        (128, 128, (3, 3), (0, 0)),
    ]
    assert len(_layers(model, torch.nn.MaxPool2d)) == 2
    assert [(x.in_features, x.out_features) for x in _layers(model, torch.nn.Linear)] == [
        (128 * 4 * 4, NUM_CLASSES)
    ]
    assert not _layers(model, torch.nn.BatchNorm2d)


def test_cnn5_on_digits_pads_the_last_conv_and_skips_the_last_pool() -> None:
    # 8x8: conv -> 6, pool -> 3, conv -> 1, pool skipped, conv padded -> 1: Linear(128, 10).
    model = build_model("cnn5", (1, 8, 8), NUM_CLASSES)
    assert count_parameters(model) == 297_738
    assert len(_layers(model, torch.nn.MaxPool2d)) == 1
    assert [c.padding for c in _layers(model, torch.nn.Conv2d)] == [(0, 0), (0, 0), (1, 1)]


def test_lenet5_is_the_tutorial_lenet() -> None:
    # PyTorch-tutorial LeNet (the authors' cnn_torch / CNN2): 6-16 convs 5x5, 120-84 linears.
    model = build_model("lenet5", (3, 32, 32), NUM_CLASSES)
    assert count_parameters(model) == 62_006
    assert count_parameters(build_model("lenet5", (1, 32, 32), NUM_CLASSES)) == 61_706
    convs = _layers(model, torch.nn.Conv2d)
    assert [(c.in_channels, c.out_channels, c.kernel_size) for c in convs] == [
        (3, 6, (5, 5)),
        (6, 16, (5, 5)),
    ]
    assert [(x.in_features, x.out_features) for x in _layers(model, torch.nn.Linear)] == [
        (16 * 5 * 5, 120),
        (120, 84),
        (84, NUM_CLASSES),
    ]


def test_lenet5_on_digits() -> None:
    # 8x8: conv -> 4, pool -> 2, conv padded -> 2, pool -> 1: Linear(16, 120).
    model = build_model("lenet5", (1, 8, 8), NUM_CLASSES)
    assert count_parameters(model) == 15_626
    assert [c.padding for c in _layers(model, torch.nn.Conv2d)] == [(0, 0), (2, 2)]


@pytest.mark.parametrize("name", ["cnn5", "lenet5"])
def test_coboosting_models_are_deterministic_with_a_seed(name: str) -> None:
    x = torch.randn(2, 3, 32, 32)
    outs = []
    for seed in (5, 5, 6):
        torch.manual_seed(seed)
        model = build_model(name, (3, 32, 32), NUM_CLASSES).eval()
        with torch.no_grad():
            outs.append(model(x))
    assert torch.equal(outs[0], outs[1])
    assert not torch.allclose(outs[0], outs[2])


@pytest.mark.parametrize("name", ["cnn5", "lenet5"])
def test_coboosting_models_reject_vectors(name: str) -> None:
    with pytest.raises(ValueError, match=name):
        build_model(name, (20,), NUM_CLASSES)


def test_mobilenetv3_small_matches_the_paper_layout() -> None:
    # Howard et al. 2019, Table 2: stride-2 stem of 16, 11 bottlenecks, 1x1 conv to 576,
    # Linear(576, 1024), Linear(1024, classes): 1,528,106 parameters (the authors' `mobile`).
    model = build_model("mobilenetv3_small", (3, 32, 32), NUM_CLASSES)
    assert count_parameters(model) == 1_528_106
    stem = _layers(model, torch.nn.Conv2d)[0]
    assert (stem.out_channels, stem.stride) == (16, (2, 2))
    depthwise = [c for c in _layers(model, torch.nn.Conv2d) if c.groups > 1]
    assert [c.kernel_size[0] for c in depthwise] == [3, 3, 3] + [5] * 8
    assert [c.stride[0] for c in depthwise] == [2, 2, 1, 2, 1, 1, 1, 1, 2, 1, 1]
    linears = [(x.in_features, x.out_features) for x in _layers(model, torch.nn.Linear)]
    assert linears[-2:] == [(576, 1024), (1024, NUM_CLASSES)]


def test_shufflenetv2_matches_the_paper_layout() -> None:
    # Ma et al. 2018, Table 5 (x1.0): stem 24 + max-pool, stages 116/232/464 of 4/8/4 units,
    # conv 1x1 to 1024: 1,263,854 parameters (the authors' `shuffle`).
    model = build_model("shufflenetv2", (3, 32, 32), NUM_CLASSES)
    assert count_parameters(model) == 1_263_854
    assert len(_layers(model, torch.nn.MaxPool2d)) == 1
    strided = [c.out_channels for c in _layers(model, torch.nn.Conv2d) if c.stride == (2, 2)]
    # the stem, then each stage's first unit: two depthwise convs (left and right branch)
    assert sorted(strided) == [24, 24, 58, 116, 116, 232, 232]
    assert [(x.in_features, x.out_features) for x in _layers(model, torch.nn.Linear)] == [
        (1024, NUM_CLASSES)
    ]


def test_channel_shuffle_interleaves_the_halves() -> None:
    from fedgo_flwr.models.mobile import channel_shuffle

    x = torch.arange(6.0).reshape(1, 6, 1, 1)
    assert channel_shuffle(x, 2).flatten().tolist() == [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
