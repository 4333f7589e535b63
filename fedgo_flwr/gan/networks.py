"""Generator, WGAN-GP critic and client-discriminator architectures of FedGO, and their builders.

FedGO (Jang, Park & Lee, ICML 2025) needs three kinds of network in its pre-FL stage (Sec. 3.2,
App. D): a generator ``G`` at the server (:func:`build_generator`), the WGAN-GP critic it is
trained against (:func:`build_critic`, server only; WGAN-GP = Gulrajani et al., 2017) and one
discriminator per client (:func:`build_discriminator`). How they are trained lives in
:mod:`fedgo_flwr.gan.training`.

Output contract of the client discriminators
--------------------------------------------
Every model returned by :func:`build_discriminator` maps ``(N, *input_shape)`` to **raw logits**
``z`` of shape ``(N,)`` -- no sigmoid. :mod:`fedgo_flwr.weighting` applies the squashing itself:
``D = sigmoid(z)`` (``disc_mode="sigmoid"``, Thm 2.1/3.6) or ``D = sigmoid(sigmoid(z))``
(``"double_sigmoid"``, the paper's implementation, App. E.2 "Model Implementation": "we employed a
composition of two sigmoid activations for the discriminator output. This ensures that the odds
value Φ_k for client k's discriminator D_k is constrained between 1 and e"). Training
(:func:`fedgo_flwr.gan.training.train_discriminator`) uses a single sigmoid by default; see its
docstring for why.

Architectures (where each one comes from)
-----------------------------------------
Generators (``G(z)``, ``z ~ N(0, I)`` of size ``latent_dim``; images end in ``tanh`` so that samples
lie in ``[-1, 1]`` like the normalised data, App. E.2 "Details for Dataset"):

* ``"dcgan"`` -- the DCGAN-style generator of the official WGAN-GP code ``gan_cifar.py``
  (github.com/igul222/improved_wgan_training, the implementation App. E.2 cites): ``Linear(z -> 4x4x
  4d)``, BN, ReLU, then 5x5 stride-2 transposed convolutions ``4d -> 2d -> d -> C`` with BN + ReLU
  between and ``tanh`` at the end. Default ``d = 64`` (the official file uses 128 with the comment
  "This overfits substantially; you're probably better off with 64"). Smaller images start from a
  smaller grid, see :func:`upsampling_plan` (``(1, 8, 8)``: ``2x2x2d -> 4x4xd -> 8x8xC``).
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

WGAN-GP critics (server only; never sent to clients; raw scores ``(N,)``): ``"dcgan"`` (the
``gan_cifar.py`` critic: 5x5 stride-2 convolutions ``C -> d -> 2d -> 4d``, LeakyReLU(0.2), linear
head; no BatchNorm as Gulrajani et al. require for the gradient penalty, optional
``norm="layer"``), ``"resnet"`` (the ``gan_cifar_resnet.py`` critic, no normalisation) and
``"mlp"``.

Client discriminators (App. E.2: "a simple 4-layer CNN discriminator, following the implementation
from github.com/Ksuryateja/DCGAN-MNIST-pytorch/blob/master/gan_mnist.py"; App. F.7.3 variants):

* ``"cnn4"`` -- ``Conv(C->64, 4, s2, p1)``, LReLU(0.2), ``Conv(64->128, 4, s2, p1)``, LReLU,
  ``Conv(128->256, 4, s2, p1)``, LReLU, ``Conv(256->1)`` over the remaining grid (4x4 for 32x32
  inputs), all without bias. Table 14 lists 662,528 parameters and 17.6 MFLOPs: that is *exactly*
  the four bias-free convolution kernels (3·64·16 + 64·128·16 + 128·256·16 + 256·16), so the
  reported model carries no BatchNorm parameters although the cited ``gan_mnist.py`` has BN after
  the 2nd and 3rd convolution. Default ``norm="none"`` reproduces Table 14; ``norm="batch"`` gives
  the reference file's BN. (``gan_mnist.py``'s last ``Conv(256->1, 4, s2, p1)`` would leave a 2x2
  map on 32x32 inputs; a valid convolution over the 4x4 grid has the same 4,096 weights and yields

Model initialisation can be seeded with ``seed=`` in the ``build_*`` functions (forked RNG, the
global state is left untouched).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "CRITIC_NAMES",
    "DISCRIMINATOR_NAMES",
    "GENERATOR_NAMES",
    "CNN4Discriminator",
    "CNNMLPDiscriminator",
    "DCGANCritic",
    "DCGANGenerator",
    "MLPCritic",
    "MLPDiscriminator",
    "MLPGenerator",
    "ResNet8Discriminator",
    "ResNetCritic",
    "ResNetGenerator",
    "build_critic",
    "build_discriminator",
    "build_generator",
    "count_bytes",
    "upsampling_plan",
]

GENERATOR_NAMES: tuple[str, ...] = ("dcgan", "resnet", "mlp")
"""Names accepted by :func:`build_generator`."""

CRITIC_NAMES: tuple[str, ...] = ("dcgan", "resnet", "mlp")
"""Names accepted by :func:`build_critic` (WGAN-GP critics, server side)."""

DISCRIMINATOR_NAMES: tuple[str, ...] = ("cnn4", "cnn_mlp", "resnet8", "mlp")
"""Names accepted by :func:`build_discriminator` (client discriminators, raw-logit output)."""


_LEAK = 0.2  # LeakyReLU slope of DCGAN discriminators / WGAN-GP critics


# ------------------------------------------------------------------------------------------
# Shape helpers
# ------------------------------------------------------------------------------------------


def _as_shape(kind: str, name: str, shape: Sequence[int]) -> tuple[int, ...]:
    """``shape`` as a tuple of positive ints, else ``ValueError`` naming the model."""
    try:
        out = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise ValueError(
            f"{kind} {name!r}: shape must be a sequence of ints, got {shape!r}"
        ) from None
    if not out or any(s < 1 for s in out) or any(int(s) != s for s in shape):
        raise ValueError(f"{kind} {name!r}: shape must contain positive ints, got {shape!r}")
    return out


def _image_shape(kind: str, name: str, shape: tuple[int, ...]) -> tuple[int, int, int]:
    """Return ``(C, H, W)`` or raise ``ValueError`` naming the model and the shape."""
    if len(shape) != 3:
        raise ValueError(
            f"{kind} {name!r} needs an image shape (C, H, W), got {shape}; use 'mlp' for "
            "feature vectors (D,)"
        )
    return shape[0], shape[1], shape[2]


def upsampling_plan(height: int, width: int) -> tuple[int, int, int]:
    """How many stride-2 stages an image generator/critic uses, and the coarsest grid.

    Returns ``(n, h0, w0)`` with ``height = h0 · 2^n`` and ``width = w0 · 2^n``: ``n`` is the
    largest value in ``1..4`` such that ``2^n`` divides both sides and the coarsest grid is at least
    4x4 (or at least 2x2 when ``min(height, width) < 16``). Examples: 32x32 -> 3 stages from 4x4
    (exactly the ``gan_cifar.py`` / ``gan_cifar_resnet.py`` layout), 64x64 -> 4 from 4x4
    (``gan_64x64.py``), 28x28 -> 2 from 7x7, 8x8 (scikit-learn digits) -> 2 from 2x2.

    Raises:
        ValueError: no such ``n`` (e.g. an odd side, or a side below 4).
    """
    min_grid = 4 if min(height, width) >= 16 else 2
    best = 0
    for n in range(1, 5):
        f = 2**n
        if height % f == 0 and width % f == 0 and min(height, width) // f >= min_grid:
            best = n
    if best == 0:
        raise ValueError(
            f"image side(s) {height}x{width} cannot be reached by stride-2 stages from a grid of "
            f"at least {min_grid}x{min_grid}; both sides must be even and >= {2 * min_grid}"
        )
    return best, height >> best, width >> best


@contextlib.contextmanager
def _seeded(seed: int | None) -> Iterator[None]:
    """Run the body with the CPU RNG seeded by ``seed`` (forked: global state is restored)."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        yield


def _plan(kind: str, name: str, shape: tuple[int, ...]) -> tuple[int, int, int]:
    """:func:`upsampling_plan` for a model; errors name the model and the shape."""
    try:
        return upsampling_plan(shape[1], shape[2])
    except ValueError as err:
        raise ValueError(
            f"{kind} {name!r} cannot handle input/output shape {shape}: {err}"
        ) from None


def _dcgan_init(module: nn.Module) -> None:
    """DCGAN initialisation (``gan_mnist.py``): weights ``N(0, 0.02)``, BN ``N(1, 0.02)`` and 0."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d | nn.ConvTranspose2d | nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.normal_(m.weight, 1.0, 0.02)
            nn.init.zeros_(m.bias)


# ------------------------------------------------------------------------------------------
# Generators
# ------------------------------------------------------------------------------------------


class DCGANGenerator(nn.Module):
    """DCGAN-style generator of the official WGAN-GP ``gan_cifar.py`` (Gulrajani et al., 2017).

    ``z (N, latent_dim) -> Linear -> BN1d -> ReLU -> (c0, h0, w0)``, then ``n`` transposed
    convolutions (kernel 5, stride 2, doubling the grid); all but the last are followed by BN2d and
    ReLU and halve the channels (``c0 = width · 2^(n-1)``); the last maps to ``C`` channels and is
    followed by ``tanh``. ``n, h0, w0`` come from :func:`upsampling_plan`: for ``(3, 32, 32)`` this
    is ``4x4x4d -> 8x8x2d -> 16x16xd -> 32x32x3``, for ``(1, 8, 8)`` ``2x2x2d -> 4x4xd -> 8x8x1``.

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
    parameters, 4.60 MiB). ``n, h0, w0`` from :func:`upsampling_plan`.

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


# ------------------------------------------------------------------------------------------
# WGAN-GP critics (server side)
# ------------------------------------------------------------------------------------------


class DCGANCritic(nn.Module):
    """WGAN-GP critic of ``gan_cifar.py``: stride-2 5x5 convolutions and LeakyReLU(0.2), no BN.

    Channels ``C -> d -> 2d -> 4d`` for 32x32 (``n`` stages from :func:`upsampling_plan`, mirroring
    :class:`DCGANGenerator`), then flatten and ``Linear(-> 1)``. Gulrajani et al. (2017, Sec. 4)
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
    global mean-pool, ``Linear(d -> 1)``; ``n`` from :func:`upsampling_plan` (32x32: 32 -> 16 -> 8,
    as in the official file; 8x8: 8 -> 4).

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


# ------------------------------------------------------------------------------------------
# Client discriminators (raw logits z; sigmoid / double sigmoid are applied by the caller)
# ------------------------------------------------------------------------------------------


def _conv_out(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def _disc_norm(name: str, norm: str) -> None:
    if norm not in ("none", "batch"):
        raise ValueError(f"discriminator {name!r}: norm must be 'none' or 'batch', got {norm!r}")


def _disc_geometry(
    name: str, input_shape: Sequence[int], norm: str, downsamples: int
) -> tuple[tuple[int, ...], int, int, int]:
    """Validate a conv discriminator's input; return ``(shape, C, H', W')`` after the
    ``downsamples`` stride-2 4x4 convolutions."""
    shape = _as_shape("discriminator", name, input_shape)
    c, h, w = _image_shape("discriminator", name, shape)
    _disc_norm(name, norm)
    for _ in range(downsamples):
        h, w = _conv_out(h, 4, 2, 1), _conv_out(w, 4, 2, 1)
    if h < 1 or w < 1:
        need = 2**downsamples
        raise ValueError(f"discriminator {name!r} needs H, W >= {need}, got input_shape {shape}")
    return shape, c, h, w


def _dcgan_trunk(c: int, width: int, norm: str) -> list[nn.Module]:
    """The first two bias-free DCGAN convolutions shared by ``cnn4`` and ``cnn_mlp``."""
    return [
        nn.Conv2d(c, width, 4, 2, 1, bias=False),
        nn.LeakyReLU(_LEAK, inplace=True),
        nn.Conv2d(width, width * 2, 4, 2, 1, bias=False),
        nn.BatchNorm2d(width * 2) if norm == "batch" else nn.Identity(),
        nn.LeakyReLU(_LEAK, inplace=True),
    ]


class CNN4Discriminator(nn.Module):
    """FedGO's default client discriminator, the "simple 4-layer CNN" (App. E.2, App. F.7.3 "CNN").

    ``Conv(C->d, 4, s2, p1)``, LReLU(0.2), ``Conv(d->2d, 4, s2, p1)``, [BN], LReLU,
    ``Conv(2d->4d, 4, s2, p1)``, [BN], LReLU, ``Conv(4d->1)`` with a kernel covering the remaining
    grid (4x4 for 32x32, 1x1 for 8x8); no biases (as ``gan_mnist.py``), DCGAN ``N(0, 0.02)`` init.
    With ``d = 64``, ``norm="none"`` on ``(3, 32, 32)`` it has exactly the 662,528 parameters of
    Table 14. Output: raw logits ``z`` of shape ``(N,)``.

    Args:
        input_shape: ``(C, H, W)`` with ``H, W >= 8``.
        width: ``d`` (``ndf``; default 64).
        norm: ``"none"`` (default; Table 14's parameter count) or ``"batch"`` (``gan_mnist.py``).
    """

    def __init__(self, input_shape: Sequence[int], width: int = 64, norm: str = "none") -> None:
        super().__init__()
        shape, c, h, w = _disc_geometry("cnn4", input_shape, norm, 3)
        self.input_shape = shape
        self.net = nn.Sequential(
            *_dcgan_trunk(c, width, norm),
            nn.Conv2d(width * 2, width * 4, 4, 2, 1, bias=False),
            nn.BatchNorm2d(width * 4) if norm == "batch" else nn.Identity(),
            nn.LeakyReLU(_LEAK, inplace=True),
            nn.Conv2d(width * 4, 1, (h, w), 1, 0, bias=False),
        )
        _dcgan_init(self)

    def forward(self, x: Tensor) -> Tensor:
        """Raw logits ``z (N,)``; ``D = sigmoid(z)`` or ``sigmoid(sigmoid(z))`` downstream."""
        return self.net(x).view(-1)


class CNNMLPDiscriminator(nn.Module):
    """App. F.7.3 "CNN+MLP": the CNN with its last two convolutions replaced by one linear layer.

    ``Conv(C->d, 4, s2, p1)``, LReLU, ``Conv(d->2d, 4, s2, p1)``, [BN], LReLU, flatten,
    ``Linear(2d·H/4·W/4 -> 1)``; bias-free, DCGAN init. ``d = 64`` on ``(3, 32, 32)`` gives Table
    14's 142,336 parameters. Output: raw logits ``(N,)``.

    Args:
        input_shape: ``(C, H, W)`` with ``H, W >= 4``.
        width: ``d`` (default 64).
        norm: ``"none"`` (default) or ``"batch"``.
    """

    def __init__(self, input_shape: Sequence[int], width: int = 64, norm: str = "none") -> None:
        super().__init__()
        shape, c, h, w = _disc_geometry("cnn_mlp", input_shape, norm, 2)
        self.input_shape = shape
        self.features = nn.Sequential(*_dcgan_trunk(c, width, norm))
        self.head = nn.Linear(width * 2 * h * w, 1, bias=False)
        _dcgan_init(self)

    def forward(self, x: Tensor) -> Tensor:
        """Raw logits ``z (N,)``."""
        return self.head(self.features(x).flatten(1)).view(-1)


class _BasicBlock(nn.Module):
    """ResNet BasicBlock (two 3x3 convs, projection shortcut when the shape changes), bias-free."""

    def __init__(self, cin: int, cout: int, stride: int, norm: str) -> None:
        super().__init__()
        bn = norm == "batch"
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1: nn.Module = nn.BatchNorm2d(cout) if bn else nn.Identity()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2: nn.Module = nn.BatchNorm2d(cout) if bn else nn.Identity()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False),
                nn.BatchNorm2d(cout) if bn else nn.Identity(),
            )

    def forward(self, x: Tensor) -> Tensor:
        """``act(bn2(conv2(act(bn1(conv1 x)))) + shortcut(x))``."""
        out = F.leaky_relu(self.bn1(self.conv1(x)), _LEAK)
        out = self.bn2(self.conv2(out))
        return F.leaky_relu(out + self.shortcut(x), _LEAK)


class ResNet8Discriminator(nn.Module):
    """App. F.7.3 "ResNet": a discriminator "based on ResNet-8, an 8-layer residual network".

    3x3 stem ``C -> d`` (stride 1), three BasicBlocks ``d, 2d, 4d`` of stride 2 (with 1x1 projection
    shortcuts), flatten, ``Linear(4d·H/8·W/8 -> 1)``: 1 + 3·2 + 1 = 8 weight layers. Bias-free and,
    by default, without normalisation; LeakyReLU(0.2). The paper gives no layer list; this is the
    configuration that reproduces Table 14 (1,230,528 parameters exactly and 51.06 MMACs against
    "51.1 MFLOPs") for ``d = 64`` on ``(3, 32, 32)``. Output: raw logits ``(N,)``.

    Args:
        input_shape: ``(C, H, W)``.
        width: ``d`` (default 64).
        norm: ``"none"`` (default) or ``"batch"``.
    """

    def __init__(self, input_shape: Sequence[int], width: int = 64, norm: str = "none") -> None:
        super().__init__()
        shape = _as_shape("discriminator", "resnet8", input_shape)
        c, h, w = _image_shape("discriminator", "resnet8", shape)
        _disc_norm("resnet8", norm)
        if h < 8 or w < 8:
            raise ValueError(f"discriminator 'resnet8' needs H, W >= 8, got input_shape {shape}")
        self.input_shape = shape
        self.stem = nn.Conv2d(c, width, 3, 1, 1, bias=False)
        self.stem_bn: nn.Module = nn.BatchNorm2d(width) if norm == "batch" else nn.Identity()
        self.blocks = nn.Sequential(
            _BasicBlock(width, width, 2, norm),
            _BasicBlock(width, width * 2, 2, norm),
            _BasicBlock(width * 2, width * 4, 2, norm),
        )
        for _ in range(3):
            h, w = _conv_out(h, 3, 2, 1), _conv_out(w, 3, 2, 1)
        self.head = nn.Linear(width * 4 * h * w, 1, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """Raw logits ``z (N,)``."""
        out = F.leaky_relu(self.stem_bn(self.stem(x)), _LEAK)
        return self.head(self.blocks(out).flatten(1)).view(-1)


class MLPDiscriminator(nn.Module):
    """3-layer LeakyReLU MLP discriminator (App. E.1: "a 3-layer discriminator"); flattens inputs.

    ``Linear(D -> h)``, LReLU(0.2), ``Linear(h -> h)``, LReLU, ``Linear(h -> 1)``. Output: raw
    logits ``(N,)``.

    Args:
        input_shape: Any sample shape (``(D,)`` for feature vectors).
        hidden: Hidden units ``h`` (default 128).
    """

    def __init__(self, input_shape: Sequence[int], hidden: int = 128) -> None:
        super().__init__()
        shape = _as_shape("discriminator", "mlp", input_shape)
        self.input_shape = shape
        self.net = nn.Sequential(
            nn.Linear(math.prod(shape), hidden),
            nn.LeakyReLU(_LEAK, inplace=True),
            nn.Linear(hidden, hidden),
            nn.LeakyReLU(_LEAK, inplace=True),
            nn.Linear(hidden, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        """Raw logits ``z (N,)``."""
        return self.net(x.flatten(1)).view(-1)


# ------------------------------------------------------------------------------------------
# Builders
# ------------------------------------------------------------------------------------------

_GENERATORS: dict[str, type[nn.Module]] = {
    "dcgan": DCGANGenerator,
    "resnet": ResNetGenerator,
    "mlp": MLPGenerator,
}
_CRITICS: dict[str, type[nn.Module]] = {
    "dcgan": DCGANCritic,
    "resnet": ResNetCritic,
    "mlp": MLPCritic,
}
_DISCRIMINATORS: dict[str, type[nn.Module]] = {
    "cnn4": CNN4Discriminator,
    "cnn_mlp": CNNMLPDiscriminator,
    "resnet8": ResNet8Discriminator,
    "mlp": MLPDiscriminator,
}


def _lookup(kind: str, name: str, table: dict[str, type[nn.Module]]) -> type[nn.Module]:
    if not isinstance(name, str) or name.lower().strip() not in table:
        raise ValueError(f"unknown {kind} {name!r}; expected one of {list(table)}")
    return table[name.lower().strip()]


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


def build_discriminator(
    name: str,
    input_shape: Sequence[int],
    *,
    seed: int | None = None,
    spectral_norm: bool = False,
    **kwargs: Any,
) -> nn.Module:
    """Build a client discriminator returning **raw logits** ``z`` of shape ``(N,)``.

    No sigmoid is applied inside the model. :func:`~fedgo_flwr.gan.training.train_discriminator`
    trains ``z`` with ``BCEWithLogits`` and :mod:`fedgo_flwr.weighting` turns it into
    ``D = sigmoid(z)`` or the paper's ``D = sigmoid(sigmoid(z))`` (App. E.2), i.e. odds
    ``Φ = exp(z)`` or ``exp(sigmoid(z))``.

    Args:
        name: One of :data:`DISCRIMINATOR_NAMES`: ``"cnn4"`` (paper default, App. E.2),
            ``"cnn_mlp"``, ``"resnet8"`` (App. F.7.3) or ``"mlp"`` (vectors; flattens images).
        input_shape: ``(C, H, W)`` for the convolutional models; anything for ``"mlp"``.
        seed: Seed the initial weights (forked RNG).
        spectral_norm: Wrap every convolution and linear layer in spectral normalisation
            (Miyato et al., ICLR 2018; ``torch.nn.utils.parametrizations.spectral_norm``, one
            power iteration per training forward pass). Not in FedGO: a regulariser that bounds
            the discriminator's Lipschitz constant, so its logits cannot grow without bound on
            a few hundred local images (saturated odds carry no weighting information).
        **kwargs: Model options (``width``, ``norm`` for the CNNs; ``hidden`` for ``mlp``).

    Raises:
        ValueError: Unknown name (listing the valid ones), or a shape the model cannot take, e.g.
            ``"cnn4"`` with ``(2,)`` (the message names the model and the shape).
    """
    cls = _lookup("discriminator", name, _DISCRIMINATORS)
    with _seeded(seed):
        model = cls(input_shape, **kwargs)
        if spectral_norm:
            for module in list(model.modules()):
                if isinstance(module, (nn.Conv2d, nn.Linear)):
                    nn.utils.parametrizations.spectral_norm(module)
        return model


# ------------------------------------------------------------------------------------------
# Utilities
# ------------------------------------------------------------------------------------------


def count_bytes(module: nn.Module) -> int:
    """Bytes of all parameters and buffers (e.g. BN running statistics) of ``module``.

    The payload of a one-shot generator / discriminator transfer, for the communication overhead
    report of App. G ("the generator and discriminator models are 4.61MB and 2.53MB"; those figures
    are ``torch.save`` file sizes in MiB, which add a few KiB of pickle overhead to this count).
    """
    params = sum(p.numel() * p.element_size() for p in module.parameters())
    buffers = sum(b.numel() * b.element_size() for b in module.buffers())
    return int(params + buffers)
