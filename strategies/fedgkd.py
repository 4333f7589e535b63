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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from strategies._gkd import GKDBufferConfig, GlobalModelBuffer
from strategies.base import BaseConfig, Reply
from strategies.fedavg import FedAvg


@dataclass
class FedGKDServerConfig(GKDBufferConfig, BaseConfig):
    """The client's KD parameters, the buffer's, and the shared ``aggregation`` section."""

    def check(self, c) -> None:
        if self.vote_weights == "val_loss":
            c.fail(
                "vote_weights",
                "needs a labelled validation split: use fedgkd_plus with "
                "val_fraction > 0, or vote_weights uniform",
            )


class FedGKD(FedAvg):
    """FedAvg with the buffer of global models (``self.gkd``) as the clients' teachers."""

    name = "fedgkd"
    client_algorithm = "fedgkd"
    Config = FedGKDServerConfig
    reply_metrics = ("kd_loss",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gkd = GlobalModelBuffer(self.params)

    def train_record(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord
    ) -> RecordDict:
        """FedAvg's content plus the buffer's teachers (:meth:`GlobalModelBuffer.add_teachers`)."""
        return self.gkd.add_teachers(super().train_record(server_round, arrays, config), arrays)

    def aggregate(self, server_round: int, replies: list[Reply]) -> dict[str, np.ndarray]:
        """FedAvg's average, pushed into the buffer; the round records ``teacher_distance``."""
        out = super().aggregate(server_round, replies)
        self.last_round["teacher_distance"] = self.gkd.teacher_distance
        self.gkd.push(out)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), **self.gkd.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self.gkd.load_state_dict(state)

    def state_problem(self, state: Mapping[str, Any], server_round: int) -> str | None:
        """FedAvg's checks, then the buffer's: at most ``buffer_length`` models of
        ``model.name``."""
        problem = super().state_problem(state, server_round)
        return problem or self.gkd.state_problem(state, self.model_problem)
