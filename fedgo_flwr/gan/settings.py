"""FedGO's GAN settings, shared by the server (strategy) and the clients.

The server builds and trains the generator from :class:`GeneratorConfig` and the clients build
the same generator from it to load its weights; :class:`DiscriminatorConfig` says how each client
trains its discriminator (Jang, Park, Lee, ICML 2025, App. E.2). Both sections live under
``strategy.`` in an experiment configuration (``strategy.generator.*``,
``strategy.discriminator.*``); :class:`GanConfig` groups them for the clients. Every value is
checked by the section's ``check`` method (see :mod:`fedgo_flwr.schema`), one key per check.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fedgo_flwr.gan.networks import DISCRIMINATOR_NAMES, GENERATOR_NAMES
from fedgo_flwr.gan.training import DISCRIMINATOR_LOSSES
from fedgo_flwr.schema import Checker

__all__ = ["DiscriminatorConfig", "GanConfig", "GeneratorConfig"]


@dataclass
class GeneratorConfig:
    """Server generator (FedGO App. E.2: WGAN-GP, Adam 2e-4, betas (0, 0.9), n_critic 5, λ 10).

    ``path``: load a saved generator instead of training one (scenario G2, off-the-shelf, or a
    generator from an earlier run); otherwise it is trained on the server's unlabeled data (G1).
    ``width``: channel width of the ``dcgan``/``resnet`` generator and critic (64 in WGAN-GP's
    reference code; 32 costs about a quarter on a CPU).
    """

    name: str = "dcgan"
    latent_dim: int = 100
    width: int = 64
    steps: int = 1000
    batch_size: int = 64
    lr: float = 2e-4
    n_critic: int = 5
    gp_lambda: float = 10.0
    path: str | None = None

    def model_kwargs(self) -> dict[str, int]:
        """Keyword arguments of :func:`~fedgo_flwr.gan.networks.build_generator` and
        :func:`~fedgo_flwr.gan.networks.build_critic` beyond the name and the shapes."""
        return {"width": self.width} if self.name in ("dcgan", "resnet") else {}

    def check(self, c: Checker) -> None:
        c.choice("name", GENERATOR_NAMES)
        c.require("latent_dim", self.latent_dim >= 1, "must be >= 1")
        c.require("width", self.width >= 1, "must be >= 1")
        c.require("steps", self.steps >= 0, "must be >= 0")
        c.require("batch_size", self.batch_size >= 1, "must be >= 1")
        c.require("lr", self.lr > 0, "must be > 0")
        c.require("n_critic", self.n_critic >= 1, "must be >= 1")
        c.require("gp_lambda", self.gp_lambda >= 0, "must be >= 0")


@dataclass
class DiscriminatorConfig:
    """Client discriminators (FedGO App. E.2: 4-layer CNN, Adam 2e-4, betas (0.5, 0.999)).

    ``epochs``: 30 in the paper on CIFAR. ``path``: reuse discriminators saved by an earlier
    run (``discriminators.pt``) instead of a discriminator round. ``loss``: the squashing the
    discriminator is trained through (``sigmoid``: BCE on sigmoid(z), the paper's Alg. 3).
    """

    name: str = "cnn4"
    epochs: int = 5
    batch_size: int = 64
    lr: float = 2e-4
    loss: str = "sigmoid"
    path: str | None = None

    def check(self, c: Checker) -> None:
        c.choice("name", DISCRIMINATOR_NAMES)
        c.choice("loss", DISCRIMINATOR_LOSSES)
        c.require("epochs", self.epochs >= 1, "must be >= 1")
        c.require("batch_size", self.batch_size >= 1, "must be >= 1")
        c.require("lr", self.lr > 0, "must be > 0")


@dataclass
class GanConfig:
    """The generator and discriminator sections together (what a client needs)."""

    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    discriminator: DiscriminatorConfig = field(default_factory=DiscriminatorConfig)
