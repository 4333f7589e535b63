"""How models run on the device: the channels-last memory format (``resources.channels_last``).

On this project's CPU machine a convolution in channels-last (NHWC) format runs 1.2-1.6x
faster than in PyTorch's default NCHW for the CIFAR models, for training and inference alike
(``benchmarks/kernel_variants.py``; figures in ``benchmarks/README.md``, "Performance"). The
results differ from NCHW's in the last bits of float32 (about 1e-7 on a logit), so a run with
it on is deterministic per seed but not bit-identical to one with it off; training amplifies
the difference over rounds. It is therefore a switch: ``resources.channels_last``.

Every loop that trains or runs a model puts it on its device with :func:`place`. With the
switch on, a model's 4-D weights (its convolutions) are stored channels-last; PyTorch then runs
each convolution channels-last (it converts an NCHW input batch itself) and the activations
stay in that format. Weights keep their values, so state dicts, messages and checkpoints are
unchanged. Models without 4-D weights (MLPs) are left as they are.

The switch is per process (like torch's thread count): the ServerApp sets it from the config
at the start of a run and the ClientApp for each message it handles.
"""

from __future__ import annotations

import torch
from torch import nn

_channels_last = False


def use_channels_last(on: bool) -> None:
    """Turn the channels-last format on or off for the models :func:`place` puts."""
    global _channels_last
    _channels_last = bool(on)


def channels_last() -> bool:
    """Whether :func:`place` puts models in channels-last format."""
    return _channels_last


def place(model: nn.Module, device: torch.device | str) -> nn.Module:
    """``model`` on ``device`` (in place, and returned), channels-last when that is on and the
    model has 4-D weights, else in the contiguous (NCHW) format."""
    model.to(device)
    if any(p.dim() == 4 for p in model.parameters()):
        fmt = torch.channels_last if _channels_last else torch.contiguous_format
        model.to(memory_format=fmt)
    return model
