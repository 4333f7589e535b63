"""FedProx: FedAvg aggregation with a proximal term in the clients' objective.

Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020, Alg. 2. The server
side is FedAvg's; clients (``clients/fedprox.py``) minimise ``F_k(w) + mu/2 ||w - w^t||^2``.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.fedavg import FedAvg


@dataclass
class FedProxParams:
    """``mu``: weight of the proximal term (the FedGO paper's best value is 0.001)."""

    mu: float = 0.01

    def __post_init__(self) -> None:
        if self.mu < 0:
            raise ValueError("mu must be >= 0")


class FedProx(FedAvg):
    name = "fedprox"
    client_algorithm = "fedprox"
    Params = FedProxParams
