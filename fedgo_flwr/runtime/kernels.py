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

:func:`inference_batch` is the batch of the forward-only passes (teacher logits, ensemble and
test evaluation, discriminator logits) on a GPU: at least ``resources.gpu_inference_batch``
(default 512). A GPU runs a ResNet-18 forward pass 2.4x faster at batch 512 than at 64 in
float32 (``benchmarks/README.md``, "The GPU against its own bare loops"); in eval mode a batch
holds no state, so only the order of float sums can differ. On a CPU the configured batch is
kept (64 is fastest there), so CPU runs are unchanged.
"""

from __future__ import annotations

import torch
from torch import nn

_channels_last = False

DEFAULT_GPU_INFERENCE_BATCH = 512
_gpu_inference_batch = DEFAULT_GPU_INFERENCE_BATCH


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


def use_gpu_inference_batch(batch: int) -> None:
    """Set the least batch of forward-only passes on a GPU (0: the configured batches)."""
    global _gpu_inference_batch
    _gpu_inference_batch = int(batch)


def inference_batch(batch: int, device: torch.device | str) -> int:
    """The batch a forward-only pass configured with ``batch`` runs at on ``device``: raised
    to :func:`use_gpu_inference_batch`'s value on CUDA, ``batch`` elsewhere."""
    if _gpu_inference_batch and torch.device(device).type == "cuda":
        return max(int(batch), _gpu_inference_batch)
    return batch
