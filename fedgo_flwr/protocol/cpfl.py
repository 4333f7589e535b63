"""CPFL's message (Dhasade et al., EuroMLSys 2025, Sec. 4.1): a cohort member's ``train``
reply is its local algorithm's, plus the received model's loss on its validation split
(``val_loss``, ``val_examples``) where it has one."""

from __future__ import annotations

from fedgo_flwr.protocol import TRAIN, Declaration, declaration
from fedgo_flwr.protocol.spec import ReplySpec, Scalar

VAL_METRICS = {"val_loss": Scalar(lo=0.0), "val_examples": Scalar(lo=1.0, whole=True)}


def member_reply(local_algorithm: str) -> ReplySpec:
    """A cohort member's ``train`` reply: its local algorithm's with the validation report."""
    return declaration(local_algorithm).reply(TRAIN).with_metrics(**VAL_METRICS)


PROTOCOL = Declaration("cpfl", {TRAIN: member_reply("fedavg")})
