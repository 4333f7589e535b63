"""FedGO's generators ``G(z)`` and their builder :func:`build_generator`.

FedGO (Jang, Park & Lee, ICML 2025) needs a generator ``G`` at the server in its pre-FL stage
(Sec. 3.2, App. D), trained against a WGAN-GP critic (:mod:`fedgo_flwr.gan.critics`; training in
:mod:`fedgo_flwr.gan.wgan_gp`). ``z ~ N(0, I)`` of size ``latent_dim``; images end in ``tanh``
so that samples lie in ``[-1, 1]`` like the normalised data (App. E.2 "Details for Dataset"):

* ``"dcgan"`` -- the DCGAN-style generator of the official WGAN-GP code ``gan_cifar.py``
  (github.com/igul222/improved_wgan_training, the implementation App. E.2 cites): ``Linear(z -> 4x4x
  4d)``, BN, ReLU, then 5x5 stride-2 transposed convolutions ``4d -> 2d -> d -> C`` with BN + ReLU
  between and ``tanh`` at the end. Default ``d = 64`` (the official file uses 128 with the comment
  "This overfits substantially; you're probably better off with 64"). Smaller images start from a
  smaller grid, see :func:`~fedgo_flwr.gan.common.upsampling_plan` (``(1, 8, 8)``:
  ``2x2x2d -> 4x4xd -> 8x8xC``).
* ``"resnet"`` -- the ResNet generator of ``gan_cifar_resnet.py`` (unconditional), which is what the
  paper actually trained: App. G.2 speaks of "the 100,000 steps required for training a
  ResNet-based generator and discriminator", the App. E.2 hyper-parameters (lr 2e-4, betas (0, 0.9),
  100k steps, 5 critic steps, batch 64) are exactly that file's, and its size at ``d = 128``
  (1,204,483 parameters; 4.60 MiB of parameters and buffers, a 4.62 MiB ``torch.save`` file)
  matches the "4.61MB" generator of App. G.
* ``"mlp"`` -- a ReLU MLP as in ``gan_toy.py`` for feature vectors ``(D,)`` (e.g. the 2-D toy of
  App. E.1) and a tiny fallback for any shape. For vectors the output is *linear* (no ``tanh``):
  feature data are not normalised to ``[-1, 1]`` by :func:`fedgo_flwr.data.batches` (the toy means
  sit at ``(±4, ±4)``), and ``gan_toy.py`` has no output non-linearity either.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedgo_flwr.gan.common import _as_shape, _image_shape, _lookup, _plan, _seeded

__all__ = [
    "GENERATOR_NAMES",
    "DCGANGenerator",
    "MLPGenerator",
    "ResNetGenerator",
    "build_generator",
]

GENERATOR_NAMES: tuple[str, ...] = ("dcgan", "resnet", "mlp")
"""Names accepted by :func:`build_generator`."""


class DCGANGenerator(nn.Module):
    """DCGAN-style generator of the official WGAN-GP ``gan_cifar.py`` (Gulrajani et al., 2017).

    ``z (N, latent_dim) -> Linear -> BN1d -> ReLU -> (c0, h0, w0)``, then ``n`` transposed
    convolutions (kernel 5, stride 2, doubling the grid); all but the last are followed by BN2d and
    ReLU and halve the channels (``c0 = width · 2^(n-1)``); the last maps to ``C`` channels and is
    followed by ``tanh``. ``n, h0, w0`` come from :func:`~fedgo_flwr.gan.common.upsampling_plan`:
    for ``(3, 32, 32)`` this is ``4x4x4d -> 8x8x2d -> 16x16xd -> 32x32x3``, for ``(1, 8, 8)``
    ``2x2x2d -> 4x4xd -> 8x8x1``.

    Args:
        latent_dim: Size of ``z``.
        output_shape: ``(C, H, W)``.
        width: ``d`` above (``DIM`` of ``gan_cifar.py``; default 64).
    """

    def __init__(self, latent_dim: int, output_shape: Sequence[int], width: int = 64) -> None:
        super().__init__()
        shape = _as_shape("generator", "dcgan", output_shape)
        c, _, _ = _image_shape("generator", "dcgan", shape)
        n, h0, w0 = _plan("generator", "dcgan", shape)
        self.latent_dim = int(latent_dim)
        self.output_shape = shape
        self._grid = (width * 2 ** (n - 1), h0, w0)
        units = self._grid[0] * h0 * w0
        self.project = nn.Sequential(
            nn.Linear(self.latent_dim, units), nn.BatchNorm1d(units), nn.ReLU(inplace=True)
        )
        layers: list[nn.Module] = []
        ch = self._grid[0]
        for _ in range(n - 1):
            layers += [
                nn.ConvTranspose2d(ch, ch // 2, 5, stride=2, padding=2, output_padding=1),
                nn.BatchNorm2d(ch // 2),
                nn.ReLU(inplace=True),
            ]
            ch //= 2
        layers += [nn.ConvTranspose2d(ch, c, 5, stride=2, padding=2, output_padding=1), nn.Tanh()]
        self.net = nn.Sequential(*layers)

    def forward(self, z: Tensor) -> Tensor:
        """Map ``z (N, latent_dim)`` to images ``(N, C, H, W)`` in ``[-1, 1]``."""
        return self.net(self.project(z).view(z.shape[0], *self._grid))


class _UpBlock(nn.Module):
    """Pre-activation residual block, 2x nearest upsampling (``ResidualBlock(resample='up')``)."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.shortcut = nn.Conv2d(cin, cout, 1)

    def forward(self, x: Tensor) -> Tensor:
        """Residual upsampling step; doubles height and width."""
        up = F.interpolate(x, scale_factor=2.0, mode="nearest")
        out = F.interpolate(F.relu(self.bn1(x)), scale_factor=2.0, mode="nearest")
        out = self.conv2(F.relu(self.bn2(self.conv1(out))))
        return self.shortcut(up) + out


class ResNetGenerator(nn.Module):
    """ResNet generator of the official ``gan_cifar_resnet.py`` (unconditional).

    ``Linear(z -> d·h0·w0)``, ``n`` residual up-blocks (BN, ReLU, upsample + 3x3 conv, BN, ReLU,
    3x3 conv; shortcut: upsample + 1x1 conv), BN, ReLU, 3x3 conv to ``C`` channels, ``tanh``. With
    ``width = 128`` on ``(3, 32, 32)`` this is the generator App. G.2 calls "ResNet-based" (1.20M
    parameters, 4.60 MiB). ``n, h0, w0`` from :func:`~fedgo_flwr.gan.common.upsampling_plan`.

    Args:
        latent_dim: Size of ``z`` (128 in the official code).
        output_shape: ``(C, H, W)``.
        width: Channels ``d`` of every block (``DIM_G``; default 128).
    """

    def __init__(self, latent_dim: int, output_shape: Sequence[int], width: int = 128) -> None:
        super().__init__()
        shape = _as_shape("generator", "resnet", output_shape)
        c, _, _ = _image_shape("generator", "resnet", shape)
        n, h0, w0 = _plan("generator", "resnet", shape)
        self.latent_dim = int(latent_dim)
        self.output_shape = shape
        self._grid = (width, h0, w0)
        self.project = nn.Linear(self.latent_dim, width * h0 * w0)
        self.blocks = nn.Sequential(*[_UpBlock(width, width) for _ in range(n)])
        self.out_bn = nn.BatchNorm2d(width)
        self.out_conv = nn.Conv2d(width, c, 3, padding=1)

    def forward(self, z: Tensor) -> Tensor:
        """Map ``z (N, latent_dim)`` to images ``(N, C, H, W)`` in ``[-1, 1]``."""
        x = self.blocks(self.project(z).view(z.shape[0], *self._grid))
        return torch.tanh(self.out_conv(F.relu(self.out_bn(x))))


class MLPGenerator(nn.Module):
    """ReLU MLP generator (``gan_toy.py`` style): ``depth`` hidden layers, then a linear map.

    Args:
        latent_dim: Size of ``z``.
        output_shape: Any sample shape; the output is reshaped to ``(N, *output_shape)``.
        hidden: Hidden units per layer.
        depth: Number of hidden ReLU layers (``gan_toy.py`` uses 3).
        out_activation: ``"tanh"``, ``"none"`` or ``"auto"`` (default): ``tanh`` for image shapes
            (data normalised to ``[-1, 1]``), none for feature vectors ``(D,)`` (un-normalised
            features such as the four-Gaussian toy, whose means lie at ``(±4, ±4)``).
    """

    def __init__(
        self,
        latent_dim: int,
        output_shape: Sequence[int],
        hidden: int = 128,
        depth: int = 3,
        out_activation: str = "auto",
    ) -> None:
        super().__init__()
        shape = _as_shape("generator", "mlp", output_shape)
        if out_activation not in ("auto", "tanh", "none"):
            raise ValueError(
                f"generator 'mlp': out_activation must be 'auto', 'tanh' or 'none', got "
                f"{out_activation!r}"
            )
        self.latent_dim = int(latent_dim)
        self.output_shape = shape
        self.tanh = out_activation == "tanh" or (out_activation == "auto" and len(shape) > 1)
        layers: list[nn.Module] = []
        fan_in = self.latent_dim
        for _ in range(depth):
            layers += [nn.Linear(fan_in, hidden), nn.ReLU(inplace=True)]
            fan_in = hidden
        layers.append(nn.Linear(fan_in, math.prod(shape)))
        self.net = nn.Sequential(*layers)

    def forward(self, z: Tensor) -> Tensor:
        """Map ``z (N, latent_dim)`` to ``(N, *output_shape)``."""
        out = self.net(z)
        if self.tanh:
            out = torch.tanh(out)
        return out.view(z.shape[0], *self.output_shape)


_GENERATORS: dict[str, type[nn.Module]] = {
    "dcgan": DCGANGenerator,
    "resnet": ResNetGenerator,
    "mlp": MLPGenerator,
}


def build_generator(
    name: str,
    latent_dim: int,
    output_shape: Sequence[int],
    *,
    seed: int | None = None,
    **kwargs: Any,
) -> nn.Module:
    """Build a generator ``G: (N, latent_dim) -> (N, *output_shape)``.

    Args:
        name: One of :data:`GENERATOR_NAMES` (``"dcgan"``, ``"resnet"``, ``"mlp"``).
        latent_dim: Size of the Gaussian latent code ``z``.
        output_shape: ``(C, H, W)`` for images or ``(D,)`` for feature vectors (``"mlp"`` only).
        seed: Seed the initial weights (forked RNG; the global RNG is untouched). ``None`` uses the
            global RNG.
        **kwargs: Model options (``width`` for ``dcgan``/``resnet``; ``hidden``, ``depth``,
            ``out_activation`` for ``mlp``).

    Returns:
        The module, with attributes ``latent_dim`` and ``output_shape``.

    Raises:
        ValueError: Unknown name (the message lists the valid ones), bad ``latent_dim``, or a shape
            the model cannot produce (the message names the model and the shape).
    """
    cls = _lookup("generator", name, _GENERATORS)
    if int(latent_dim) != latent_dim or latent_dim < 1:
        raise ValueError(f"generator {name!r}: latent_dim must be an int >= 1, got {latent_dim!r}")
    with _seeded(seed):
        return cls(int(latent_dim), output_shape, **kwargs)
