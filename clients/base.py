"""The FedAvg client: local training from the received global model.

McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data",
AISTATS 2017, Alg. 1 (ClientUpdate): E epochs of minibatch SGD on the local data, then the
updated weights go back with the number of local examples. Every other client algorithm is a
small subclass that overrides one hook (FL-bench style).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from flwr.app import ArrayRecord, RecordDict
from torch import nn

from fedgo_flwr.config import ExperimentConfig
from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.training import TrainStats, train_local


@dataclass
class ClientJob:
    """Everything one client needs for one round of training."""

    cfg: ExperimentConfig
    partition_id: int
    server_round: int
    model: nn.Module  # already holds the received global weights
    data: ArrayDataset
    device: torch.device
    rng: torch.Generator  # seeded from (seed, round, partition id)
    content: RecordDict  # the incoming message content (extra records of the strategy)
    state: RecordDict  # the node's persistent state across rounds (Flower ``context.state``)


class FedAvgClient:
    """Plain local training; subclasses override :meth:`regularizer` or :meth:`train`."""

    name = "fedavg"

    def regularizer(self, job: ClientJob) -> Callable[[nn.Module], torch.Tensor] | None:
        """A term added to the local loss (``None``: plain cross-entropy)."""
        return None

    def grad_correction(self, job: ClientJob) -> Callable[[nn.Module], None] | None:
        """An in-place edit of the gradients after ``backward`` (``None``: none)."""
        return None

    def train(self, job: ClientJob) -> tuple[TrainStats, dict[str, ArrayRecord]]:
        """Train ``job.model`` in place; return stats and extra ArrayRecords for the reply."""
        stats = train_local(
            job.model,
            job.data,
            job.cfg.train,
            rng=job.rng,
            device=job.device,
            augment=job.cfg.data.augment,
            regularizer=self.regularizer(job),
            grad_correction=self.grad_correction(job),
        )
        return stats, {}
