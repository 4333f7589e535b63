"""SCAFFOLD's messages (Karimireddy et al., ICML 2020, Alg. 1): the server's control variate c
goes down with the model (:data:`CONTROL_KEY`); the client's delta c_i+ - c_i comes back
(:data:`CONTROL_DELTA_KEY`), shaped as the model's parameters."""

from __future__ import annotations

from fedgo_flwr.protocol import TRAIN, Declaration
from fedgo_flwr.protocol.spec import ReplySpec

CONTROL_KEY = "control"
CONTROL_DELTA_KEY = "control_delta"

PROTOCOL = Declaration("scaffold", {TRAIN: ReplySpec().with_arrays(CONTROL_DELTA_KEY)})
