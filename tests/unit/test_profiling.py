"""The compute-phase counters (fedgo_flwr.runtime.profiling) and what the loops report to them."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from torch import nn

from fedgo_flwr.config.experiment import TrainConfig
from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.gan.sampling import discriminator_logits
from fedgo_flwr.learning.distill import DistillConfig, distill
from fedgo_flwr.learning.training import train_local
from fedgo_flwr.runtime import profiling
from fedgo_flwr.runtime.rng import make_rng

CPU = torch.device("cpu")


@pytest.fixture
def counting():
    profiling.enable()
    yield
    profiling.disable()


def _data(n: int = 21) -> ArrayDataset:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    return ArrayDataset(x=x, y=(x[:, 0] > 0).astype(np.int64), num_classes=2)


def test_off_by_default_counts_nothing():
    assert not profiling.enabled()
    with profiling.phase("local_training", 5) as tally:
        tally.add(3)
    assert tally.images == 8
    assert profiling.counts() == {}


def test_nested_phases_are_exclusive(counting):
    with profiling.phase("distillation") as outer:
        outer.add(64, batches=2)
        time.sleep(0.05)
        with profiling.phase("server_eval", 100, 50):
            time.sleep(0.1)
    counts = profiling.disable()
    assert counts["distillation"].images == 128 and counts["distillation"].batch == 64
    assert counts["server_eval"].images == 100 and counts["server_eval"].batch == 50
    assert counts["server_eval"].seconds >= 0.1
    # the outer phase's own time only: about 0.05 s, not the 0.15 s it enclosed
    assert 0.05 <= counts["distillation"].seconds < 0.15
    assert counts["distillation"].threads == torch.get_num_threads()


def test_loops_report_the_images_they_process(counting):
    data = _data()
    cfg = TrainConfig(local_epochs=3, batch_size=8, lr=0.1)
    train_local(nn.Linear(4, 2), data, cfg, rng=make_rng(0, 1), device=CPU)
    targets = torch.softmax(torch.randn(1, len(data), 2), dim=-1)
    distill(
        nn.Linear(4, 2),
        data,
        targets,
        DistillConfig(epochs=2, batch_size=8),
        server_round=1,
        rng=make_rng(0, 2),
        device=CPU,
    )
    discriminator_logits({0: nn.Linear(4, 1), 2: nn.Linear(4, 1)}, data, batch_size=16)
    counts = profiling.counts()
    # 21 samples at batch 8: 8 + 8 + 5 per epoch (no batch of one to drop)
    assert counts["local_training"].images == 3 * 21
    assert counts["local_training"].batch == 8
    assert counts["distillation"].images == 2 * 21
    assert counts["discriminator_logits"].images == 2 * 21  # two discriminators, one view
    assert all(c.seconds > 0 and c.calls == 1 for c in counts.values())


def test_forward_only_passes_run_at_the_gpu_inference_batch_on_cuda_only() -> None:
    from fedgo_flwr.runtime import kernels

    before = kernels.inference_batch(1, "cuda")
    try:
        kernels.use_gpu_inference_batch(512)
        assert kernels.inference_batch(64, "cpu") == 64  # CPU runs keep their batches
        assert kernels.inference_batch(64, torch.device("cuda")) == 512
        assert kernels.inference_batch(1024, "cuda:0") == 1024  # never lowered
        kernels.use_gpu_inference_batch(0)
        assert kernels.inference_batch(64, "cuda") == 64
    finally:
        kernels.use_gpu_inference_batch(before)
