"""Tests for fedgo_flwr.partition (server share + per-class Dirichlet client split)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fedgo_flwr.partition import (
    Partition,
    component_partition,
    dirichlet_partition,
    iid_partition,
)

NUM_CLASSES = 10


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    """Digits-like labels: 1797 samples over 10 slightly unbalanced classes."""
    rng = np.random.default_rng(1234)
    return rng.integers(0, NUM_CLASSES, size=1797).astype(np.int64)


def _check_disjoint_complete(p: Partition, n: int) -> None:
    parts = [p.server, *p.clients]
    for a in parts:
        assert a.dtype == np.int64
        assert np.all(np.diff(a) > 0), "index arrays must be sorted and unique"
    allidx = np.concatenate(parts)
    assert allidx.size == n, "server and clients must not overlap"
    assert np.array_equal(np.sort(allidx), np.arange(n)), "server and clients must cover everything"


@pytest.mark.parametrize("alpha", [0.05, 0.5, 100.0])
@pytest.mark.parametrize("server_fraction", [0.0, 0.3, 0.5])
def test_disjoint_and_complete(labels: np.ndarray, alpha: float, server_fraction: float) -> None:
    p = dirichlet_partition(labels, 10, alpha, server_fraction=server_fraction, seed=3)
    assert p.num_clients == 10
    _check_disjoint_complete(p, labels.size)


@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.5, 0.9])
def test_server_takes_floor_fraction_of_each_class(fraction: float) -> None:
    counts = [7, 13, 20, 1, 40]
    y = np.random.default_rng(0).permutation(np.repeat(np.arange(5), counts))
    p = dirichlet_partition(y, 3, 1.0, server_fraction=fraction, seed=1)
    got = np.bincount(y[p.server], minlength=5)
    expected = [math.floor(fraction * c + 1e-9) for c in counts]
    assert got.tolist() == expected
    assert p.server_histogram(y, 5).tolist() == expected
    _check_disjoint_complete(p, y.size)


def test_default_server_fraction_is_half_of_each_class(labels: np.ndarray) -> None:
    p = dirichlet_partition(labels, 20, 0.1, seed=0)
    assert np.array_equal(
        np.bincount(labels[p.server], minlength=NUM_CLASSES),
        np.bincount(labels, minlength=NUM_CLASSES) // 2,
    )


def test_deterministic(labels: np.ndarray) -> None:
    a = dirichlet_partition(labels, 20, 0.1, seed=7)
    b = dirichlet_partition(labels.copy(), 20, 0.1, seed=7)
    assert np.array_equal(a.server, b.server)
    assert all(np.array_equal(x, y) for x, y in zip(a.clients, b.clients, strict=True))
    c = dirichlet_partition(labels, 20, 0.1, seed=8)
    assert not np.array_equal(a.server, c.server)
    assert any(not np.array_equal(x, y) for x, y in zip(a.clients, c.clients, strict=True))


def test_server_share_independent_of_alpha_and_scheme(labels: np.ndarray) -> None:
    a = dirichlet_partition(labels, 10, 0.05, seed=4)
    b = dirichlet_partition(labels, 10, 50.0, seed=4)
    c = iid_partition(labels, 10, seed=4)
    assert np.array_equal(a.server, b.server)
    assert np.array_equal(a.server, c.server)


def _mean_max_share(p: Partition, y: np.ndarray) -> float:
    h = p.histogram(y, NUM_CLASSES).astype(float)
    return float(np.mean(h.max(axis=1) / h.sum(axis=1)))


def _mean_entropy(p: Partition, y: np.ndarray) -> float:
    h = p.histogram(y, NUM_CLASSES).astype(float)
    q = h / h.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.where(q > 0, q * np.log(q), 0.0).sum(axis=1)
    return float(ent.mean())


def test_smaller_alpha_is_more_skewed(labels: np.ndarray) -> None:
    seeds = range(5)
    skew = {
        alpha: [dirichlet_partition(labels, 10, alpha, seed=s) for s in seeds]
        for alpha in (0.05, 100.0)
    }
    share = {a: np.mean([_mean_max_share(p, labels) for p in ps]) for a, ps in skew.items()}
    ent = {a: np.mean([_mean_entropy(p, labels) for p in ps]) for a, ps in skew.items()}
    # alpha = 0.05: clients are dominated by one or two classes; alpha = 100: close to uniform.
    assert share[0.05] > 0.6
    assert share[100.0] < 0.25
    assert share[0.05] - share[100.0] > 0.4
    assert ent[100.0] > 2.0 > 1.0 > ent[0.05]
    # IID control is as balanced as alpha = 100.
    iid = np.mean([_mean_max_share(iid_partition(labels, 10, seed=s), labels) for s in seeds])
    assert iid < 0.25


def test_min_size_honoured(labels: np.ndarray) -> None:
    for seed in range(3):
        p = dirichlet_partition(labels, 20, 0.1, seed=seed, min_size=15)
        assert min(p.client_sizes) >= 15
        _check_disjoint_complete(p, labels.size)


def test_impossible_min_size_raises_informative_error(labels: np.ndarray) -> None:
    with pytest.raises(ValueError, match=r"alpha is too small or there are too many clients") as ei:
        dirichlet_partition(labels, 100, 0.01, seed=0, min_size=5, max_retries=20)
    msg = str(ei.value)
    assert "100 clients" in msg and "alpha=0.01" in msg and "max_retries=20" in msg
    # More clients * min_size than pool samples: rejected before any draw.
    with pytest.raises(ValueError, match="fewer than num_clients"):
        dirichlet_partition(labels[:40], 30, 1.0, min_size=1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_clients": 0}, "num_clients"),
        ({"num_clients": 2.5}, "num_clients"),
        ({"alpha": 0.0}, "alpha"),
        ({"alpha": -1.0}, "alpha"),
        ({"alpha": float("nan")}, "alpha"),
        ({"server_fraction": 1.0}, "server_fraction"),
        ({"server_fraction": -0.1}, "server_fraction"),
        ({"min_size": -1}, "min_size"),
        ({"max_retries": 0}, "max_retries"),
    ],
)
def test_bad_args_raise(labels: np.ndarray, kwargs: dict, match: str) -> None:
    args = {"num_clients": 5, "alpha": 0.5} | kwargs
    with pytest.raises(ValueError, match=match):
        dirichlet_partition(labels, **args)


def test_bad_labels_raise() -> None:
    with pytest.raises(ValueError, match="empty"):
        dirichlet_partition(np.array([], dtype=np.int64), 2, 1.0)
    with pytest.raises(ValueError, match="1-D"):
        dirichlet_partition(np.zeros((4, 2), dtype=np.int64), 2, 1.0)
    with pytest.raises(ValueError, match=">= 0"):
        dirichlet_partition(np.array([0, 1, -1, 2]), 2, 1.0)
    with pytest.raises(ValueError, match="integers"):
        dirichlet_partition(np.array([0.5, 1.0]), 2, 1.0)
    with pytest.raises(ValueError, match="num_clients"):
        iid_partition(np.arange(10), 0)


def test_histogram_and_json(labels: np.ndarray) -> None:
    p = dirichlet_partition(labels, 8, 0.3, seed=2)
    h = p.histogram(labels, NUM_CLASSES)
    assert h.shape == (8, NUM_CLASSES)
    assert h.sum(axis=1).tolist() == p.client_sizes
    assert (h.sum(axis=0) + p.server_histogram(labels, NUM_CLASSES)).tolist() == np.bincount(
        labels, minlength=NUM_CLASSES
    ).tolist()
    js = p.to_json(labels, NUM_CLASSES)
    assert set(js) == {
        "num_clients",
        "server_size",
        "client_sizes",
        "class_histogram",
        "server_histogram",
    }
    assert js["num_clients"] == 8
    assert js["server_size"] == p.server.size
    assert js["class_histogram"] == h.tolist()
    assert json.loads(json.dumps(js)) == js  # plain Python types only
    with pytest.raises(ValueError, match="out of range"):
        p.histogram(labels, 5)


def test_iid_partition_balanced(labels: np.ndarray) -> None:
    p = iid_partition(labels, 7, server_fraction=0.5, seed=1)
    _check_disjoint_complete(p, labels.size)
    assert max(p.client_sizes) - min(p.client_sizes) <= 1
    q = iid_partition(labels, 7, server_fraction=0.5, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(p.clients, q.clients, strict=True))


def test_component_partition_matches_toy_example() -> None:
    comp = np.repeat(np.arange(4), 300)
    owners = (2, 3, 1, 0)
    p = component_partition(comp, major_share=0.9, owners=owners, seed=0)
    assert p.server.size == 0
    _check_disjoint_complete(p, comp.size)
    h = p.histogram(comp, 4)
    for k, own in enumerate(owners):
        assert h[k, own] == 270
        assert all(h[k, j] == 10 for j in range(4) if j != own)
    with pytest.raises(ValueError, match="permutation"):
        component_partition(comp, owners=(0, 0, 1, 2))
