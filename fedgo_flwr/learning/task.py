"""Glue shared by the ServerApp and the ClientApp: data, partition, model and client sampling.

Server and clients derive the same partition independently from the experiment config (same
dataset, seed and ``data.`` partition keys), so no data or index list is ever sent over the
network. Loaded datasets and partitions are cached per process: a simulated ClientApp worker
loads them once per run.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import torch
from torch import nn

from fedgo_flwr.config.experiment import DataConfig, ExperimentConfig
from fedgo_flwr.config.schema import Checker
from fedgo_flwr.data import ArrayDataset, DataBundle, load_dataset, stratified_subset
from fedgo_flwr.data.partition import (
    Partition,
    PartitionError,
    classes_partition,
    dirichlet_partition,
    dirichlet_prior_partition,
)
from fedgo_flwr.models.classifiers import build_model
from fedgo_flwr.runtime.rng import derive_seed


@functools.lru_cache(maxsize=2)
def _load_whole(dataset: str, path: str | None, download: bool) -> DataBundle:
    """The whole dataset, loaded once per process: the partition (which needs only the training
    labels) and the run's subsets all read this one copy."""
    return load_dataset(dataset, path=path, download=download)


@functools.lru_cache(maxsize=4)
def _load_bundle(
    dataset: str,
    path: str | None,
    download: bool,
    train_subset: int | None,
    test_subset: int | None = None,
) -> DataBundle:
    bundle = _load_whole(dataset, path, download)
    if train_subset is not None and train_subset < len(bundle.train):
        idx = stratified_subset(bundle.train.y, train_subset)
        bundle = dataclasses.replace(bundle, train=bundle.train.subset(idx))
    if test_subset is not None and test_subset < len(bundle.test):
        idx = stratified_subset(bundle.test.y, test_subset)
        bundle = dataclasses.replace(bundle, test=bundle.test.subset(idx))
    return bundle


def load_bundle(data: DataConfig, path_override: str | None = None) -> DataBundle:
    """The dataset of ``data`` (cached per process). ``path_override``: a node's own data path."""
    return _load_bundle(
        data.dataset, path_override or data.path, data.download, data.train_subset, data.test_subset
    )


@functools.lru_cache(maxsize=8)
def _partition(
    dataset: str,
    path: str | None,
    download: bool,
    train_subset: int | None,
    num_clients: int,
    alpha: float,
    server_fraction: float,
    min_size: int,
    seed: int,
    scheme: str,
    quantity_sigma: float,
    classes_per_client: int | None,
) -> Partition:
    y = _load_bundle(dataset, path, download, train_subset).train.y
    common = {"server_fraction": server_fraction, "seed": seed, "min_size": min_size}
    if scheme == "dirichlet":
        return dirichlet_partition(y, num_clients=num_clients, alpha=alpha, **common)
    if scheme == "dirichlet_prior":
        return dirichlet_prior_partition(y, num_clients, alpha, sigma=quantity_sigma, **common)
    if scheme == "classes":
        return classes_partition(y, num_clients, int(classes_per_client or 0), **common)
    raise ValueError(f"unknown partition scheme {scheme!r}")  # pragma: no cover - config checks


PARTITION_KEYS = {"min_size": "min_client_size", "classes_per_client": "classes_per_client"}
"""The ``data.`` key behind each argument a :class:`PartitionError` can name."""


def make_partition(cfg: ExperimentConfig, path_override: str | None = None) -> Partition:
    """The experiment's partition; it depends only on data settings and ``seed``.

    Raises:
        ConfigError: no split exists for these settings (or none was found), naming the
            ``data.`` key to change (``min_client_size``, ``classes_per_client``).
    """
    d = cfg.data
    try:
        return _partition(
            d.dataset,
            path_override or d.path,
            d.download,
            d.train_subset,
            d.num_clients,
            d.alpha,
            d.server_fraction,
            d.min_client_size,
            cfg.seed,
            d.partition,
            d.quantity_sigma,
            d.classes_per_client,
        )
    except PartitionError as exc:
        key = PARTITION_KEYS.get(exc.argument, "partition")
        checker = Checker(cfg.strategy.sources).at("data.", d)
        checker.fail(key, f"no data.partition: {d.partition} split of {d.dataset}: {exc}")


def client_dataset(
    cfg: ExperimentConfig, partition_id: int, path_override: str | None = None
) -> ArrayDataset:
    """The local training set of client ``partition_id``."""
    if not 0 <= partition_id < cfg.data.num_clients:
        raise ValueError(
            f"partition-id {partition_id} is outside 0..{cfg.data.num_clients - 1} "
            f"(data.num_clients = {cfg.data.num_clients})"
        )
    bundle = load_bundle(cfg.data, path_override)
    return bundle.train.subset(make_partition(cfg, path_override).clients[partition_id])


def new_model(cfg: ExperimentConfig, bundle: DataBundle, name: str | None = None) -> nn.Module:
    """The experiment's model (``model.name``), or architecture ``name``, initialised
    deterministically from ``cfg.seed`` (it seeds torch's global generator, as it always has).

    ``model.name`` is seeded by ``(seed, "model-init")``; any other architecture by
    ``(seed, "model-init", name)``, so every client of one architecture starts from the same
    weights.
    """
    name = cfg.model.name if name is None else name
    keys: tuple[str, ...] = ("model-init",) if name == cfg.model.name else ("model-init", name)
    torch.manual_seed(derive_seed(cfg.seed, *keys))
    return build_model(name, bundle.train.input_shape, bundle.train.num_classes)


def client_model_name(cfg: ExperimentConfig, partition_id: int) -> str:
    """The architecture client ``partition_id`` trains: ``model.client_models`` repeated over
    the partition ids (client ``k`` gets entry ``k % len``), or ``model.name`` if it is empty."""
    names = cfg.model.client_models
    return names[partition_id % len(names)] if names else cfg.model.name


def heterogeneous_models(cfg: ExperimentConfig) -> bool:
    """Whether some client trains an architecture other than ``model.name``."""
    return any(name != cfg.model.name for name in cfg.model.client_models)


def new_client_model(cfg: ExperimentConfig, bundle: DataBundle, partition_id: int) -> nn.Module:
    """Client ``partition_id``'s model (:func:`client_model_name`), seeded by :func:`new_model`."""
    return new_model(cfg, bundle, client_model_name(cfg, partition_id))


def check_model_inputs(cfg: ExperimentConfig, bundle: DataBundle, c: Checker) -> None:
    """Refuse (``ConfigError`` naming ``model.name`` or ``model.client_models[i]``) an
    architecture that cannot take the dataset's inputs, e.g. a ResNet on 2-D vectors.

    The models are built on PyTorch's ``meta`` device: shapes only, no memory, no RNG draws.
    """
    shape, classes = bundle.train.input_shape, bundle.train.num_classes
    named = [("name", cfg.model.name)]
    named += [(f"client_models[{i}]", name) for i, name in enumerate(cfg.model.client_models)]
    problems: dict[str, str | None] = {}
    at = c.at("model.", cfg.model)
    for key, name in named:
        if name not in problems:
            problems[name] = None
            try:
                with torch.device("meta"):
                    build_model(name, shape, classes)
            except ValueError as exc:
                problems[name] = str(exc)
        if problems[name] is not None:
            at.fail(key, f"cannot take the inputs of {bundle.name}: {problems[name]}", name)


def sample_clients(seed: int, server_round: int, num_clients: int, per_round: int) -> list[int]:
    """Partition ids trained in ``server_round``: a seeded draw without replacement.

    It depends only on ``(seed, round, K, m)``, so every strategy sees the same clients in the
    same round (Flower's own ``sample_nodes`` uses the unseeded ``random`` module).
    """
    rng = np.random.default_rng(derive_seed(seed, "sampling", server_round))
    return sorted(rng.choice(num_clients, size=min(per_round, num_clients), replace=False).tolist())
