"""FedGKD+: FedGKD's clients with FedDF's server-side ensemble distillation.

FedGO (paper 001, Sec. 4.1) lists "FedGKD+ (Yao et al., 2021)" among the baselines "that
incorporate ensemble distillation", reports an ensemble accuracy for it (App. F.1-F.2) and gives
it FedDF's server cost with twice FedAvg's client cost (Table 17): FedGKD's clients, which distil
from the averaged buffer of global models (:mod:`clients.fedgkd`, :mod:`strategies._gkd`), and
FedDF's server, which distils the n_k-initialised average towards the clients' ensemble on the
server's unlabeled data (:mod:`strategies.feddf`, every FedDF parameter applies). FedGO does not
define the "+" in words; this reading follows from those three places (``docs/design/peers.md``
§1.1). The buffer holds the *distilled* server models. ``teacher: all`` sends every buffered
model (FedGKD-VOTE); with ``vote_weights: val_loss`` their weights come from the loss of each on
FedDF's labelled validation split (``val_fraction > 0``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedgo_flwr.config.schema import Checker
from fedgo_flwr.learning.training import evaluate
from strategies._gkd import GKDBufferConfig, GlobalModelBuffer
from strategies.base import Reply
from strategies.feddf import FedDF, FedDFConfig


@dataclass
class FedGKDPlusConfig(GKDBufferConfig, FedDFConfig):
    """FedGKD's client and buffer parameters and every FedDF parameter."""

    def check(self, c: Checker) -> None:
        if self.vote_weights == "val_loss":
            c.require(
                "val_fraction",
                self.val_fraction > 0,
                "must be > 0 for vote_weights val_loss (a labelled validation split)",
            )


class FedGKDPlus(FedDF):
    """FedDF with the buffer of distilled global models (``self.gkd``) as the clients'
    teachers."""

    name = "fedgkd_plus"
    client_algorithm = "fedgkd"
    Config = FedGKDPlusConfig
    supports_heterogeneous_models = False  # its teachers are model.name's global models
    reply_metrics = ("kd_loss",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gkd = GlobalModelBuffer(self.params, self.validation_loss)

    def train_record(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord
    ) -> RecordDict:
        """FedDF's content plus the buffer's teachers (:meth:`GlobalModelBuffer.add_teachers`)."""
        return self.gkd.add_teachers(super().train_record(server_round, arrays, config), arrays)

    def aggregate(self, server_round: int, replies: list[Reply]) -> dict[str, np.ndarray]:
        """FedDF's distilled model, pushed into the buffer; the round records
        ``teacher_distance``."""
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
        """FedDF's checks, then the buffer's: at most ``buffer_length`` models of
        ``model.name``."""
        problem = super().state_problem(state, server_round)
        return problem or self.gkd.state_problem(state, self.model_problem)

    def validation_loss(self, arrays: dict[str, np.ndarray]) -> float:
        """``arrays``' loss on FedDF's labelled validation split (``vote_weights: val_loss``)."""
        assert self.val_set is not None and self.resources is not None
        self.scratch.load_state_dict(self.to_state(arrays))
        loss, _ = evaluate(
            self.scratch, self.val_set, self.cfg.eval.batch_size, self.resources.device
        )
        return loss
