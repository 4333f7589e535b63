"""The base of every client algorithm: what a client gets for one message, and local training.

A client algorithm (``clients/<name>.py``) subclasses :class:`ClientAlgorithm` and overrides only
what differs (FL-bench style): a term added to the local loss that needs only the model
(:meth:`~ClientAlgorithm.regularizer`, FedProx) or the minibatch, its logits and features
(:meth:`~ClientAlgorithm.batch_loss`, FedGKD, FedUV), an edit of the gradients
(:meth:`~ClientAlgorithm.grad_correction`, SCAFFOLD) or the whole
:meth:`~ClientAlgorithm.train` (extra records in the reply). Its own YAML parameters are a
``Config`` dataclass, declared with its messages in ``fedgo_flwr/protocol/<name>.py`` (where
the server reads it), which the strategy declares as (part of) its own and sends with every
message; the client reads only those. Message types beyond ``train`` that the algorithm
handles (FedGO's ``train.discriminator``) are declared in ``messages``; the ClientApp registers
them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from flwr.app import ArrayRecord, RecordDict
from torch import nn

from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.learning.training import Batch, BatchLoss, TrainStats, train_local
from fedgo_flwr.protocol import EmptyConfig

__all__ = ["ClientAlgorithm", "ClientJob", "EmptyConfig"]


@dataclass
class ClientJob:
    """Everything one client needs to answer one message."""

    cfg: ExperimentConfig  # the core experiment (no strategy's parameters)
    params: Any  # the client algorithm's own Config, built from the message
    partition_id: int
    server_round: int
    data: ArrayDataset
    device: torch.device
    rng: torch.Generator  # seeded from (seed, message, round, partition id)
    content: RecordDict  # the incoming message content (extra records of the strategy)
    state: RecordDict  # the node's persistent state across rounds (Flower ``context.state``)
    model: nn.Module | None = None  # train messages: holds the received global weights


class ClientAlgorithm:
    """Local training from the received global model (FedAvg's ClientUpdate by default)."""

    name: ClassVar[str] = ""
    """The algorithm's name: its module's name."""
    Config: ClassVar[type] = EmptyConfig
    """The client's own parameters (``strategy.<key>`` in YAML), a dataclass: its declaration's
    (``fedgo_flwr.protocol.<name>.PROTOCOL.Config``, which the server sends)."""
    uses_features: ClassVar[bool] = False
    """Whether :meth:`batch_loss` reads the features of the output layer's input."""
    messages: ClassVar[Mapping[str, str]] = {}
    """Extra message types handled (``"train.<action>"``) -> name of the method that answers.

    The method takes a :class:`ClientJob` (without a model) and returns the reply's extra
    records and its metrics (``num-examples`` and ``partition-id`` are added by the ClientApp).
    """

    def regularizer(self, job: ClientJob) -> Callable[[nn.Module], torch.Tensor] | None:
        """A term added to the local loss (``None``: plain cross-entropy)."""
        return None

    def batch_loss(self, job: ClientJob) -> BatchLoss | None:
        """A term of each minibatch added to the local loss (``None``: none); it sees the
        batch's inputs, labels, logits and, if :attr:`uses_features`, the features that enter
        the output layer (:class:`fedgo_flwr.learning.training.Batch`)."""
        return None

    def after_step(self, job: ClientJob) -> Callable[[Batch], None] | None:
        """Work after each local optimizer step (``None``: none), e.g. DaFKD's generator step."""
        return None

    def grad_correction(self, job: ClientJob) -> Callable[[nn.Module], None] | None:
        """An in-place edit of the gradients after ``backward`` (``None``: none)."""
        return None

    def train(self, job: ClientJob) -> tuple[TrainStats, dict[str, ArrayRecord]]:
        """Train ``job.model`` in place; return stats and extra ArrayRecords for the reply."""
        assert job.model is not None
        stats = train_local(
            job.model,
            job.data,
            job.cfg.train,
            rng=job.rng,
            device=job.device,
            augment=job.cfg.data.augment,
            regularizer=self.regularizer(job),
            grad_correction=self.grad_correction(job),
            batch_loss=self.batch_loss(job),
            features=self.uses_features,
            after_step=self.after_step(job),
        )
        return stats, {}
