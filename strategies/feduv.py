"""FedUV: FedAvg aggregation of clients trained with variance and uniformity regularisers.

Son et al., "FedUV: Uniformity and Variance for Heterogeneous Federated Learning", CVPR 2024.
FedUV changes only local training (``clients/feduv.py``); the server is FedAvg's n_k-weighted
average (the authors' code, ``train_fl.py``, averages by data size) and FedUV adds no
communication. The parameters are the client's (declared in :mod:`fedgo_flwr.protocol.scalars`;
FedGO App. E.2 ran alpha = 2.5, lambda = 0.5), beside the shared ``aggregation`` section.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedgo_flwr.protocol import declaration
from strategies.base import BaseConfig
from strategies.fedavg import FedAvg


@dataclass
class FedUVServerConfig(declaration("feduv").Config, BaseConfig):
    """The client's regulariser weights and the shared ``aggregation`` section."""


class FedUV(FedAvg):
    name = "feduv"
    client_algorithm = "feduv"
    Config = FedUVServerConfig
    reply_metrics = ("uv_var", "uv_unif")
