"""Shared server/client glue: subsets, partitions and datasets agree between processes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedgo_flwr.config.experiment import ConfigError
from fedgo_flwr.learning.task import client_dataset, load_bundle, make_partition
from strategies import load_experiment


def test_train_subset_shrinks_train_only_and_partition_covers_it():
    full = load_bundle(load_experiment(None, []).data)
    cfg = load_experiment(None, ["data.train_subset=600", "seed=3"])
    bundle = load_bundle(cfg.data)
    assert len(bundle.train) == 600 and len(bundle.test) == len(full.test)
    part = make_partition(cfg)
    covered = np.concatenate([part.server, *part.clients])
    assert sorted(covered.tolist()) == list(range(600))
    sizes = [len(client_dataset(cfg, k)) for k in range(cfg.data.num_clients)]
    assert sum(sizes) + len(part.server) == 600


def test_test_subset_is_stratified_and_leaves_training_alone():
    full = load_bundle(load_experiment(None, []).data)
    base = make_partition(load_experiment(None, ["seed=3"]))
    cfg = load_experiment(None, ["data.test_subset=100", "seed=3"])
    bundle = load_bundle(cfg.data)
    assert len(bundle.test) == 100 and len(bundle.train) == len(full.train)
    # every class keeps its share (digits: 10 classes, about 36 test images each)
    assert np.bincount(bundle.test.y, minlength=10).tolist() == [10] * 10
    assert [c.tolist() for c in make_partition(cfg).clients] == [c.tolist() for c in base.clients]
    with pytest.raises(ConfigError, match="test_subset"):
        load_experiment(None, ["data.test_subset=0"])


def _clients(overrides: list[str]) -> list[list[int]]:
    return [c.tolist() for c in make_partition(load_experiment(None, overrides)).clients]


def test_partition_cache_tells_the_schemes_apart():
    # The per-process cache is keyed by every partition key: changing only data.partition,
    # data.quantity_sigma or data.classes_per_client gives another split.
    base = ["data.num_clients=10", "seed=2"]
    prior = [*base, "data.partition=dirichlet_prior"]
    splits = [
        _clients(base),
        _clients(prior),
        _clients([*prior, "data.quantity_sigma=0.8"]),
        _clients([*base, "data.partition=classes", "data.classes_per_client=2"]),
        _clients([*base, "data.partition=classes", "data.classes_per_client=3"]),
    ]
    assert all(a != b for i, a in enumerate(splits) for b in splits[i + 1 :])
    assert _clients(base) == splits[0]  # and the same keys give the same split


def test_partition_problems_name_the_data_key():
    # The config check knows the digits' 10 classes (their registry entry); the split checks
    # the labels themselves (what it has for imagefolder and hf: datasets).
    with pytest.raises(ConfigError, match="more than the 10 classes of digits"):
        load_experiment(None, ["data.partition=classes", "data.classes_per_client=11"])
    cfg = load_experiment(None, ["data.partition=classes", "data.classes_per_client=10"])
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, classes_per_client=11))
    with pytest.raises(ConfigError, match="more than the 10 classes of the labels") as info:
        make_partition(cfg)
    assert info.value.key == "data.classes_per_client"
    cfg = load_experiment(None, ["data.alpha=0.001", "data.min_client_size=20"])
    with pytest.raises(ConfigError, match="could not draw a Dirichlet") as info:
        make_partition(cfg)
    assert info.value.key == "data.min_client_size"


def test_the_partition_and_the_subsets_read_one_load_of_the_dataset(monkeypatch) -> None:
    """A process loads its dataset once: the partition (training labels only) and a run's
    test subset read the same copy instead of loading the tree a second time."""
    from fedgo_flwr.learning import task

    calls: list[str] = []
    real = task.load_dataset

    def counting(name, **kwargs):
        calls.append(name)
        return real(name, **kwargs)

    monkeypatch.setattr(task, "load_dataset", counting)
    task._load_whole.cache_clear()
    task._load_bundle.cache_clear()
    task._partition.cache_clear()
    cfg = load_experiment(None, ["data.test_subset=100"])
    make_partition(cfg)
    bundle = load_bundle(cfg.data)
    assert len(bundle.test) == 100
    assert calls == [cfg.data.dataset]
