"""FedGKD's messages (Yao et al., 2021): the buffer of past global models goes down as
``teacher.0`` ... ``teacher.{M-1}`` (:func:`teacher_key`) with their weights (ConfigRecord
:data:`TEACHER_WEIGHTS_KEY`, ``beta``); the reply is FedAvg's plus the KD term's mean. The
client's parameters (:class:`FedGKDConfig`) come with every message; the buffer of global
models is the server's state."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedgo_flwr.config.schema import Checker
from fedgo_flwr.protocol import TRAIN, Declaration
from fedgo_flwr.protocol.spec import ReplySpec, Scalar

TEACHER_KEY = "teacher"
"""The record prefix of the teachers: ``teacher.0`` ... ``teacher.{M-1}``."""
TEACHER_WEIGHTS_KEY = "teacher_weights"
"""ConfigRecord with ``beta``: the teachers' weights, summing to 1."""
KD_SCALES = ("paper", "code")


def teacher_key(m: int) -> str:
    """The record of the ``m``-th teacher."""
    return f"{TEACHER_KEY}.{m}"


@dataclass
class FedGKDConfig:
    """``gamma``: weight of the KD term; ``temperature`` (tau); ``kd_scale``: ``paper``
    (gamma/2 * KL, FedGO's description) or ``code`` (gamma * tau^2 * KL, the authors' code);
    ``kd_from_round``: the first round with the KD term (the code's: 2)."""

    gamma: float = 0.001
    temperature: float = 3.0
    kd_scale: str = "paper"
    kd_from_round: int = 2

    def check(self, c: Checker) -> None:
        c.require("gamma", math.isfinite(self.gamma) and self.gamma >= 0, "must be >= 0")
        c.require(
            "temperature",
            math.isfinite(self.temperature) and self.temperature > 0,
            "must be a finite number > 0",
        )
        c.choice("kd_scale", KD_SCALES)
        c.require("kd_from_round", self.kd_from_round >= 1, "must be >= 1")

    def kd_weight(self) -> float:
        """The factor of the KL term: gamma/2 (paper) or gamma * tau^2 (code)."""
        if self.kd_scale == "code":
            return self.gamma * self.temperature**2
        return self.gamma / 2


PROTOCOL = Declaration(
    "fedgkd",
    {TRAIN: ReplySpec().with_metrics(kd_loss=Scalar())},
    Config=FedGKDConfig,
    server_state=True,  # the buffer of global models lives at the server
)
