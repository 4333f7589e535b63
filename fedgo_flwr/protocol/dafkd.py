"""DaFKD's messages (Wang et al., CVPR 2023): the global generator goes down with the model
(:data:`GENERATOR_KEY`); the client's trained generator and its discriminator head
(:data:`DISC_HEAD_KEY`, ``{"weight": (1, d), "bias": (1,)}``) come back. The client's
parameters (:class:`DaFKDClientConfig`) come with every message; the global generator is the
server's state."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fedgo_flwr.config.schema import Checker
from fedgo_flwr.gan.settings import GeneratorConfig
from fedgo_flwr.protocol import TRAIN, Declaration
from fedgo_flwr.protocol.spec import ReplySpec, Scalar

GENERATOR_KEY = "generator"
"""The generator's weights: the server's global one down, the client's trained one up."""
DISC_HEAD_KEY = "disc_head"
"""The client's discriminator head ``{"weight": (1, d), "bias": (1,)}``, sent up."""
GP_NORMS = ("sample", "channel")
SCHEDULES = ("rounds", "participations")


@dataclass
class DaFKDClientConfig:
    """The generator (FedGO's ``strategy.generator`` section: ``name``, ``latent_dim``,
    ``width`` or ``module``, ``path`` to start from saved weights, and ``lr``, its Adam's
    learning rate; the WGAN-GP keys are not used), the GAN schedule (``disc_rounds``,
    ``generator_rounds``, ``gan_epochs``; 0: all; ``gan_schedule``), ``gp_lambda`` (the
    discriminators' penalty) and ``gp_norm``."""

    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    disc_rounds: int = 0
    generator_rounds: int = 0
    gan_epochs: int = 0
    gan_schedule: str = "participations"
    gp_lambda: float = 0.3
    gp_norm: str = "sample"

    def check(self, c: Checker) -> None:
        for key in ("disc_rounds", "generator_rounds", "gan_epochs"):
            c.require(key, getattr(self, key) >= 0, "must be >= 0 (0: all)")
        c.choice("gan_schedule", SCHEDULES)
        c.require(
            "gp_lambda", math.isfinite(self.gp_lambda) and self.gp_lambda >= 0, "must be >= 0"
        )
        c.choice("gp_norm", GP_NORMS)


PROTOCOL = Declaration(
    "dafkd",
    {
        TRAIN: ReplySpec()
        .with_arrays(GENERATOR_KEY, DISC_HEAD_KEY)
        .with_metrics(gan_d_loss=Scalar(), gan_g_loss=Scalar())
    },
    Config=DaFKDClientConfig,
    server_state=True,  # the generator is the server's
)
