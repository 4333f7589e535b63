"""FedTGP's messages (Zhang et al., AAAI 2024): the global prototypes go down from round 2 on
(:data:`GLOBAL_PROTOS_KEY`, ``{"protos": (C, d)}``); the client's class prototypes and counts
come back (:data:`PROTOS_KEY`, ``{"protos": (C, d) float32, "counts": (C,) int64}``). The
client's parameters (:class:`FedTGPConfig`) come with every message; the trainable global
prototypes are the server's state."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedgo_flwr.config.schema import Checker
from fedgo_flwr.protocol import TRAIN, Declaration
from fedgo_flwr.protocol.spec import ReplySpec, Scalar

GLOBAL_PROTOS_KEY = "global_protos"
"""The server's prototypes, ``{"protos": (C, d) float32}``, from round 2 on."""
PROTOS_KEY = "protos"
"""The client's upload: ``{"protos": (C, d) float32, "counts": (C,) int64}`` (zero rows for
the classes it does not hold)."""
DISTANCES = ("mse", "l2")


@dataclass
class FedTGPConfig:
    """``lam``: weight of the prototype term; ``distance``: ``mse`` (the authors' code) or
    ``l2`` (the mean Euclidean distance)."""

    lam: float = 0.001
    distance: str = "mse"

    def check(self, c: Checker) -> None:
        c.require("lam", math.isfinite(self.lam) and self.lam >= 0, "must be a finite number >= 0")
        c.choice("distance", DISTANCES)


PROTOCOL = Declaration(
    "fedtgp",
    {TRAIN: ReplySpec().with_arrays(PROTOS_KEY).with_metrics(proto_loss=Scalar())},
    Config=FedTGPConfig,
    server_state=True,  # the trainable global prototypes live at the server
)
