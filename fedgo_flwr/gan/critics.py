"""The WGAN-GP critics of FedGO's server generator and their builder :func:`build_critic`.

The server trains its generator (:mod:`fedgo_flwr.gan.generators`) with WGAN-GP (Gulrajani et
al., 2017; :mod:`fedgo_flwr.gan.wgan_gp`) against one of these critics. Server only; never sent to
clients; raw scores ``(N,)``: ``"dcgan"`` (the ``gan_cifar.py`` critic: 5x5 stride-2
convolutions ``C -> d -> 2d -> 4d``, LeakyReLU(0.2), linear head; no BatchNorm as Gulrajani et
al. require for the gradient penalty, optional ``norm="layer"``), ``"resnet"`` (the
``gan_cifar_resnet.py`` critic, no normalisation) and ``"mlp"``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from fedgo_flwr.gan.common import _LEAK, _as_shape, _image_shape, _lookup, _plan, _seeded

__all__ = [
    "CRITIC_NAMES",
    "DCGANCritic",
    "MLPCritic",
    "ResNetCritic",
    "build_critic",
]

CRITIC_NAMES: tuple[str, ...] = ("dcgan", "resnet", "mlp")
"""Names accepted by :func:`build_critic` (WGAN-GP critics, server side)."""


class DCGANCritic(nn.Module):
    """WGAN-GP critic of ``gan_cifar.py``: stride-2 5x5 convolutions and LeakyReLU(0.2), no BN.

    Channels ``C -> d -> 2d -> 4d`` for 32x32 (``n`` stages from
    :func:`~fedgo_flwr.gan.common.upsampling_plan`, mirroring
    :class:`~fedgo_flwr.gan.generators.DCGANGenerator`), then flatten and ``Linear(-> 1)``.
    Gulrajani et al. (2017, Sec. 4)
    drop batch normalisation from the critic because the penalty is per-sample; ``norm="layer"``
    adds layer normalisation (``GroupNorm(1, ·)``: statistics over ``C, H, W`` per sample) after
    every convolution but the first, which they recommend as a drop-in.

    Args:
        input_shape: ``(C, H, W)``.
        width: ``d`` (default 64).
        norm: ``"none"`` (default, official ``wgan-gp`` mode) or ``"layer"``.
    """

    def __init__(self, input_shape: Sequence[int], width: int = 64, norm: str = "none") -> None:
        super().__init__()
        shape = _as_shape("critic", "dcgan", input_shape)
        c, _, _ = _image_shape("critic", "dcgan", shape)
        if norm not in ("none", "layer"):
            raise ValueError(f"critic 'dcgan': norm must be 'none' or 'layer', got {norm!r}")
        n, h0, w0 = _plan("critic", "dcgan", shape)
        self.input_shape = shape
        layers: list[nn.Module] = []
        cin, cout = c, width
        for i in range(n):
            layers.append(nn.Conv2d(cin, cout, 5, stride=2, padding=2))
            if norm == "layer" and i > 0:
                layers.append(nn.GroupNorm(1, cout))
            layers.append(nn.LeakyReLU(_LEAK, inplace=True))
            cin, cout = cout, cout * 2
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(cin * h0 * w0, 1)

    def forward(self, x: Tensor) -> Tensor:
        """Critic scores ``(N,)`` (unbounded)."""
        return self.head(self.features(x).flatten(1)).view(-1)


class _DownBlock(nn.Module):
    """Pre-activation residual block of ``gan_cifar_resnet.py`` (no normalisation in the critic).

    ``resample="down"``: conv, ReLU, conv + 2x2 mean-pool; shortcut 1x1 conv + mean-pool.
    ``resample=None``: identity shortcut (``cin == cout``). ``first=True`` is
    ``OptimizedResBlockDisc1`` (no leading ReLU; shortcut mean-pool then 1x1 conv).
    """

    def __init__(self, cin: int, cout: int, resample: str | None, first: bool = False) -> None:
        super().__init__()
        self.resample, self.first = resample, first
        mid = cout if first else cin
        self.conv1 = nn.Conv2d(cin, mid, 3, padding=1)
        self.conv2 = nn.Conv2d(mid, cout, 3, padding=1)
        self.shortcut: nn.Module = (
            nn.Conv2d(cin, cout, 1) if (resample is not None or cin != cout) else nn.Identity()
        )

    def forward(self, x: Tensor) -> Tensor:
        """Residual step (halves the grid when ``resample == "down"``)."""
        down = self.resample == "down"
        if self.first:
            short = self.shortcut(F.avg_pool2d(x, 2))
            out = self.conv1(x)
        else:
            short = self.shortcut(x)
            short = F.avg_pool2d(short, 2) if down else short
            out = self.conv1(F.relu(x))
        out = self.conv2(F.relu(out))
        return short + (F.avg_pool2d(out, 2) if down else out)


class ResNetCritic(nn.Module):
    """ResNet critic of ``gan_cifar_resnet.py`` without normalisation (``NORMALIZATION_D=False``).

    ``OptimizedResBlockDisc1`` (down), ``n - 2`` further down-blocks, two plain blocks, ReLU,
    global mean-pool, ``Linear(d -> 1)``; ``n`` from :func:`~fedgo_flwr.gan.common.upsampling_plan`
    (32x32: 32 -> 16 -> 8, as in the official file; 8x8: 8 -> 4).

    Args:
        input_shape: ``(C, H, W)``.
        width: Channels ``d`` (``DIM_D``; default 128).
    """

    def __init__(self, input_shape: Sequence[int], width: int = 128) -> None:
        super().__init__()
        shape = _as_shape("critic", "resnet", input_shape)
        c, _, _ = _image_shape("critic", "resnet", shape)
        n, _, _ = _plan("critic", "resnet", shape)
        self.input_shape = shape
        blocks: list[nn.Module] = [_DownBlock(c, width, "down", first=True)]
        blocks += [_DownBlock(width, width, "down") for _ in range(max(n - 2, 0))]
        blocks += [_DownBlock(width, width, None), _DownBlock(width, width, None)]
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(width, 1)

    def forward(self, x: Tensor) -> Tensor:
        """Critic scores ``(N,)`` (unbounded)."""
        return self.head(F.relu(self.blocks(x)).mean(dim=(2, 3))).view(-1)


class MLPCritic(nn.Module):
    """ReLU MLP critic (``gan_toy.py`` style); inputs of any shape are flattened.

    Args:
        input_shape: Sample shape.
        hidden: Hidden units per layer.
        depth: Number of hidden ReLU layers (``gan_toy.py`` uses 3).
    """

    def __init__(self, input_shape: Sequence[int], hidden: int = 128, depth: int = 3) -> None:
        super().__init__()
        shape = _as_shape("critic", "mlp", input_shape)
        self.input_shape = shape
        layers: list[nn.Module] = []
        fan_in = math.prod(shape)
        for _ in range(depth):
            layers += [nn.Linear(fan_in, hidden), nn.ReLU(inplace=True)]
            fan_in = hidden
        layers.append(nn.Linear(fan_in, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        """Critic scores ``(N,)`` (unbounded)."""
        return self.net(x.flatten(1)).view(-1)


_CRITICS: dict[str, type[nn.Module]] = {
    "dcgan": DCGANCritic,
    "resnet": ResNetCritic,
    "mlp": MLPCritic,
}


def build_critic(
    name: str, input_shape: Sequence[int], *, seed: int | None = None, **kwargs: Any
) -> nn.Module:
    """Build a WGAN-GP critic ``(N, *input_shape) -> (N,)`` (server side only).

    Args:
        name: One of :data:`CRITIC_NAMES` (``"dcgan"``, ``"resnet"``, ``"mlp"``).
        input_shape: Sample shape; conv critics need ``(C, H, W)``.
        seed: Seed the initial weights (forked RNG).
        **kwargs: Model options (``width``, ``norm`` for ``dcgan``; ``width`` for ``resnet``;
            ``hidden``, ``depth`` for ``mlp``).

    Raises:
        ValueError: Unknown name (listing the valid ones) or an unsupported shape.
    """
    cls = _lookup("critic", name, _CRITICS)
    with _seeded(seed):
        return cls(input_shape, **kwargs)
