"""Compute-phase counters: the seconds and images of each compute phase of a run.

The training and inference loops report their work to :func:`phase`::

    with profiling.phase("local_training") as tally:
        for x, y in batches(...):
            ...
            tally.add(len(y))

Counting is off unless :func:`enable` was called in this process; then a phase costs a
``perf_counter`` pair (and a CUDA synchronisation when CUDA is in use) per call, so a normal
run is unchanged. ``benchmarks/profile_phases.py`` enables it around an in-process run
(:mod:`fedgo_app.inprocess`: server and clients in one process) and compares each phase's
images per second with a bare PyTorch loop of the same model, batch size and thread count.

Phases are exclusive: the time of a phase that runs inside another (a validation pass inside
a distillation) is the inner phase's, not the outer one's. The phases reported today
(:data:`PHASES`) and what one "image" is in each:

- ``local_training``: a client's training sample, forward and backward (:func:`train_local`);
- ``teacher_logits``: a client model's forward pass on one view of one distillation image;
- ``ensemble_eval``: a client model's forward pass on one test image;
- ``distillation``: the server student's forward and backward pass on one image;
- ``server_eval``: the global model's forward pass on one test image;
- ``wgan_gp``: one real image of a critic step (with its generated partner and interpolate)
  of WGAN-GP training (:func:`~fedgo_flwr.gan.wgan_gp.train_wgan_gp`);
- ``discriminator_training``: one real image of a discriminator step (with its negative);
- ``discriminator_logits``: a client discriminator's forward pass on one view of one image.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch

PHASES = (
    "local_training",
    "teacher_logits",
    "ensemble_eval",
    "distillation",
    "server_eval",
    "wgan_gp",
    "discriminator_training",
    "discriminator_logits",
)


@dataclass
class PhaseCount:
    """What one phase did over a run: wall ``seconds`` (exclusive of nested phases),
    ``images`` (see the module docstring), ``calls``, the largest ``batch`` reported and the
    torch ``threads`` it last ran with."""

    seconds: float = 0.0
    images: int = 0
    calls: int = 0
    batch: int = 0
    threads: int = 0

    @property
    def images_per_second(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {**asdict(self), "images_per_second": self.images_per_second}


class Tally:
    """The images a running phase has done (:meth:`add` once per batch)."""

    __slots__ = ("batch", "images")

    def __init__(self, images: int = 0, batch: int = 0) -> None:
        self.images = images
        self.batch = batch

    def add(self, n: int, batches: int = 1) -> None:
        """``batches`` batches of ``n`` images each."""
        self.images += n * batches
        self.batch = max(self.batch, n)


_counts: dict[str, PhaseCount] | None = None
_nested: list[float] = []  # seconds spent in phases nested in each running phase


def enable() -> None:
    """Start counting in this process (from zero)."""
    global _counts
    _counts = {}
    _nested.clear()


def disable() -> dict[str, PhaseCount]:
    """Stop counting; return what was counted since :func:`enable`."""
    global _counts
    counts, _counts = _counts or {}, None
    return counts


def enabled() -> bool:
    return _counts is not None


def counts() -> dict[str, PhaseCount]:
    """What was counted so far (a copy)."""
    return {k: PhaseCount(**asdict(v)) for k, v in (_counts or {}).items()}


def peak_rss_mb() -> float | None:
    """This process's peak resident memory in MiB (``None`` where the OS does not say)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes / KiB


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


@contextmanager
def phase(name: str, images: int = 0, batch: int = 0) -> Iterator[Tally]:
    """Count the enclosed work as phase ``name``: ``images`` in batches of at most ``batch``
    up front, or ``tally.add(n)`` per batch. A no-op (apart from the tally) unless
    :func:`enable` was called."""
    tally = Tally(images, batch)
    if _counts is None:
        yield tally
        return
    _sync()
    _nested.append(0.0)
    start = time.perf_counter()
    try:
        yield tally
    finally:
        _sync()
        elapsed = time.perf_counter() - start
        inner = _nested.pop()
        if _nested:
            _nested[-1] += elapsed
        if _counts is not None:
            count = _counts.setdefault(name, PhaseCount())
            count.seconds += elapsed - inner
            count.images += tally.images
            count.calls += 1
            count.batch = max(count.batch, tally.batch)
            count.threads = torch.get_num_threads()
