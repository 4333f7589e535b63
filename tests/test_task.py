"""Shared server/client glue: subsets, partitions and datasets agree between processes."""

from __future__ import annotations

import numpy as np

from fedgo_flwr.task import client_dataset, load_bundle, make_partition
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
