"""What FedGO's generators, critics and discriminators share: shape checks, seeding, init, size.

The three kinds of network (:mod:`fedgo_flwr.gan.generators`, :mod:`fedgo_flwr.gan.critics`,
:mod:`fedgo_flwr.gan.discriminators`) check their shapes the same way (errors name the model and
the shape), plan their stride-2 stages with :func:`upsampling_plan`, and are built by name under
a seed: model initialisation can be seeded with ``seed=`` in the ``build_*`` functions (forked
RNG, the global state is left untouched). :func:`count_bytes` is the size of any of them on the
wire.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import nn

__all__ = [
    "count_bytes",
    "upsampling_plan",
]

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


def _lookup(kind: str, name: str, table: dict[str, type[nn.Module]]) -> type[nn.Module]:
    if not isinstance(name, str) or name.lower().strip() not in table:
        raise ValueError(f"unknown {kind} {name!r}; expected one of {list(table)}")
    return table[name.lower().strip()]


def count_bytes(module: nn.Module) -> int:
    """Bytes of all parameters and buffers (e.g. BN running statistics) of ``module``.

    The payload of a one-shot generator / discriminator transfer, for the communication overhead
    report of App. G ("the generator and discriminator models are 4.61MB and 2.53MB"; those figures
    are ``torch.save`` file sizes in MiB, which add a few KiB of pickle overhead to this count).
    """
    params = sum(p.numel() * p.element_size() for p in module.parameters())
    buffers = sum(b.numel() * b.element_size() for b in module.buffers())
    return int(params + buffers)
