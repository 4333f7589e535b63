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

:func:`autocast` is the context of a classifier's forward pass and its loss (local training,
teacher and test logits, distillation, CPFL's L1 distillation): with ``resources.precision:
bf16`` PyTorch's autocast runs the matrix products and convolutions in bfloat16 while the
weights, their gradients and the optimizer stay float32 (mixed precision); with ``fp32``, the
default, it is no context at all. On an H200 bfloat16 with channels-last ran the forward-only
phases 2.2x faster than float32 at batch 512, local training 1.13x
(``benchmarks/README.md``, "The GPU against its own bare loops"). The generators',
discriminators' and data-free synthesis's loops stay float32: there bfloat16 was slower (WGAN-GP's
gradient penalty, a second back-propagation: 0.69x; discriminator training 0.67x at batch 256),
and DeepInversion's batch-norm statistics loss compares small differences of means. Logits
leave a pass as float32 (``.float()``), so what a pass returns has one dtype either way.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from fedgo_flwr.experiment.names import PRECISIONS

_channels_last = False
_precision = "fp32"

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


def use_precision(name: str) -> None:
    """Set the precision of the classifiers' passes (``resources.precision``)."""
    if name not in PRECISIONS:
        raise ValueError(f"precision {name!r}: choose one of {', '.join(PRECISIONS)}")
    global _precision
    _precision = name


def precision() -> str:
    """The precision :func:`autocast` applies: ``fp32`` or ``bf16``."""
    return _precision


def autocast(device: torch.device | str) -> contextlib.AbstractContextManager:
    """The context of a classifier's forward pass and loss on ``device``: bfloat16 autocast
    with :func:`use_precision` ``bf16``, else none (float32 runs are left as they are)."""
    if _precision == "bf16":
        return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
