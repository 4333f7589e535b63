"""FedProx: FedAvg aggregation with a proximal term in the clients' objective.

Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020, Alg. 2. The server
side is FedAvg's; clients (``clients/fedprox.py``) minimise ``F_k(w) + mu/2 ||w - w^t||^2``.
The parameter ``mu`` is the client's (:class:`clients.fedprox.FedProxConfig`).
"""

from __future__ import annotations

from clients.fedprox import FedProxConfig
from strategies.fedavg import FedAvg


class FedProx(FedAvg):
    name = "fedprox"
    client_algorithm = "fedprox"
    Config = FedProxConfig
