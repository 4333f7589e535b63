"""SCAFFOLD's messages (Karimireddy et al., ICML 2020, Alg. 1): the server's control variate c
goes down with the model (:data:`CONTROL_KEY`); the client's delta c_i+ - c_i comes back
(:data:`CONTROL_DELTA_KEY`), shaped as the model's parameters. The control variate c is the
server's state."""

from __future__ import annotations

from fedgo_flwr.protocol import TRAIN, Declaration
from fedgo_flwr.protocol.spec import ReplySpec

CONTROL_KEY = "control"  # the server's control variate c, sent with the model
CONTROL_DELTA_KEY = "control_delta"  # the client's delta c_i, sent back

PROTOCOL = Declaration(
    "scaffold", {TRAIN: ReplySpec().with_arrays(CONTROL_DELTA_KEY)}, server_state=True
)
