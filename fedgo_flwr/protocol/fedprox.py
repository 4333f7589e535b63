"""FedProx's messages (Li et al., MLSys 2020): FedAvg's; the client's parameter ``mu``
(:class:`FedProxConfig`) comes with every message."""

from __future__ import annotations

from dataclasses import dataclass

from fedgo_flwr.experiment.schema import Checker
from fedgo_flwr.protocol import Declaration


@dataclass
class FedProxConfig:
    """``mu``: weight of the proximal term (the FedGO paper's best value is 0.001)."""

    mu: float = 0.01

    def check(self, c: Checker) -> None:
        c.require("mu", self.mu >= 0, "must be >= 0")


PROTOCOL = Declaration("fedprox", Config=FedProxConfig)
