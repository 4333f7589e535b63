"""FedGKD: FedAvg whose clients distil from the average of the last M global models.

Yao et al., "FedGKD: Towards Heterogeneous Federated Learning via Global Knowledge
Distillation", IEEE Trans. Computers 2023 (arXiv 2107.00051). The server is FedAvg's n_k-weighted
average plus a buffer of the last ``buffer_length`` global models, whose average (or all of
them, ``teacher: all``, the paper's FedGKD-VOTE) is sent as the clients' teacher
(:mod:`strategies._gkd`); clients add ``gamma/2 * KL`` to the teacher at temperature tau
(:mod:`clients.fedgkd`). FedGO's App. E.2 values are the defaults: M = 5, tau = 3, gamma = 0.001.
The authors' code averages the client models uniformly (``master.py``); this project's FedAvg
weights them by n_k, as FedAvg's Alg. 1 does. FedGO's Table 3 row is FedGKD+
(``strategies/fedgkd_plus.py``), this one with FedDF's server distillation.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies._gkd import GKDBufferConfig, GlobalModelBuffer
from strategies.base import BaseConfig
from strategies.fedavg import FedAvg


@dataclass
class FedGKDServerConfig(GKDBufferConfig, BaseConfig):
    """The client's KD parameters, the buffer's, and the shared ``aggregation`` section."""

    def check(self, c) -> None:
        GKDBufferConfig.check(self, c)
        if self.vote_weights == "val_loss":
            c.fail(
                "vote_weights",
                "needs a labelled validation split: use fedgkd_plus with "
                "val_fraction > 0, or vote_weights uniform",
            )


class FedGKD(GlobalModelBuffer, FedAvg):
    name = "fedgkd"
    client_algorithm = "fedgkd"
    Config = FedGKDServerConfig
    reply_metrics = ("kd_loss",)
