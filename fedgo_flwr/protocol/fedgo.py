"""FedGO's messages (Jang, Park, Lee, ICML 2025, Alg. 2-3; FedGAN for scenario G3).

``train``: as FedAvg. ``train.discriminator``: the server sends the generator
(:data:`GENERATOR_KEY`) and/or its reference images (:data:`REFERENCE_KEY`); the client
returns its discriminator D_k in ``arrays`` with its training statistics (``disc_*``).
``train.fedgan``: the server sends the generator and the critic (:data:`CRITIC_KEY`); the
client returns both trained, with WGAN-GP's statistics (``gan_*``). The client's parameters
are the generator and discriminator settings (:class:`~fedgo_flwr.gan.settings.GanConfig`);
the generator and the discriminators are the server's state.
"""

from __future__ import annotations

from fedgo_flwr.gan.settings import GanConfig
from fedgo_flwr.protocol import TRAIN, Declaration
from fedgo_flwr.protocol.spec import COMMON_METRICS, ReplySpec, Scalar

GENERATOR_KEY = "generator"
REFERENCE_KEY = "reference"  # the server's reference images (discriminator.reference)
CRITIC_KEY = "critic"  # FedGAN's WGAN-GP critic (scenario G3)
DISCRIMINATOR_MESSAGE = "train.discriminator"
FEDGAN_MESSAGE = "train.fedgan"

DISCRIMINATOR_REPLY = ReplySpec(metrics=dict(COMMON_METRICS), metric_prefixes={"disc_": Scalar()})
"""D_k in ``arrays``; its training statistics as ``disc_<name>``."""
FEDGAN_REPLY = ReplySpec(
    arrays=(GENERATOR_KEY, CRITIC_KEY),
    metrics=dict(COMMON_METRICS),
    metric_prefixes={"gan_": Scalar()},
)
"""The trained generator and critic; WGAN-GP's statistics as ``gan_<name>``."""

PROTOCOL = Declaration(
    "fedgo",
    {TRAIN: ReplySpec(), DISCRIMINATOR_MESSAGE: DISCRIMINATOR_REPLY, FEDGAN_MESSAGE: FEDGAN_REPLY},
    Config=GanConfig,
    server_state=True,  # the generator and discriminators
)
