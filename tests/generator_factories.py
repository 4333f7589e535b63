"""Generator factories for ``strategy.generator.module`` in the tests (FedGO's G2 with any
``nn.Module``; see :mod:`fedgo_flwr.gan.external`).

Importable as ``generator_factories:<name>`` while pytest runs (``tests/`` is on ``sys.path``, as
for ``helpers``) and as ``tests/generator_factories.py:<name>`` (the file form) from anywhere.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class TinyGenerator(nn.Module):
    """``tanh(Linear(z))`` reshaped to ``shape``: the smallest generator of the contract."""

    def __init__(self, latent_dim: int, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.shape = tuple(shape)
        self.net = nn.Linear(latent_dim, math.prod(self.shape))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(z)).view(z.shape[0], *self.shape)


def factory(*, latent_dim: int, shape: tuple[int, ...]) -> nn.Module:
    """A right generator: ``(n, latent_dim) -> (n, *shape)`` in ``[-1, 1]``."""
    return TinyGenerator(latent_dim, shape)


def wrong_shape(*, latent_dim: int, shape: tuple[int, ...]) -> nn.Module:
    """Images twice as large as the classifier's input."""
    c, h, w = shape
    return TinyGenerator(latent_dim, (c, 2 * h, 2 * w))


def not_a_module(*, latent_dim: int, shape: tuple[int, ...]) -> object:
    return "a generator"


def broken(*, latent_dim: int, shape: tuple[int, ...]) -> nn.Module:
    raise RuntimeError("no weights here")


NOT_CALLABLE = 42
