"""CPFL's stage-two distillation by hand (Sabella et al., CPFL, Sec. 3 eq. 3): the student is
trained with the L1 loss between its outputs and the combined teachers' logits."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.learning.cohorts import CohortDistillConfig, distill_l1


def test_one_l1_step_is_eq3_with_adam_by_hand() -> None:
    """One batch, one epoch: the reported loss is mean |f(x) - t| (eq. 3) and Adam's first
    step moves each parameter by lr * g / (|g| + eps), g the gradient of the mean absolute
    error, sign(f(x) - t) x / (N C) for a linear student."""
    rng = np.random.default_rng(0)
    n, d, c = 8, 3, 2
    data = ArrayDataset(x=rng.normal(size=(n, d)).astype(np.float32), y=np.zeros(n), num_classes=c)
    x = torch.as_tensor(data.x)
    targets = torch.as_tensor(rng.normal(size=(n, c)).astype(np.float32))
    torch.manual_seed(0)
    student = nn.Linear(d, c)
    w0, b0 = student.weight.detach().clone(), student.bias.detach().clone()
    out = x @ w0.T + b0
    sign = torch.sign(out - targets)
    g_w, g_b = sign.T @ x / (n * c), sign.sum(0) / (n * c)
    lr, eps = 0.1, 1e-8
    cfg = CohortDistillConfig(epochs=1, batch_size=n, lr=lr)
    result = distill_l1(
        student,
        data,
        targets,
        cfg,
        rng=torch.Generator().manual_seed(0),
        device=torch.device("cpu"),
    )
    assert result.steps == 1
    assert np.isclose(result.loss, float((out - targets).abs().mean()), rtol=1e-6)
    torch.testing.assert_close(student.weight.detach(), w0 - lr * g_w / (g_w.abs() + eps))
    torch.testing.assert_close(student.bias.detach(), b0 - lr * g_b / (g_b.abs() + eps))
