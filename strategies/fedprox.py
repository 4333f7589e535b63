"""FedProx: FedAvg aggregation with a proximal term in the clients' objective.

Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020, Alg. 2. The server
side is FedAvg's; clients (``clients/fedprox.py``) minimise ``F_k(w) + mu/2 ||w - w^t||^2``.
The parameter ``mu`` is the client's (declared in :mod:`fedgo_flwr.protocol.scalars`), beside
the shared ``aggregation`` section.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedgo_flwr.protocol import declaration
from strategies.base import BaseConfig
from strategies.fedavg import FedAvg


@dataclass
class FedProxServerConfig(declaration("fedprox").Config, BaseConfig):
    """The client's ``mu`` and the shared ``aggregation`` section."""


class FedProx(FedAvg):
    name = "fedprox"
    client_algorithm = "fedprox"
    Config = FedProxServerConfig
