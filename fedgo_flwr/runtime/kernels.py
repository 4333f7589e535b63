"""How models run on the device: memory format, inference batch, determinism and precision.

:func:`place` puts a model on its device; with ``resources.channels_last`` on, a model's 4-D
weights (its convolutions) are stored channels-last (NHWC) and PyTorch runs each convolution in
that format. Weights keep their values, so state dicts, messages and checkpoints are unchanged;
the results differ from NCHW's in the last bits of float32, so a run with it on is deterministic
per seed but not bit-identical to one with it off: hence a switch, off by default.

The switches are per process (like torch's thread count): the ServerApp sets them from the
config at the start of a run and the ClientApp for each message it handles.

:func:`inference_batch` is the batch of the forward-only passes (teacher logits, ensemble and
test evaluation, discriminator logits) on a GPU: at least ``resources.gpu_inference_batch``. In
eval mode a batch holds no state, so only the order of float sums can differ. On a CPU the
configured batch is kept, so CPU runs are unchanged.

:func:`use_deterministic` (``resources.deterministic``) asks PyTorch for its deterministic
kernels (cuDNN, cuBLAS with a fixed workspace, :func:`torch.use_deterministic_algorithms` in its
``warn_only`` mode: an operation without one warns and runs). On a CPU every kernel this project
uses is deterministic already; on a GPU the default cuDNN kernels are not. Off by default, as
PyTorch has it: deterministic kernels can be slower.

:func:`autocast` is the context of a classifier's forward pass and its loss: with
``resources.precision: bf16`` the matrix products and convolutions run in bfloat16 while the
weights, gradients and optimizer stay float32; with ``fp32``, the default, it is no context at
all. The generators', discriminators' and data-free synthesis's loops stay float32. Logits leave
a pass as float32. The measured speed-ups, repeats and costs, and why each loop keeps its
precision: ``docs/architecture.md`` ("How models run on the device").
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch
from torch import nn

from fedgo_flwr.config.names import PRECISIONS

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


CUBLAS_WORKSPACE = ":4096:8"
"""``CUBLAS_WORKSPACE_CONFIG`` for deterministic cuBLAS (CUDA >= 10.2; PyTorch's
"Reproducibility" notes); read when a process first uses cuBLAS, so it is set before that."""


def use_deterministic(on: bool) -> None:
    """Turn PyTorch's deterministic kernels on or off for this process (module docstring)."""
    on = bool(on)
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.backends.cudnn.deterministic = on
    torch.backends.cudnn.benchmark = False
    if on or not _deterministic_off():
        torch.use_deterministic_algorithms(on, warn_only=True)


def _deterministic_off() -> bool:
    """Whether deterministic algorithms are off already, in torch and in Inductor's config.

    :func:`torch.use_deterministic_algorithms` also sets ``torch._inductor.config``, and
    importing that module imports TorchDynamo: 4-5 s on a 2-core machine, in every process
    that calls it (the ServerApp, each Ray worker, each ClientApp process of a deployment).
    With the setting off (the default) and that module not imported, the call would change
    nothing: Inductor's config, once imported, starts off unless
    ``TORCHINDUCTOR_DETERMINISTIC=1`` says otherwise."""
    if torch.are_deterministic_algorithms_enabled():
        return False
    if "torch._inductor.config" in sys.modules:
        return not sys.modules["torch._inductor.config"].deterministic
    return os.environ.get("TORCHINDUCTOR_DETERMINISTIC") != "1"


def deterministic() -> bool:
    """Whether :func:`use_deterministic` is on."""
    return torch.are_deterministic_algorithms_enabled()


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
