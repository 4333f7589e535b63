"""FedAvg: the n_k-weighted average of the round's client models.

McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data",
AISTATS 2017, Alg. 1: each round a fraction C of the K clients trains locally from the global
model (``clients/fedavg.py``); the server replaces the model by the n_k-weighted average of the
returned models. That is :class:`strategies.base.Strategy`'s default aggregation, so FedAvg
only names itself.
"""

from __future__ import annotations

from strategies.base import Strategy


class FedAvg(Strategy):
    """Federated Averaging with seeded sampling and per-reply validation."""

    name = "fedavg"
    client_algorithm = "fedavg"
