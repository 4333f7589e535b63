"""FedGO's client discriminators and their builder :func:`build_discriminator`.

FedGO (Jang, Park & Lee, ICML 2025) trains one discriminator per client against the server's
generator in its pre-FL stage (Sec. 3.2, App. D; training in
:mod:`fedgo_flwr.gan.discriminator_training`) and weights client ``k`` by its odds.

Output contract of the client discriminators
--------------------------------------------
Every model returned by :func:`build_discriminator` maps ``(N, *input_shape)`` to **raw logits**
``z`` of shape ``(N,)`` -- no sigmoid. :mod:`fedgo_flwr.weighting` applies the squashing itself:
``D = sigmoid(z)`` (``disc_mode="sigmoid"``, Thm 2.1/3.6) or ``D = sigmoid(sigmoid(z))``
(``"double_sigmoid"``, the paper's implementation, App. E.2 "Model Implementation": "we employed a
composition of two sigmoid activations for the discriminator output. This ensures that the odds
value Φ_k for client k's discriminator D_k is constrained between 1 and e"). Training
(:func:`fedgo_flwr.gan.discriminator_training.train_discriminator`) uses a single sigmoid by
default; see its docstring for why.

Architectures
-------------
``"cnn4"`` (App. E.2: the 4-layer CNN of DCGAN-MNIST, bias-free; ``norm="none"`` by default,
``"batch"`` for the reference file's BatchNorm), ``"cnn_mlp"`` (App. F.7.3: two convolutions and
one linear layer), ``"resnet8"`` (App. F.7.3: a bias-free ResNet-8 with one logit) and ``"mlp"``
(App. E.1: 3 layers, for vectors; images are flattened). Each reproduces the parameter count of
FedGO's Table 14; how each was reconstructed: ``docs/architecture.md`` ("FedGO's client
discriminators").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from fedgo_flwr.gan.common import _LEAK, _as_shape, _dcgan_init, _image_shape, _lookup, _seeded

__all__ = [
    "DISCRIMINATOR_NAMES",
    "CNN4Discriminator",
    "CNNMLPDiscriminator",
    "MLPDiscriminator",
    "ResNet8Discriminator",
    "build_discriminator",
]

DISCRIMINATOR_NAMES: tuple[str, ...] = ("cnn4", "cnn_mlp", "resnet8", "mlp")
"""Names accepted by :func:`build_discriminator` (client discriminators, raw-logit output)."""


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


_DISCRIMINATORS: dict[str, type[nn.Module]] = {
    "cnn4": CNN4Discriminator,
    "cnn_mlp": CNNMLPDiscriminator,
    "resnet8": ResNet8Discriminator,
    "mlp": MLPDiscriminator,
}


def build_discriminator(
    name: str,
    input_shape: Sequence[int],
    *,
    seed: int | None = None,
    spectral_norm: bool = False,
    **kwargs: Any,
) -> nn.Module:
    """Build a client discriminator returning **raw logits** ``z`` of shape ``(N,)``.

    No sigmoid is applied inside the model.
    :func:`~fedgo_flwr.gan.discriminator_training.train_discriminator` trains ``z`` with
    ``BCEWithLogits`` and :mod:`fedgo_flwr.weighting` turns it into ``D = sigmoid(z)`` or the
    paper's ``D = sigmoid(sigmoid(z))`` (App. E.2), i.e. odds ``Φ = exp(z)`` or
    ``exp(sigmoid(z))``.

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
