"""FedTGP's messages (Zhang et al., AAAI 2024): the global prototypes go down from round 2 on
(:data:`GLOBAL_PROTOS_KEY`, ``{"protos": (C, d)}``); the client's class prototypes and counts
come back (:data:`PROTOS_KEY`, ``{"protos": (C, d) float32, "counts": (C,) int64}``)."""

from __future__ import annotations

from fedgo_flwr.protocol import TRAIN, Declaration
from fedgo_flwr.protocol.spec import ReplySpec, Scalar

GLOBAL_PROTOS_KEY = "global_protos"
PROTOS_KEY = "protos"

PROTOCOL = Declaration(
    "fedtgp", {TRAIN: ReplySpec().with_arrays(PROTOS_KEY).with_metrics(proto_loss=Scalar())}
)
