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

from dataclasses import dataclass

import numpy as np

from fedgo_flwr.experiment.schema import Checker
from fedgo_flwr.learning.training import evaluate
from strategies._gkd import GKDBufferConfig, GlobalModelBuffer
from strategies.feddf import FedDF, FedDFConfig


@dataclass
class FedGKDPlusConfig(GKDBufferConfig, FedDFConfig):
    """FedGKD's client and buffer parameters and every FedDF parameter."""

    def check(self, c: Checker) -> None:
        GKDBufferConfig.check(self, c)
        FedDFConfig.check(self, c)
        if self.vote_weights == "val_loss":
            c.require(
                "val_fraction",
                self.val_fraction > 0,
                "must be > 0 for vote_weights val_loss (a labelled validation split)",
            )


class FedGKDPlus(GlobalModelBuffer, FedDF):
    name = "fedgkd_plus"
    client_algorithm = "fedgkd"
    Config = FedGKDPlusConfig
    supports_heterogeneous_models = False  # its teachers are model.name's global models
    reply_metrics = ("kd_loss",)

    def validation_loss(self, arrays: dict[str, np.ndarray]) -> float:
        assert self.val_set is not None and self.resources is not None
        self.scratch.load_state_dict(self.to_state(arrays))
        loss, _ = evaluate(
            self.scratch, self.val_set, self.cfg.eval.batch_size, self.resources.device
        )
        return loss
