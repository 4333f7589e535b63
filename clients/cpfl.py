"""CPFL client: a cohort member that reports the received model's validation loss, then trains.

Dhasade et al., "Harnessing Increased Client Participation with Cohort-Parallel Federated
Learning", EuroMLSys 2025 (paper 003), Sec. 4.1: every client with at least
``min_val_samples`` (10) samples keeps ``val_fraction`` (10%) of them apart. At the start of
each fit it computes the loss of the cohort model it received on that split and sends it back
with the update (the authors' code: ``train_info["val_loss_global_model"]``), so the cohort
server can stop the cohort without an extra round trip. It then trains on the rest with the
local algorithm the strategy names (``local_algorithm``: FedAvg by default, FedProx, ...).

Reply metrics besides the usual: ``val_loss`` and ``val_examples`` (clients with a split).
"""

from __future__ import annotations

import dataclasses

from flwr.app import ArrayRecord

from clients import client_class
from clients.base import ClientAlgorithm, ClientJob
from fedgo_flwr.config.schema import build_section
from fedgo_flwr.learning.cohorts import holdout_split
from fedgo_flwr.learning.training import TrainStats, evaluate
from fedgo_flwr.protocol.cpfl import PROTOCOL, CohortClientConfig, local_declaration


def local_class(name: str) -> type[ClientAlgorithm]:
    """The client algorithm a cohort runs (``ValueError`` naming why one cannot:
    :func:`~fedgo_flwr.protocol.cpfl.local_declaration`)."""
    return client_class(local_declaration(name).name)


class CPFLClient(ClientAlgorithm):
    """Validation loss of the received model, then the local algorithm on the training part."""

    name = "cpfl"
    Config = PROTOCOL.Config

    def train(self, job: ClientJob) -> tuple[TrainStats, dict[str, ArrayRecord]]:
        assert job.model is not None
        p: CohortClientConfig = job.params
        train_idx, val_idx = holdout_split(
            len(job.data), p.val_fraction, p.min_val_samples, job.cfg.seed, job.partition_id
        )
        metrics: dict[str, float] = {}
        if len(val_idx):
            loss, _ = evaluate(
                job.model, job.data.subset(val_idx), job.cfg.eval.batch_size, job.device
            )
            metrics = {"val_loss": loss, "val_examples": len(val_idx)}
        algorithm = local_class(p.local_algorithm)
        params = build_section(
            algorithm.Config, p.local_params, "strategy.local_params.", owner=algorithm.name
        )
        local_job = dataclasses.replace(job, params=params, data=job.data.subset(train_idx))
        stats, extra = algorithm().train(local_job)
        stats.metrics.update(metrics)
        return stats, extra
