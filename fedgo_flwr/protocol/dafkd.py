"""DaFKD's messages (Wang et al., CVPR 2023): the global generator goes down with the model
(:data:`GENERATOR_KEY`); the client's trained generator and its discriminator head
(:data:`DISC_HEAD_KEY`, ``{"weight": (1, d), "bias": (1,)}``) come back."""

from __future__ import annotations

from fedgo_flwr.protocol import TRAIN, Declaration
from fedgo_flwr.protocol.spec import ReplySpec, Scalar

GENERATOR_KEY = "generator"
DISC_HEAD_KEY = "disc_head"

PROTOCOL = Declaration(
    "dafkd",
    {
        TRAIN: ReplySpec()
        .with_arrays(GENERATOR_KEY, DISC_HEAD_KEY)
        .with_metrics(gan_d_loss=Scalar(), gan_g_loss=Scalar())
    },
)
