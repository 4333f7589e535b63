"""FedDisco: aggregation weights from data size and label-distribution discrepancy.

Ye et al., "FedDisco: Federated Learning with Discrepancy-Aware Collaboration", ICML 2023. Local
training is FedAvg's (``clients/fedavg.py``); the server averages the round's models with

    p_k = ReLU(n_k - a * d_k + b) / sum_{i in S} ReLU(n_i - a * d_i + b)

where n_k = N_k / sum_{i in S} N_i is the client's relative data size among the round's
sampled clients S, d_k the discrepancy between its label distribution N_{k,c} / N_k and a
target distribution T, ``a`` the weight of the discrepancy and ``b`` a baseline that keeps
small, balanced clients in the average (:func:`disco_weights`). FedGO (paper 001, App. E.2) ran
a = 0.5, b = 0.1, the values FedDisco tuned for CIFAR-10.

The details follow the authors' code (``MediaBrain-SJTU/FedDisco``; ``docs/design/peers.md`` §2
and §8): d_k is KL(D_k || T) by default (``metric``), normalised over the round's clients
(``normalise_discrepancy``), T the uniform distribution (``target``); where every ReLU is 0 the
round falls back to n_k weights (``fallback: data_size``) and says so in the log. The server
computes d_k from its own partition's class counts, as it computes n_k (never a client's claim).
The weights are computed over the sampled clients when the round starts; if some fail, the
survivors' weights are renormalised among themselves. ``strategy.aggregation.rule: median`` /
``trimmed_mean`` take FedDisco's weights (:mod:`fedgo_flwr.learning.weighted_rules`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid
from flwr.supercore import log

from fedgo_flwr.config.schema import Checker
from fedgo_flwr.learning.aggregation import new_average
from fedgo_flwr.learning.weighted_rules import new_weighted_average
from strategies.base import BaseConfig, Reply
from strategies.fedavg import FedAvg

METRICS = ("kl", "l1", "l2", "cosine")
TARGETS = ("uniform", "clients")
FALLBACKS = ("data_size", "error")


@dataclass
class FedDiscoConfig(BaseConfig):
    """``a`` (weight of the discrepancy), ``b`` (baseline), ``metric``, ``target``,
    ``normalise_discrepancy`` (null: true for ``kl``, as the authors' code) and ``fallback``
    (``data_size``: n_k weights when every ReLU is 0; ``error``: stop the run)."""

    a: float = 0.5
    b: float = 0.1
    metric: str = "kl"
    target: str = "uniform"
    normalise_discrepancy: bool | None = None
    fallback: str = "data_size"

    def check(self, c: Checker) -> None:
        for key in ("a", "b"):
            value = getattr(self, key)
            c.require(key, math.isfinite(value) and value >= 0, "must be a finite number >= 0")
        c.choice("metric", METRICS)
        c.choice("target", TARGETS)
        c.choice("fallback", FALLBACKS)


def discrepancy(counts: np.ndarray, target: np.ndarray, metric: str = "kl") -> np.ndarray:
    """d_k between each row's label distribution (``counts``: (K, C)) and ``target`` (C,).

    ``kl``: KL(D_k || T) = sum_c D_kc log(D_kc / T_c) (0 log 0 = 0); ``l1`` / ``l2``: the norm
    of D_k - T; ``cosine``: 1 - cos(D_k, T).
    """
    counts = np.asarray(counts, dtype=np.float64)
    dist = counts / counts.sum(axis=1, keepdims=True)
    t = np.asarray(target, dtype=np.float64)
    t = t / t.sum()
    if metric == "kl":
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(dist > 0, dist * np.log(dist / t), 0.0)
        return terms.sum(axis=1)
    if metric == "l1":
        return np.abs(dist - t).sum(axis=1)
    if metric == "l2":
        return np.sqrt(((dist - t) ** 2).sum(axis=1))
    if metric == "cosine":
        cos = dist @ t / (np.linalg.norm(dist, axis=1) * np.linalg.norm(t))
        return 1.0 - cos
    raise ValueError(f"unknown discrepancy metric {metric!r}; expected one of {METRICS}")


def disco_weights(
    counts: np.ndarray,
    a: float,
    b: float,
    target: np.ndarray,
    metric: str = "kl",
    normalise: bool | None = None,
) -> np.ndarray | None:
    """FedDisco's aggregation weights of the round's clients (rows of ``counts``), summing to
    1; ``None`` when every ``ReLU(n_k - a d_k + b)`` is 0."""
    counts = np.asarray(counts, dtype=np.float64)
    sizes = counts.sum(axis=1)
    n = sizes / sizes.sum()
    d = discrepancy(counts, target, metric)
    if (metric == "kl") if normalise is None else normalise:
        total = d.sum()
        d = d / total if total > 0 else d
    raw = np.maximum(n - a * d + b, 0.0)
    if raw.sum() <= 0:
        return None
    return raw / raw.sum()


class FedDisco(FedAvg):
    """FedAvg with discrepancy-aware aggregation weights (FedDisco's server)."""

    name = "feddisco"
    client_algorithm = "fedavg"
    Config = FedDiscoConfig

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.resources is None:
            raise ValueError("FedDisco needs the server's partition (ServerResources)")
        train = self.resources.bundle.train
        self.class_counts = self.resources.partition.histogram(train.y, train.num_classes)
        if self.params.target == "uniform":
            self.target = np.full(train.num_classes, 1.0 / train.num_classes)
        else:
            self.target = self.class_counts.sum(axis=0).astype(np.float64)
        self.weight: dict[int, float] = {}

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        messages = super().configure_train(server_round, arrays, config, grid)
        p = self.params
        pids = list(self.sampled)
        weights = disco_weights(
            self.class_counts[pids], p.a, p.b, self.target, p.metric, p.normalise_discrepancy
        )
        self.disco_fallback = weights is None
        if weights is None:
            if p.fallback == "error":
                raise RuntimeError(
                    f"FedDisco: every weight ReLU(n_k - a d_k + b) is 0 in round {server_round} "
                    f"(strategy.a = {p.a}, strategy.b = {p.b}); lower a or raise b"
                )
            log(WARNING, "FedDisco: every weight is 0 in round %d; n_k weights", server_round)
            sizes = self.class_counts[pids].sum(axis=1).astype(np.float64)
            weights = sizes / sizes.sum()
        self.weight = dict(zip(pids, weights.tolist(), strict=True))
        log(INFO, "FedDisco weights: %s", {k: round(v, 4) for k, v in self.weight.items()})
        return messages

    def begin_round(self, server_round: int) -> None:
        super().begin_round(server_round)  # rule mean: the mean clipped relative to the round
        if self.aggregation.rule in ("median", "trimmed_mean"):
            self.averager.running = new_weighted_average(self.aggregation)  # the rules take p_k
        self.zero_weighted = new_average(self.aggregation)  # used only if no one else replies

    def absorb(self, server_round: int, reply: Reply) -> None:
        arrays = self.averager.robust(reply.arrays, self.global_arrays)
        weight = self.weight[reply.partition_id]
        if weight > 0:
            self.averager.running.add(arrays, weight, reply.partition_id)
        else:
            self.zero_weighted.add(arrays, reply.num_examples)

    def aggregate(self, server_round: int, replies: list[Reply]) -> dict[str, np.ndarray]:
        values = list(self.weight.values())
        self.last_round.update(
            disco_weight_min=min(values),
            disco_weight_max=max(values),
            disco_zeroed=sum(v == 0 for v in values),
            disco_fallback=int(self.disco_fallback),
        )
        if self.averager.count == 0:
            log(
                WARNING,
                "FedDisco: no client with a positive weight replied in round %d; the replies "
                "are averaged by n_k",
                server_round,
            )
            self.averager.running = self.zero_weighted
            self.last_round["disco_fallback"] = 1
        return self.averaged()
