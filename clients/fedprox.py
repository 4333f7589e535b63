"""The FedProx client: local training with a proximal term.

Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020, Eq. (2): each client
minimises ``F_k(w) + mu/2 * ||w - w^t||^2`` where ``w^t`` is the received global model. ``mu``
(declared in :mod:`fedgo_flwr.protocol.scalars`) comes from ``strategy.mu`` in the YAML config.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from clients.base import ClientAlgorithm, ClientJob
from fedgo_flwr.protocol import declaration


def proximal_term(
    global_params: list[torch.Tensor], mu: float
) -> Callable[[nn.Module], torch.Tensor]:
    """``model -> mu/2 * sum ||p - p_global||^2`` over the trainable parameters."""

    def term(model: nn.Module) -> torch.Tensor:
        sq = sum(
            (p - g).pow(2).sum() for p, g in zip(model.parameters(), global_params, strict=True)
        )
        return 0.5 * mu * sq

    return term


class FedProxClient(ClientAlgorithm):
    name = "fedprox"
    Config = declaration("fedprox").Config

    def regularizer(self, job: ClientJob) -> Callable[[nn.Module], torch.Tensor] | None:
        mu = job.params.mu
        if mu == 0:
            return None
        assert job.model is not None
        frozen = [p.detach().clone() for p in job.model.parameters()]
        return proximal_term(frozen, mu)
