"""The features that enter a classifier's output layer, read during a forward pass.

FedUV's uniformity term, FedTGP's prototypes and DaFKD's discriminator head work on the
penultimate representation of the classifier (the input of its last linear layer: FedUV's
``pro1``, FedTGP's ``model.base`` output). Every model of :mod:`fedgo_flwr.models.classifiers` ends
in one ``nn.Linear`` whose output is the model's output; :class:`FeatureTap` hooks that layer, so no
model needs a second forward method. A model whose output is not its last ``nn.Linear``'s
output is refused when the features are read (never silently wrong).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["FeatureTap", "output_layer"]


def output_layer(model: nn.Module) -> nn.Linear:
    """The last ``nn.Linear`` registered in ``model`` (``ValueError`` if it has none)."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError(
            f"{type(model).__name__} has no nn.Linear output layer to read features at"
        )
    return linears[-1]


class FeatureTap:
    """Keeps the input of ``model``'s output layer from its latest forward pass.

    Use as a context manager (the hook is removed on exit)::

        with FeatureTap(model) as tap:
            logits = model(x)
            z = tap.read(logits)  # (B, d), in the autograd graph
    """

    def __init__(self, model: nn.Module):
        self.model_name = type(model).__name__
        self.layer = output_layer(model)
        self._input: torch.Tensor | None = None
        self._output: torch.Tensor | None = None
        self._handle = self.layer.register_forward_hook(self._hook)

    def _hook(self, module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> None:
        self._input, self._output = args[0], output

    def read(self, logits: torch.Tensor) -> torch.Tensor:
        """The features of the forward pass that returned ``logits``."""
        if self._output is None or self._output is not logits:
            raise ValueError(
                f"{self.model_name}: its output is not the output of its last nn.Linear, so the "
                "features that enter the classifier cannot be read (FeatureTap)"
            )
        return self._input  # type: ignore[return-value]

    def close(self) -> None:
        self._handle.remove()
        self._input = self._output = None

    def __enter__(self) -> FeatureTap:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
