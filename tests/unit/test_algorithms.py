"""Update maths of FedAvg, FedProx and SCAFFOLD on toy problems (no Flower runtime)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from clients.fedprox import proximal_term
from clients.scaffold import scaffold_client_update
from fedgo_flwr.config.experiment import TrainConfig
from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.learning.aggregation import check_arrays, weighted_average
from fedgo_flwr.learning.task import sample_clients
from fedgo_flwr.learning.training import train_local
from fedgo_flwr.runtime.rng import make_rng


def test_weighted_average_matches_hand_computation_and_keeps_dtypes():
    a = {"w": np.array([1.0, 2.0], np.float32), "n": np.array(10, np.int64)}
    b = {"w": np.array([3.0, 6.0], np.float32), "n": np.array(20, np.int64)}
    out = weighted_average([a, b], [1, 3])
    np.testing.assert_allclose(out["w"], [2.5, 5.0])
    assert out["w"].dtype == np.float32 and out["n"].dtype == np.int64 and out["n"] == 18
    # 0-d buffers (BatchNorm's num_batches_tracked) stay arrays that torch can load.
    assert isinstance(out["n"], np.ndarray) and torch.from_numpy(out["n"]).item() == 18
    with pytest.raises(ValueError):
        weighted_average([a, b], [0, 0])


def test_check_arrays_rejects_shape_keys_and_nan():
    ref = {"w": np.zeros((2, 3), np.float32)}
    assert check_arrays({"w": np.ones((2, 3), np.float32)}, ref) is None
    assert "shape" in check_arrays({"w": np.ones((3, 2), np.float32)}, ref)
    assert "keys differ" in check_arrays({"v": np.ones((2, 3), np.float32)}, ref)
    assert "non-finite" in check_arrays({"w": np.full((2, 3), np.nan, np.float32)}, ref)


def test_proximal_term_value_and_gradient():
    model = nn.Linear(3, 1)
    anchor = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        model.weight.add_(1.0)  # move 3 weights by 1
    mu = 0.2
    term = proximal_term(anchor, mu)(model)
    assert term.item() == pytest.approx(0.5 * mu * 3)
    term.backward()
    # d/dw mu/2 ||w - w0||^2 = mu (w - w0)
    torch.testing.assert_close(model.weight.grad, torch.full_like(model.weight, mu))
    assert torch.count_nonzero(model.bias.grad) == 0


def _toy_data(n: int = 64, seed: int = 0) -> ArrayDataset:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    return ArrayDataset(x=x, y=y, num_classes=2)


def test_fedprox_large_mu_keeps_model_near_global():
    data = _toy_data()
    cfg = TrainConfig(local_epochs=5, batch_size=8, lr=0.1)
    drift = {}
    for mu in (0.0, 10.0):
        torch.manual_seed(0)
        model = nn.Linear(2, 2)
        anchor = [p.detach().clone() for p in model.parameters()]
        reg = proximal_term(anchor, mu) if mu else None
        train_local(
            model,
            data,
            cfg,
            rng=make_rng(0),
            device=torch.device("cpu"),
            regularizer=reg,
        )
        drift[mu] = sum(
            (p - a).norm() ** 2 for p, a in zip(model.parameters(), anchor, strict=True)
        ).item()
    assert drift[10.0] < 0.2 * drift[0.0]


def test_scaffold_option_two_update():
    c_i = {"w": torch.tensor([0.5, 0.0])}
    c = {"w": torch.tensor([0.1, 0.2])}
    x = {"w": torch.tensor([1.0, 1.0])}
    y = {"w": torch.tensor([0.0, 2.0])}
    new, delta = scaffold_client_update(c_i, c, x, y, steps=4, lr=0.5)
    # c_i+ = c_i - c + (x - y) / (K lr) = [0.5-0.1+0.5, 0-0.2-0.5]
    torch.testing.assert_close(new["w"], torch.tensor([0.9, -0.7]))
    torch.testing.assert_close(delta["w"], new["w"] - c_i["w"])


def test_scaffold_with_exact_controls_removes_client_drift():
    """On quadratics f_i(w) = 0.5 ||w - a_i||^2, with c_i = grad f_i(x) and c = mean, every
    corrected local step follows the global gradient, so all clients land on the same point."""
    anchors = [torch.tensor([1.0, 0.0]), torch.tensor([-1.0, 2.0])]
    x = torch.tensor([0.0, 0.0])
    grads = [x - a for a in anchors]
    c = sum(grads) / 2
    finals = []
    for a, c_i in zip(anchors, grads, strict=True):
        w = x.clone()
        for _ in range(10):
            w = w - 0.1 * ((w - a) - c_i + c)
        finals.append(w)
    torch.testing.assert_close(finals[0], finals[1])
    plain = []
    for a in anchors:
        w = x.clone()
        for _ in range(10):
            w = w - 0.1 * (w - a)
        plain.append(w)
    assert (plain[0] - plain[1]).norm() > 1.0


def test_sampling_is_seeded_and_strategy_independent():
    a = [sample_clients(3, r, 20, 8) for r in range(1, 6)]
    b = [sample_clients(3, r, 20, 8) for r in range(1, 6)]
    assert a == b
    assert all(len(s) == 8 and len(set(s)) == 8 and max(s) < 20 for s in a)
    assert len({tuple(s) for s in a}) > 1  # rounds differ
    assert a != [sample_clients(4, r, 20, 8) for r in range(1, 6)]


def test_local_training_is_reproducible():
    data = _toy_data()
    cfg = TrainConfig(local_epochs=2, batch_size=8, lr=0.1)
    outs = []
    for _ in range(2):
        torch.manual_seed(1)
        model = nn.Linear(2, 2)
        train_local(model, data, cfg, rng=make_rng(7, 1, 3), device=torch.device("cpu"))
        outs.append(model.weight.detach().clone())
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
