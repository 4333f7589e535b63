"""MobileNetV3-Small and ShuffleNetV2 as used in Co-Boosting's heterogeneous-client setting.

Co-Boosting (Dai et al., "Enhancing One-Shot Federated Learning Through Data and Ensemble
Co-Boosting", ICLR 2024, Sec. 5 "Adaptation to Client Model Heterogeneity", Table 3 and
App. Table 15) mixes five client architectures on CIFAR-10: CNN1, CNN2, ResNet, "MobileNet
(Howard et al., 2019)" and "ShuffleNet (Ma et al., 2018)". In the authors' code
(github.com/rong-dai/Co-Boosting, ``registry.py``) these two are ``mobile`` = MobileNetV3-Small
and ``shuffle`` = ShuffleNetV2 x1.0, both in their **ImageNet layout** (stride-2 stem, and
ShuffleNetV2's 3x3 stride-2 max-pool) applied unchanged to 32x32 images; the zoo does the same
(zoo names ``"mobilenetv3_small"`` and ``"shufflenetv2"``), written here from the two papers.
Every convolution is padded, and the heads use global average pooling, so both models build
on any input of at least 1x1 (on 32x32 the last maps are 1x1 already).

These are not the CIFAR-adapted kuangliu/pytorch-cifar variants (stride-1 stems) that the
ResNet and VGG of :mod:`fedgo_flwr.models.classifiers` follow: Co-Boosting's numbers were obtained
with the ImageNet layouts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

__all__ = [
    "MOBILENETV3_SMALL_CFG",
    "MobileNetV3",
    "ShuffleNetV2",
]

MOBILENETV3_SMALL_CFG: tuple[tuple[int, int, int, bool, bool, int], ...] = (
    # kernel, expanded width, output width, squeeze-excite, hard-swish, stride
    (3, 16, 16, True, False, 2),
    (3, 72, 24, False, False, 2),
    (3, 88, 24, False, False, 1),
    (5, 96, 40, True, True, 2),
    (5, 240, 40, True, True, 1),
    (5, 240, 40, True, True, 1),
    (5, 120, 48, True, True, 1),
    (5, 144, 48, True, True, 1),
    (5, 288, 96, True, True, 2),
    (5, 576, 96, True, True, 1),
    (5, 576, 96, True, True, 1),
)
"""The bottleneck blocks of MobileNetV3-Small (Howard et al., ICCV 2019, Table 2)."""


def _round8(v: float) -> int:
    """``v`` rounded to a multiple of 8 (at least 8, never more than 10% below ``v``): the
    channel rounding of the MobileNet reference code, used for the squeeze-excite widths."""
    out = max(8, int(v + 4) // 8 * 8)
    return out + 8 if out < 0.9 * v else out


def _conv_bn(c_in: int, c_out: int, kernel: int, stride: int = 1, groups: int = 1) -> list:
    """A bias-free padded ``kernel`` x ``kernel`` convolution and its BatchNorm."""
    conv = nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, groups=groups, bias=False)
    return [conv, nn.BatchNorm2d(c_out)]


class SqueezeExcite(nn.Module):
    """Squeeze-and-excite with a hard-sigmoid gate (Howard et al. 2019, Sec. 5.3): global
    average pool, ``Linear(c, c/4 rounded to 8) -> ReLU -> Linear(., c) -> hard-sigmoid``,
    and the input scaled channel-wise by the gate."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        hidden = _round8(channels // 4)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Sequential(
            nn.Linear(channels, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, channels),
            nn.Hardsigmoid(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Scale the channels of ``x``."""
        gate = self.fc(torch.flatten(self.pool(x), 1))
        return x * gate[:, :, None, None]


class MobileBottleneck(nn.Module):
    """MobileNetV3 inverted-residual block (Howard et al. 2019, Fig. 4): 1x1 expansion (left
    out when the expanded width equals the input width) -> BN -> act, depthwise ``k`` x ``k``
    (stride ``s``) -> BN -> act, optional squeeze-excite, 1x1 projection -> BN; a residual
    connection when the stride is 1 and the widths agree. ``act`` is hard-swish or ReLU.

    The authors' code (a common PyTorch port) puts the squeeze-excite before the activation
    in blocks with an expansion; the paper's figure and the reference implementation put it
    after, as here. Parameter counts are the same.
    """

    def __init__(
        self, c_in: int, hidden: int, c_out: int, kernel: int, se: bool, hs: bool, stride: int
    ) -> None:
        super().__init__()
        act: type[nn.Module] = nn.Hardswish if hs else nn.ReLU
        layers: list[nn.Module] = []
        if hidden != c_in:
            layers += [*_conv_bn(c_in, hidden, 1), act()]
        layers += [*_conv_bn(hidden, hidden, kernel, stride, groups=hidden), act()]
        if se:
            layers.append(SqueezeExcite(hidden))
        layers += _conv_bn(hidden, c_out, 1)
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block."""
        out = self.block(x)
        return x + out if self.residual else out


class MobileNetV3(nn.Module):
    """MobileNetV3-Small (Howard et al., "Searching for MobileNetV3", ICCV 2019, Table 2),
    width 1.0, Co-Boosting's "MobileNet" client (the authors' ``mobile``).

    Stem ``Conv(3x3, stride 2) 3->16 -> BN -> hard-swish``, the 11 blocks of
    :data:`MOBILENETV3_SMALL_CFG`, ``Conv(1x1) 96->576 -> BN -> hard-swish``, global average
    pool, ``Linear(576, 1024) -> hard-swish -> Dropout(0.2) -> Linear(1024, num_classes)``
    (the paper's two 1x1 "NBN" convolutions on the pooled 1x1 map). 1,528,106 parameters for
    3 input channels and 10 classes. On 32x32 inputs the five stride-2 stages leave a 1x1 map.

    Initialisation follows the MobileNet reference code (as the authors' code does): convs
    ``N(0, 2 / (k*k*out_channels))``, BN weight 1 and bias 0, linear layers ``N(0, 0.01)``
    with zero bias, drawn from the global torch RNG (so ``torch.manual_seed`` fixes it).

    Args:
        in_channels: number of input channels.
        num_classes: number of output logits.
        cfg: the bottleneck blocks (kernel, expanded width, output width, SE, hard-swish,
            stride).
    """

    def __init__(
        self,
        in_channels: int = 3,
        num_classes: int = 10,
        cfg: Sequence[tuple[int, int, int, bool, bool, int]] = MOBILENETV3_SMALL_CFG,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [*_conv_bn(in_channels, 16, 3, 2), nn.Hardswish()]
        c_in = 16
        for kernel, hidden, c_out, se, hs, stride in cfg:
            layers.append(MobileBottleneck(c_in, hidden, c_out, kernel, se, hs, stride))
            c_in = c_out
        last = cfg[-1][1]  # the last expanded width: 576 for MobileNetV3-Small
        layers += [*_conv_bn(c_in, last, 1), nn.Hardswish(), nn.AdaptiveAvgPool2d(1)]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Linear(last, 1024),
            nn.Hardswish(),
            nn.Dropout(0.2),
            nn.Linear(1024, num_classes),
        )
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_out))
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits ``(N, num_classes)`` for images ``x`` of shape ``(N, C, H, W)``."""
        return self.classifier(torch.flatten(self.features(x), 1))


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    """Interleave the channels of ``groups`` groups (Zhang et al. 2018, ShuffleNet)."""
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)


class ShuffleUnit(nn.Module):
    """ShuffleNetV2 unit (Ma et al. 2018, Fig. 3(c) and 3(d)).

    Stride 1: the channels are split in halves; one half passes unchanged, the other goes
    through ``1x1 -> BN -> ReLU -> depthwise 3x3 -> BN -> 1x1 -> BN -> ReLU``. Stride 2 (down-
    sampling, width ``c_in -> c_out``): both branches see the whole input, the left one
    ``depthwise 3x3 (stride 2) -> BN -> 1x1 -> BN -> ReLU``, the right one as above with a
    stride-2 depthwise conv; each gives ``c_out / 2`` channels. The halves are concatenated
    and channel-shuffled with 2 groups.
    """

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        half = c_out // 2
        self.stride = stride
        right_in = c_in if stride == 2 else half
        self.right = nn.Sequential(
            *_conv_bn(right_in, half, 1),
            nn.ReLU(inplace=True),
            *_conv_bn(half, half, 3, stride, groups=half),
            *_conv_bn(half, half, 1),
            nn.ReLU(inplace=True),
        )
        self.left: nn.Module = nn.Identity()
        if stride == 2:
            self.left = nn.Sequential(
                *_conv_bn(c_in, c_in, 3, stride, groups=c_in),
                *_conv_bn(c_in, half, 1),
                nn.ReLU(inplace=True),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the unit."""
        if self.stride == 1:
            keep, work = x.chunk(2, dim=1)
            out = torch.cat((keep, self.right(work)), dim=1)
        else:
            out = torch.cat((self.left(x), self.right(x)), dim=1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    """ShuffleNetV2 x1.0 (Ma et al., "ShuffleNet V2: Practical Guidelines for Efficient CNN
    Architecture Design", ECCV 2018, Table 5), Co-Boosting's "ShuffleNet" client (the
    authors' ``shuffle``).

    ``Conv(3x3, stride 2) -> 24 -> BN -> ReLU``, ``MaxPool(3x3, stride 2, padding 1)``, three
    stages of 4, 8 and 4 units with widths 116, 232, 464 (the first unit of each with stride
    2), ``Conv(1x1) -> 1024 -> BN -> ReLU``, global average pool, ``Linear(1024,
    num_classes)``. 1,263,854 parameters for 3 input channels and 10 classes. PyTorch's
    default initialisers (as in the authors' code).

    Args:
        in_channels: number of input channels.
        num_classes: number of output logits.
        widths: output widths of the three stages.
        repeats: number of units per stage.
    """

    def __init__(
        self,
        in_channels: int = 3,
        num_classes: int = 10,
        widths: Sequence[int] = (116, 232, 464),
        repeats: Sequence[int] = (4, 8, 4),
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            *_conv_bn(in_channels, 24, 3, 2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1),
        ]
        c_in = 24
        for width, n in zip(widths, repeats, strict=True):
            for i in range(n):
                layers.append(ShuffleUnit(c_in, width, 2 if i == 0 else 1))
                c_in = width
        layers += [*_conv_bn(c_in, 1024, 1), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1)]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(1024, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits ``(N, num_classes)`` for images ``x`` of shape ``(N, C, H, W)``."""
        return self.classifier(torch.flatten(self.features(x), 1))
