"""Tests for fedgo_flwr.data.partition (server share + per-class Dirichlet, per-client prior and
C-classes client splits)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fedgo_flwr.data.partition import (
    Partition,
    PartitionError,
    _deal,
    classes_partition,
    component_partition,
    dirichlet_partition,
    dirichlet_prior_partition,
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


# ------------------------------------------------------------------------------------------
# Co-Boosting's schemes: per-client Dirichlet priors (+ log-normal amounts), C classes each
# ------------------------------------------------------------------------------------------

NEW_SCHEMES = {
    "prior-0.05": lambda y, k, f, s: dirichlet_prior_partition(
        y, k, 0.05, server_fraction=f, seed=s
    ),
    "prior-1": lambda y, k, f, s: dirichlet_prior_partition(y, k, 1.0, server_fraction=f, seed=s),
    "prior-sigma": lambda y, k, f, s: dirichlet_prior_partition(
        y, k, 0.1, sigma=0.8, server_fraction=f, seed=s
    ),
    "classes-2": lambda y, k, f, s: classes_partition(y, k, 2, server_fraction=f, seed=s),
    "classes-3": lambda y, k, f, s: classes_partition(y, k, 3, server_fraction=f, seed=s),
    "classes-all": lambda y, k, f, s: classes_partition(y, k, 10, server_fraction=f, seed=s),
}


@pytest.mark.parametrize("scheme", NEW_SCHEMES.values(), ids=NEW_SCHEMES.keys())
@pytest.mark.parametrize("num_clients", [5, 10, 20])
@pytest.mark.parametrize("server_fraction", [0.0, 0.5])
def test_new_schemes_disjoint_cover_the_pool_and_keep_the_server_share(
    labels: np.ndarray, scheme, num_clients: int, server_fraction: float
) -> None:
    p = scheme(labels, num_clients, server_fraction, 3)
    assert p.num_clients == num_clients
    _check_disjoint_complete(p, labels.size)  # every client-pool sample is dealt, once
    reference = dirichlet_partition(
        labels, num_clients, 0.1, server_fraction=server_fraction, seed=3
    )
    assert np.array_equal(p.server, reference.server)


@pytest.mark.parametrize("scheme", NEW_SCHEMES.values(), ids=NEW_SCHEMES.keys())
def test_new_schemes_are_deterministic_per_seed(labels: np.ndarray, scheme) -> None:
    a, b, c = (scheme(labels, 10, 0.5, seed) for seed in (7, 7, 8))
    assert all(np.array_equal(x, y) for x, y in zip(a.clients, b.clients, strict=True))
    assert any(not np.array_equal(x, y) for x, y in zip(a.clients, c.clients, strict=True))


def _mean_top2_share(p: Partition, y: np.ndarray) -> float:
    h = p.histogram(y, NUM_CLASSES).astype(float)
    return float(np.mean(np.sort(h, axis=1)[:, -2:].sum(axis=1) / h.sum(axis=1)))


def test_dirichlet_prior_small_alpha_gives_few_classes_per_client(labels: np.ndarray) -> None:
    seeds = range(4)
    parts = {
        alpha: [dirichlet_prior_partition(labels, 10, alpha, seed=s) for s in seeds]
        for alpha in (0.05, 100.0)
    }
    top2 = {a: np.mean([_mean_top2_share(p, labels) for p in ps]) for a, ps in parts.items()}
    ent = {a: np.mean([_mean_entropy(p, labels) for p in ps]) for a, ps in parts.items()}
    # At alpha = 0.05 every client's prior is nearly one-hot, but equal amounts of ~1/K of the
    # pool each and classes that run out (several clients favour the same class) push part of
    # a client's samples to its next classes: two classes still hold ~80% of a client's data.
    # At alpha = 100 two classes hold little more than 2/10.
    assert top2[0.05] > 0.7
    assert top2[100.0] < 0.35
    assert ent[100.0] > 2.0 > 1.3 > ent[0.05]


def test_dirichlet_prior_sigma_zero_gives_equal_amounts(labels: np.ndarray) -> None:
    p = dirichlet_prior_partition(labels, 7, 0.1, sigma=0.0, seed=2)
    assert max(p.client_sizes) - min(p.client_sizes) <= 1
    # Amounts do not depend on the labels: the same for a tiny alpha as for a huge one.
    q = dirichlet_prior_partition(labels, 7, 1000.0, sigma=0.0, seed=2)
    assert p.client_sizes == q.client_sizes


@pytest.mark.parametrize("sigma", [0.4, 1.2])
def test_dirichlet_prior_sigma_spreads_amounts_log_normally(sigma: float) -> None:
    # 100 clients, 20k pool samples: the standard deviation of log(size) estimates sigma
    # (the rescaling to the pool size only shifts the logs) to within about 0.1.
    y = np.random.default_rng(0).integers(0, 10, size=20_000)
    p = dirichlet_prior_partition(y, 100, 1.0, sigma=sigma, server_fraction=0.0, seed=1)
    sizes = np.array(p.client_sizes)
    assert sizes.sum() == y.size
    spread = float(np.std(np.log(sizes), ddof=1))
    assert abs(spread - sigma) < 0.2, spread


def test_dirichlet_prior_min_size(labels: np.ndarray) -> None:
    # sigma = 1.5 over 20 clients: the first amount draws leave a client with fewer than 10
    # samples; the split is drawn again until none does.
    p = dirichlet_prior_partition(labels, 20, 0.1, sigma=1.5, seed=0, min_size=10)
    assert min(p.client_sizes) >= 10
    _check_disjoint_complete(p, labels.size)
    with pytest.raises(PartitionError, match=r"min_size=40.*max_retries=30") as info:
        dirichlet_prior_partition(labels, 20, 0.1, sigma=3.0, min_size=40, max_retries=30)
    assert info.value.argument == "min_size"


def test_deal_falls_back_when_a_prior_has_no_mass_left() -> None:
    # Client 1's prior is all on class 0, which client 0 and client 1 share: once class 0 is
    # used up client 1 takes class 1 (the authors' loop would spin forever here).
    pools = [np.array([0, 1]), np.array([2, 3, 4])]
    priors = np.array([[1.0, 0.0], [1.0, 0.0]])
    clients = _deal(pools, priors, np.array([1, 4]), np.random.default_rng(0))
    assert sorted(np.concatenate(clients).tolist()) == [0, 1, 2, 3, 4]
    assert clients[0].size == 1 and clients[1].size == 4


@pytest.mark.parametrize("num_clients", [3, 5, 10, 20])
@pytest.mark.parametrize("cpc", [1, 2, 3, 5])
def test_classes_gives_every_client_exactly_c_classes(
    labels: np.ndarray, num_clients: int, cpc: int
) -> None:
    if cpc * num_clients < NUM_CLASSES:
        with pytest.raises(PartitionError, match="some class would have no client"):
            classes_partition(labels, num_clients, cpc, seed=1)
        return
    p = classes_partition(labels, num_clients, cpc, seed=1)
    h = p.histogram(labels, NUM_CLASSES)
    assert ((h > 0).sum(axis=1) == cpc).all()
    assert ((h > 0).sum(axis=0) >= 1).all()  # every class has a holder
    pool = np.bincount(labels, minlength=NUM_CLASSES) - p.server_histogram(labels, NUM_CLASSES)
    for c in range(NUM_CLASSES):  # each class split evenly among its holders
        shares = h[h[:, c] > 0, c]
        assert shares.sum() == pool[c] and shares.max() - shares.min() <= 1
    if num_clients <= 5:  # the authors' fixed rule: consecutive classes
        for k in range(num_clients):
            assert set(np.flatnonzero(h[k])) == {(cpc * k + j) % NUM_CLASSES for j in range(cpc)}


def test_classes_assignment_is_random_for_more_than_five_clients(labels: np.ndarray) -> None:
    held = {
        tuple(map(tuple, classes_partition(labels, 10, 2, seed=s).histogram(labels, 10) > 0))
        for s in range(5)
    }
    assert len(held) == 5


def test_classes_refuses_impossible_settings(labels: np.ndarray) -> None:
    with pytest.raises(PartitionError, match="more than the 10 classes") as info:
        classes_partition(labels, 10, 11)
    assert info.value.argument == "classes_per_client"
    with pytest.raises(PartitionError, match=r"2 \* 4 < 10 classes") as info:
        classes_partition(labels, 4, 2)
    assert info.value.argument == "classes_per_client"
    # 20 clients, one class each: some class has three holders (~30 samples each).
    with pytest.raises(PartitionError, match=r"min_size=40.*had 30") as info:
        classes_partition(labels, 20, 1, min_size=40, max_retries=5)
    assert info.value.argument == "min_size"


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda y: classes_partition(y, 5, 0), "classes_per_client"),
        (lambda y: classes_partition(y, 5, 1.5), "classes_per_client"),
        (lambda y: dirichlet_prior_partition(y, 5, 0.1, sigma=-0.1), "sigma"),
        (lambda y: dirichlet_prior_partition(y, 5, 0.1, sigma=float("nan")), "sigma"),
        (lambda y: dirichlet_prior_partition(y, 5, 0.0), "alpha"),
        (lambda y: dirichlet_prior_partition(y, 0, 1.0), "num_clients"),
        (lambda y: dirichlet_prior_partition(y, 5, 1.0, min_size=-1), "min_size"),
        (lambda y: classes_partition(y, 5, 2, server_fraction=1.0), "server_fraction"),
    ],
)
def test_new_schemes_bad_args_raise(labels: np.ndarray, call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call(labels)


def test_dirichlet_min_size_failure_is_a_partition_error(labels: np.ndarray) -> None:
    with pytest.raises(PartitionError) as info:
        dirichlet_partition(labels, 100, 0.01, seed=0, min_size=5, max_retries=20)
    assert info.value.argument == "min_size"
