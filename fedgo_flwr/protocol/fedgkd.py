"""FedGKD's messages (Yao et al., 2021): the buffer of past global models goes down as
``teacher.0`` ... ``teacher.{M-1}`` (:func:`teacher_key`) with their weights (ConfigRecord
:data:`TEACHER_WEIGHTS_KEY`, ``beta``); the reply is FedAvg's plus the KD term's mean."""

from __future__ import annotations

from fedgo_flwr.protocol import TRAIN, Declaration
from fedgo_flwr.protocol.spec import ReplySpec, Scalar

TEACHER_KEY = "teacher"
TEACHER_WEIGHTS_KEY = "teacher_weights"


def teacher_key(m: int) -> str:
    """The record of the ``m``-th teacher."""
    return f"{TEACHER_KEY}.{m}"


PROTOCOL = Declaration("fedgkd", {TRAIN: ReplySpec().with_metrics(kd_loss=Scalar())})
