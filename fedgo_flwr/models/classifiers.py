"""Model zoo for fedgo-flwr (plain PyTorch).

All models are built through :func:`build_model` from a name in
:data:`~fedgo_flwr.config.names.MODEL_NAMES`, an input shape without the batch dimension and a
number of classes. Every model's ``forward(x)`` takes a batch ``x`` of shape ``(N, *input_shape)``
and returns logits of shape ``(N, num_classes)``. Input shapes are ``(C, H, W)`` for images
(``(1, 8, 8)`` for scikit-learn digits, ``(3, 32, 32)`` for CIFAR-10/100) or ``(D,)`` for
feature vectors.

Models: ``"cnn"`` (small CPU-friendly CNN, the default, :class:`SmallCNN`; on a vector input the
``"mlp"``), ``"cnn_bn"`` (the same with BatchNorm), ``"resnet8"`` (FedDF's), ``"mlp"`` (3 layers,
any input), ``"resnet18"``, ``"vgg11_bn"``, ``"resnet50"`` (CIFAR variants), ``"gn_lenet"``
(GroupNorm LeNet, CPFL's), and Co-Boosting's ``"cnn5"`` (McMahan et al.'s 5-layer CNN),
``"lenet5"``, ``"mobilenetv3_small"`` and ``"shufflenetv2"``
(:mod:`fedgo_flwr.models.mobile`).

The ResNet and VGG architectures follow kuangliu/pytorch-cifar, the CIFAR variants FedGO uses
(ICML 2025, App. E.2 / F.4), not torchvision's ImageNet stems, which discard most of a 32x32
image; an adaptive final pool lets them run on 8x8 digits too (identical on 32x32 inputs).
Which of the zoo's models each of Co-Boosting's named models is, and the other deviations:
``docs/architecture.md`` ("The model zoo").

Initialisation uses PyTorch's default layer initialisers (``"mobilenetv3_small"``: the
MobileNet reference initialisers, also drawn from torch's RNG), so a model is fully determined
by the global torch RNG state: calling ``torch.manual_seed(s)`` before :func:`build_model`
gives identical initial parameters for identical ``s``.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch
from torch import nn

from fedgo_flwr.config.names import MODEL_NAMES
from fedgo_flwr.models.mobile import MobileNetV3, ShuffleNetV2

__all__ = [
    "MLP",
    "VGG",
    "VGG11_CFG",
    "BasicBlock",
    "CNN5",
    "GNLeNet",
    "LeNet5",
    "Bottleneck",
    "ResNet",
    "SmallCNN",
    "build_model",
    "count_parameters",
    "resnet8",
    "resnet18",
    "resnet50",
]

VGG11_CFG: tuple[int | str, ...] = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
"""VGG-11 configuration ("A" in Simonyan & Zisserman 2015): conv widths, ``"M"`` = max-pool."""


# ---------------------------------------------------------------------------------------------
# Small models
# ---------------------------------------------------------------------------------------------


class MLP(nn.Module):
    """3-layer perceptron on the flattened input.

    ``Flatten -> Linear(in_features, hidden) -> ReLU -> Linear(hidden, hidden) -> ReLU ->
    Linear(hidden, num_classes)``.

    Args:
        in_features: number of input features after flattening (product of the input shape).
        num_classes: number of output logits.
        hidden: width of the two hidden layers (default 64).
    """

    def __init__(self, in_features: int, num_classes: int, hidden: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(start_dim=1),
            nn.Linear(in_features, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits ``(N, num_classes)`` for a batch ``x`` of shape ``(N, ...)``."""
        return self.net(x)


def _pool_kernel(h: int, w: int) -> tuple[int, int] | None:
    """Kernel of a 2x2 max-pool that never shrinks a side below 1, or ``None`` to skip it.

    A side of length 1 is left alone (kernel 1 along it); if both sides are 1 the pool is
    skipped entirely.
    """
    kh, kw = (2 if h >= 2 else 1), (2 if w >= 2 else 1)
    if kh == 1 and kw == 1:
        return None
    return kh, kw


class SmallCNN(nn.Module):
    """Small CNN sized for CPU runs (the project default ``"cnn"``).

    Two blocks ``Conv(3x3, padding 1) -> ReLU -> MaxPool(2)`` with 32 and 64 channels, an
    adaptive average pool to at most 4x4, then ``Linear(64*h*w, 128) -> ReLU ->
    Linear(128, num_classes)``. Max-pools that would shrink a side below 1 are skipped, and the
    adaptive pool never upsamples (its output is ``min(4, side)`` per side), so the model works
    from 1x1 inputs upwards. On (3, 32, 32) with 10 classes it has 151,882 parameters; on
    (1, 8, 8) (feature maps 2x2 before the head) 53,002.

    With ``batch_norm=True`` (model ``"cnn_bn"``) each convolution is followed by a BatchNorm
    layer, as in the BN networks both FedDF and FedGO use; the layer names of the convolutions
    and the head are then different from the plain CNN's.

    Args:
        in_channels: number of input channels ``C``.
        height: input height ``H``.
        width: input width ``W``.
        num_classes: number of output logits.
        batch_norm: insert ``BatchNorm2d`` between each convolution and its ReLU.
    """

    def __init__(
        self, in_channels: int, height: int, width: int, num_classes: int, batch_norm: bool = False
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        h, w, c_in = height, width, in_channels
        for c_out in (32, 64):
            layers.append(nn.Conv2d(c_in, c_out, kernel_size=3, padding=1, bias=not batch_norm))
            if batch_norm:
                layers.append(nn.BatchNorm2d(c_out))
            layers.append(nn.ReLU(inplace=True))
            kernel = _pool_kernel(h, w)
            if kernel is None:
                layers.append(nn.Identity())
            else:
                layers.append(nn.MaxPool2d(kernel))
                h, w = h // kernel[0], w // kernel[1]
            c_in = c_out
        out_h, out_w = min(4, h), min(4, w)
        layers.append(nn.AdaptiveAvgPool2d((out_h, out_w)))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Flatten(start_dim=1),
            nn.Linear(64 * out_h * out_w, 128),
            nn.ReLU(inplace=True),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits ``(N, num_classes)`` for images ``x`` of shape ``(N, C, H, W)``."""
        return self.classifier(self.features(x))


class GNLeNet(nn.Module):
    """GN-LeNet: the GroupNorm LeNet of Hsieh et al., "The Non-IID Data Quagmire of
    Decentralized Machine Learning", ICML 2020: the "LeNet" of the CPFL paper for CIFAR-10
    (Sec. 4.1, "Dataset") is this model in the authors' code (digest part A.4).

    Three blocks of ``Conv(5x5, padding 2)``, each with a 3x3 stride-2 max-pool, GroupNorm
    with 2 groups and ReLU: block 1 is ``conv 3->32 -> pool -> GN -> ReLU``, blocks 2 and 3
    are ``conv 32->32`` and ``conv 32->64`` followed by ``GN -> pool -> ReLU`` (the layer order
    of Hsieh et al.'s reference code; the order does not change the parameter count). Then one
    ``Linear(64*h*w, num_classes)``. On (3, 32, 32) the maps are 15x15, 7x7, 3x3 and the model
    has **85,354** parameters for 10 classes (the "about 85k" of the notes; 341,416 bytes of
    float32, close to the paper's 346 KB serialized model, App. B.4).

    Other image shapes: a pool is applied only while both sides are at least 3 (else it is an
    ``nn.Identity``, so parameter names do not depend on the shape); e.g. (1, 8, 8) gives maps
    3x3, 1x1, 1x1. GroupNorm works at batch size 1, unlike BatchNorm.

    Output: raw logits, like every model of this zoo. The authors' code returns
    ``log_softmax``. Cross-entropy, argmax and softmax are unchanged by ``log_softmax``
    (it only subtracts a per-sample constant), so training and accuracy are the same; but
    CPFL's stage-2 distillation is L1 on the teachers' "logits" (paper eq. 3), which differs
    between raw logits and log-probabilities. That choice belongs to the CPFL strategy (apply
    ``torch.log_softmax`` to the outputs to match the authors' code), not to the model.

    Args:
        in_channels: number of input channels ``C``.
        height: input height ``H``.
        width: input width ``W``.
        num_classes: number of output logits.
    """

    def __init__(self, in_channels: int, height: int, width: int, num_classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        h, w, c_in = height, width, in_channels
        for i, c_out in enumerate((32, 32, 64)):
            conv = nn.Conv2d(c_in, c_out, kernel_size=5, stride=1, padding=2)
            pool: nn.Module = nn.Identity()
            if h >= 3 and w >= 3:
                pool = nn.MaxPool2d(kernel_size=3, stride=2)
                h, w = (h - 3) // 2 + 1, (w - 3) // 2 + 1
            norm = nn.GroupNorm(2, c_out)
            ordered = [conv, pool, norm] if i == 0 else [conv, norm, pool]
            layers += [*ordered, nn.ReLU(inplace=True)]
            c_in = c_out
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(64 * h * w, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits ``(N, num_classes)`` for images ``x`` of shape ``(N, C, H, W)``."""
        return self.classifier(torch.flatten(self.features(x), 1))


def _valid_or_same_padding(h: int, w: int, kernel: int) -> tuple[int, int]:
    """Padding of a ``kernel`` x ``kernel`` convolution that is "valid" (no padding, the map
    shrinks by ``kernel - 1``) along every side at least ``kernel`` long, and "same" (padding
    ``kernel // 2``, the side is kept) along a shorter side, where a valid convolution would
    have no output. Used by :class:`CNN5` and :class:`LeNet5` so that they build on small
    inputs such as 8x8 digits; on their native 32x32 inputs every convolution is valid."""
    return (0 if h >= kernel else kernel // 2, 0 if w >= kernel else kernel // 2)


class _ConvPoolStack(nn.Module):
    """Shared body of :class:`CNN5` and :class:`LeNet5`: ``Conv -> ReLU [-> MaxPool(2)]`` blocks.

    Each convolution is valid where the map is large enough, else same-size
    (:func:`_valid_or_same_padding`); each 2x2 max-pool is kept only along a side of at least 2
    (:func:`_pool_kernel`, as in :class:`VGG`), and replaced by ``nn.Identity`` when both sides
    are 1, so parameter names never depend on the input size. ``out_shape`` is the final map's
    ``(channels, h, w)``.
    """

    def __init__(
        self,
        in_channels: int,
        height: int,
        width: int,
        widths: Sequence[int],
        kernel: int,
        pool_after: Sequence[bool],
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c_in, h, w = in_channels, height, width
        for c_out, pool in zip(widths, pool_after, strict=True):
            pad = _valid_or_same_padding(h, w, kernel)
            layers += [nn.Conv2d(c_in, c_out, kernel, padding=pad), nn.ReLU(inplace=True)]
            h, w = h + 2 * pad[0] - kernel + 1, w + 2 * pad[1] - kernel + 1
            if pool:
                pk = _pool_kernel(h, w)
                layers.append(nn.Identity() if pk is None else nn.MaxPool2d(pk))
                if pk is not None:
                    h, w = h // pk[0], w // pk[1]
            c_in = c_out
        self.layers = nn.Sequential(*layers)
        self.out_shape = (c_in, h, w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the blocks."""
        return self.layers(x)


class CNN5(nn.Module):
    """The "CNN with 5 layers" of Co-Boosting (Dai et al., ICLR 2024, Sec. 5 and App. B:
    "following McMahan et al. (2017)"; the "CNN1" of its heterogeneous setting, Table 3), as
    defined by the authors' ``CNNCifar`` (registry name ``cnn``).

    ``Conv(3x3) 3->128 -> ReLU -> MaxPool(2) -> Conv(3x3) 128->128 -> ReLU -> MaxPool(2) ->
    Conv(3x3) 128->128 -> ReLU -> Linear(128*4*4, num_classes)``: unpadded convolutions, no
    normalisation, no dropout. On (3, 32, 32) the maps are 30, 15, 13, 6, 4 pixels wide and the
    model has **319,242** parameters for 10 classes (the "about 0.32M" of the notes).

    Other image shapes: a convolution whose input side is shorter than 3 is padded by 1 along
    that side (kept size) instead of having no output, a max-pool along a side of 1 is skipped,
    and the linear head takes whatever map is left (``128*h*w`` inputs). On (1, 8, 8) the maps
    are 6, 3, 1, 1 (second pool skipped), 1 (third conv padded): 297,738 parameters. On 32x32
    nothing changes.

    Args:
        in_channels: number of input channels ``C``.
        height: input height ``H``.
        width: input width ``W``.
        num_classes: number of output logits.
    """

    def __init__(self, in_channels: int, height: int, width: int, num_classes: int) -> None:
        super().__init__()
        self.features = _ConvPoolStack(
            in_channels, height, width, (128, 128, 128), 3, (True, True, False)
        )
        c, h, w = self.features.out_shape
        self.classifier = nn.Linear(c * h * w, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits ``(N, num_classes)`` for images ``x`` of shape ``(N, C, H, W)``."""
        return self.classifier(torch.flatten(self.features(x), 1))


class LeNet5(nn.Module):
    """LeNet-5 as in the PyTorch tutorial ("Training a classifier"): Co-Boosting's model for
    MNIST and FMNIST (Dai et al., ICLR 2024, Sec. 5 / App. B, LeCun et al. 1998; the authors
    resize MNIST to 32x32) and the "CNN2" of its heterogeneous setting (Table 3).

    ``Conv(5x5) C->6 -> ReLU -> MaxPool(2) -> Conv(5x5) 6->16 -> ReLU -> MaxPool(2) ->
    Linear(16*5*5, 120) -> ReLU -> Linear(120, 84) -> ReLU -> Linear(84, num_classes)``.
    On (3, 32, 32) it has **62,006** parameters for 10 classes, on (1, 32, 32) 61,706.

    The authors' code has two versions: ``cnn_torch`` (CNN2, this layout) and ``lenet`` (from
    DAFL, used for MNIST/FMNIST), whose third layer is a 5x5 convolution 16->120 on the 5x5 map
    instead of ``Linear(400, 120)``. On 32x32 inputs that convolution is the same linear map
    of the same 400 inputs (same parameter count, same default initialiser), so one zoo model
    serves both; only the state-dict layout differs.

    Other image shapes: as :class:`CNN5`, with padding 2 for a side shorter than 5. On
    (1, 8, 8) the maps are 4, 2, 2 (second conv padded), 1: ``Linear(16, 120)``, 15,626
    parameters. On (1, 28, 28) (MNIST not resized) the head is ``Linear(16*4*4, 120)``.

    Args:
        in_channels: number of input channels ``C``.
        height: input height ``H``.
        width: input width ``W``.
        num_classes: number of output logits.
    """

    def __init__(self, in_channels: int, height: int, width: int, num_classes: int) -> None:
        super().__init__()
        self.features = _ConvPoolStack(in_channels, height, width, (6, 16), 5, (True, True))
        c, h, w = self.features.out_shape
        self.classifier = nn.Sequential(
            nn.Linear(c * h * w, 120),
            nn.ReLU(inplace=True),
            nn.Linear(120, 84),
            nn.ReLU(inplace=True),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits ``(N, num_classes)`` for images ``x`` of shape ``(N, C, H, W)``."""
        return self.classifier(torch.flatten(self.features(x), 1))


# ---------------------------------------------------------------------------------------------
# ResNet (CIFAR variant)
# ---------------------------------------------------------------------------------------------


class BasicBlock(nn.Module):
    """ResNet basic block (two 3x3 convs), He et al., "Deep Residual Learning for Image
    Recognition", CVPR 2016; as in kuangliu/pytorch-cifar ``models/resnet.py``.

    The shortcut is the identity, or a 1x1 conv + BatchNorm when the stride or width changes
    (option B of He et al. 2016).
    """

    expansion: int = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut: nn.Module = nn.Sequential()
        if stride != 1 or in_planes != self.expansion * planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, self.expansion * planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(self.expansion * planes),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block."""
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class Bottleneck(nn.Module):
    """ResNet bottleneck block (1x1 -> 3x3 -> 1x1 convs, expansion 4), He et al. 2016; as in
    kuangliu/pytorch-cifar ``models/resnet.py`` (stride on the 3x3 conv)."""

    expansion: int = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, self.expansion * planes, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(self.expansion * planes)
        self.shortcut: nn.Module = nn.Sequential()
        if stride != 1 or in_planes != self.expansion * planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, self.expansion * planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(self.expansion * planes),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block."""
        out = torch.relu(self.bn1(self.conv1(x)))
        out = torch.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return torch.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR ResNet (He et al., "Deep Residual Learning for Image Recognition", CVPR 2016).

    With the default widths 64/128/256/512 this follows kuangliu/pytorch-cifar
    ``models/resnet.py`` as used by FedGO (Jang et al., ICML 2025, App. E.2 / F.4): a 3x3
    stride-1 stem with ``widths[0]`` channels + BatchNorm + ReLU, no max-pool, one stage of
    ``num_blocks[i]`` blocks per width (stride 1 for the first stage, 2 after), global average
    pooling (adaptive, so any input size >= 1x1 works; on 32x32 this equals kuangliu's
    ``avg_pool2d(out, 4)``), and a linear head. With widths 16/32/64 and one basic block per
    stage it is the 6n+2 CIFAR ResNet-8 of He et al. Sec. 4.2 that FedDF (Lin et al.,
    NeurIPS 2020, Sec. 4.1) uses as its workhorse.

    Args:
        block: :class:`BasicBlock` or :class:`Bottleneck`.
        num_blocks: number of blocks per stage, e.g. ``(2, 2, 2, 2)`` for ResNet-18.
        in_channels: number of input channels.
        num_classes: number of output logits.
        widths: channel width of each stage (same length as ``num_blocks``).
    """

    def __init__(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        num_blocks: Sequence[int],
        in_channels: int = 3,
        num_classes: int = 10,
        widths: Sequence[int] = (64, 128, 256, 512),
    ) -> None:
        super().__init__()
        if len(num_blocks) != len(widths) or not num_blocks:
            raise ValueError(
                f"ResNet needs one width per stage, got num_blocks={tuple(num_blocks)} "
                f"and widths={tuple(widths)}"
            )
        self.num_stages = len(widths)
        self.in_planes = widths[0]
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        for i, (planes, n) in enumerate(zip(widths, num_blocks, strict=True)):
            stage = self._make_layer(block, planes, n, stride=1 if i == 0 else 2)
            setattr(self, f"layer{i + 1}", stage)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.linear = nn.Linear(widths[-1] * block.expansion, num_classes)

    def _make_layer(
        self, block: type[BasicBlock] | type[Bottleneck], planes: int, n: int, stride: int
    ) -> nn.Sequential:
        layers: list[nn.Module] = []
        for s in [stride] + [1] * (n - 1):
            layers.append(block(self.in_planes, planes, s))
            self.in_planes = planes * block.expansion
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits ``(N, num_classes)`` for images ``x`` of shape ``(N, C, H, W)``."""
        out = torch.relu(self.bn1(self.conv1(x)))
        for i in range(self.num_stages):
            out = getattr(self, f"layer{i + 1}")(out)
        out = torch.flatten(self.avgpool(out), 1)
        return self.linear(out)


def resnet8(in_channels: int = 3, num_classes: int = 10) -> ResNet:
    """CIFAR ResNet-8 (6n+2 with n = 1, widths 16/32/64, BatchNorm), FedDF's model
    (Lin et al., NeurIPS 2020, Sec. 4.1). 78,042 parameters for 3 input channels and 10
    classes."""
    return ResNet(
        BasicBlock, (1, 1, 1), in_channels=in_channels, num_classes=num_classes, widths=(16, 32, 64)
    )


def resnet18(in_channels: int = 3, num_classes: int = 10) -> ResNet:
    """CIFAR ResNet-18: :class:`BasicBlock` x [2, 2, 2, 2]. 11,173,962 parameters for
    3 input channels and 10 classes (same as kuangliu/pytorch-cifar ``ResNet18``)."""
    return ResNet(BasicBlock, (2, 2, 2, 2), in_channels=in_channels, num_classes=num_classes)


def resnet50(in_channels: int = 3, num_classes: int = 10) -> ResNet:
    """CIFAR ResNet-50: :class:`Bottleneck` x [3, 4, 6, 3] (expansion 4). 23,520,842
    parameters for 3 input channels and 10 classes (same as kuangliu/pytorch-cifar
    ``ResNet50``)."""
    return ResNet(Bottleneck, (3, 4, 6, 3), in_channels=in_channels, num_classes=num_classes)


# ---------------------------------------------------------------------------------------------
# VGG (CIFAR variant)
# ---------------------------------------------------------------------------------------------


class VGG(nn.Module):
    """CIFAR VGG with BatchNorm (Simonyan & Zisserman, "Very Deep Convolutional Networks for
    Large-Scale Image Recognition", ICLR 2015), following kuangliu/pytorch-cifar
    ``models/vgg.py`` as used by FedGO (Jang et al., ICML 2025, App. E.2 / F.4).

    Features: for each ``cfg`` entry, ``Conv(3x3, padding 1) -> BatchNorm -> ReLU`` or a 2x2
    max-pool (``"M"``). Then a global average pool and a **single** ``Linear(512,
    num_classes)`` classifier, as in kuangliu/pytorch-cifar (not the 3-layer 4096-wide
    ImageNet head). With the VGG-11 cfg it has 9,231,114 parameters for 3 input channels and
    10 classes.

    Small inputs: a max-pool that would shrink a side below 1 is replaced by a pool along the
    other side only, or by ``nn.Identity`` if both sides are already 1 (so parameter names are
    the same for every input size), and the final pool is adaptive (1x1). For 8x8 inputs the
    last two max-pools are skipped; for 32x32 inputs nothing changes (kuangliu's
    ``AvgPool2d(1, 1)`` is a no-op on the 1x1 map).

    Args:
        cfg: layer configuration, e.g. :data:`VGG11_CFG`.
        in_channels: number of input channels.
        height: input height (used to decide which max-pools to keep).
        width: input width.
        num_classes: number of output logits.
    """

    def __init__(
        self,
        cfg: Sequence[int | str],
        in_channels: int = 3,
        height: int = 32,
        width: int = 32,
        num_classes: int = 10,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c_in, h, w = in_channels, height, width
        for v in cfg:
            if v == "M":
                kernel = _pool_kernel(h, w)
                if kernel is None:
                    layers.append(nn.Identity())
                else:
                    layers.append(nn.MaxPool2d(kernel))
                    h, w = h // kernel[0], w // kernel[1]
            elif isinstance(v, int):
                layers += [
                    nn.Conv2d(c_in, v, kernel_size=3, padding=1),
                    nn.BatchNorm2d(v),
                    nn.ReLU(inplace=True),
                ]
                c_in = v
            else:
                raise ValueError(f"invalid VGG cfg entry {v!r}: expected an int or 'M'")
        layers.append(nn.AdaptiveAvgPool2d(1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(c_in, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits ``(N, num_classes)`` for images ``x`` of shape ``(N, C, H, W)``."""
        out = torch.flatten(self.features(x), 1)
        return self.classifier(out)


# ---------------------------------------------------------------------------------------------
# Factory
# ---------------------------------------------------------------------------------------------


def _normalise_shape(input_shape: Sequence[int]) -> tuple[int, ...]:
    """Validate ``input_shape`` (non-empty, positive ints) and return it as a tuple."""
    try:
        shape = tuple(int(d) for d in input_shape)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"input_shape must be a sequence of ints, got {input_shape!r}") from exc
    if not shape or any(d < 1 for d in shape):
        raise ValueError(f"input_shape must be non-empty with positive sizes, got {input_shape!r}")
    return shape


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Build a freshly initialised model by name.

    Args:
        name: one of :data:`~fedgo_flwr.config.names.MODEL_NAMES` (exact, lower case).
        input_shape: per-sample input shape without the batch dimension: ``(C, H, W)`` for
            images or ``(D,)`` for feature vectors.
        num_classes: number of output logits (>= 1).

    Returns:
        A module whose ``forward(x)`` maps ``(N, *input_shape)`` to logits
        ``(N, num_classes)``. Parameters are drawn from the global torch RNG, so call
        ``torch.manual_seed`` first for reproducible initialisation.

    Notes:
        ``"mlp"`` accepts any input shape (it flattens). ``"cnn"`` on a vector input ``(D,)``
        falls back to the ``"mlp"`` model (an :class:`MLP` is returned). Every other model
        needs a ``(C, H, W)`` input; any ``C`` and any ``H, W >= 1`` work.

    Raises:
        ValueError: unknown ``name`` (the message lists
        :data:`~fedgo_flwr.config.names.MODEL_NAMES`), a malformed
            ``input_shape`` or ``num_classes``, or an input shape the model cannot take
            (e.g. ``"resnet18"`` on ``(2,)``; the message names the model and the shape).
    """
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; expected one of {', '.join(MODEL_NAMES)}")
    shape = _normalise_shape(input_shape)
    if not isinstance(num_classes, numbers.Integral) or isinstance(num_classes, bool):
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    num_classes = int(num_classes)
    if num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")

    if name == "mlp" or (name == "cnn" and len(shape) == 1):
        in_features = 1
        for d in shape:
            in_features *= d
        return MLP(in_features, num_classes)

    if len(shape) != 3:
        hint = (
            "; use 'mlp' (or 'cnn', which falls back to it) for vectors" if len(shape) == 1 else ""
        )
        raise ValueError(f"model {name!r} needs an image input_shape (C, H, W), got {shape}{hint}")
    c, h, w = shape
    if name in ("cnn", "cnn_bn"):
        return SmallCNN(c, h, w, num_classes, batch_norm=name == "cnn_bn")
    if name == "resnet8":
        return resnet8(in_channels=c, num_classes=num_classes)
    if name == "resnet18":
        return resnet18(in_channels=c, num_classes=num_classes)
    if name == "vgg11_bn":
        return VGG(VGG11_CFG, in_channels=c, height=h, width=w, num_classes=num_classes)
    if name == "resnet50":
        return resnet50(in_channels=c, num_classes=num_classes)
    if name == "gn_lenet":
        return GNLeNet(c, h, w, num_classes)
    if name == "cnn5":
        return CNN5(c, h, w, num_classes)
    if name == "lenet5":
        return LeNet5(c, h, w, num_classes)
    if name == "mobilenetv3_small":
        return MobileNetV3(c, num_classes)
    if name == "shufflenetv2":
        return ShuffleNetV2(c, num_classes)
    raise AssertionError(f"unhandled model name {name!r}")  # pragma: no cover


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameter elements in ``model`` (all of them, or only those with
    ``requires_grad`` if ``trainable_only``). BatchNorm running statistics are buffers, not
    parameters, and are not counted."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
