"""FedGO client: FedAvg's local training, and a discriminator trained once (pre-FL stage).

Jang, Park, Lee, ICML 2025, Alg. 3 (App. D): client k receives the generator G, trains its
discriminator D_k for ``epochs`` with the vanilla GAN loss (local data labelled 1, samples of
the frozen G labelled 0) and sends D_k back (message ``train.discriminator``). In the FL rounds
the client trains as in FedAvg.
The discriminator outputs raw logits; the server turns them into odds (``fedgo_flwr.weighting``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flwr.app import ArrayRecord

from clients.base import ClientAlgorithm, ClientJob
from fedgo_flwr.gan import (
    DISCRIMINATOR_LOSSES,
    DISCRIMINATOR_NAMES,
    GENERATOR_NAMES,
    build_discriminator,
    build_generator,
    train_discriminator,
)
from fedgo_flwr.messages import ARRAYS
from fedgo_flwr.rng import derive_seed, make_rng

GENERATOR_KEY = "generator"
DISCRIMINATOR_MESSAGE = "train.discriminator"


@dataclass
class GeneratorSettings:
    """Server generator (FedGO App. E.2: WGAN-GP, Adam 2e-4, betas (0, 0.9), n_critic 5, λ 10).

    ``path``: load a saved generator instead of training one (scenario G2, off-the-shelf, or a
    generator from an earlier run); otherwise it is trained on the server's unlabeled data (G1).
    ``width``: channel width of the ``dcgan``/``resnet`` generator and critic (64 in WGAN-GP's
    reference code; 32 costs about a quarter on a CPU).
    """

    def model_kwargs(self) -> dict[str, int]:
        return {"width": self.width} if self.name in ("dcgan", "resnet") else {}

    name: str = "dcgan"
    latent_dim: int = 100
    width: int = 64
    steps: int = 1000
    batch_size: int = 64
    lr: float = 2e-4
    n_critic: int = 5
    gp_lambda: float = 10.0
    path: str | None = None

    def __post_init__(self) -> None:
        if self.name not in GENERATOR_NAMES:
            raise ValueError(f"name '{self.name}' unknown; choose {', '.join(GENERATOR_NAMES)}")
        for key in ("latent_dim", "width", "steps", "batch_size", "n_critic"):
            if getattr(self, key) < (0 if key == "steps" else 1):
                raise ValueError(f"{key} is out of range")
        if self.lr <= 0 or self.gp_lambda < 0:
            raise ValueError("lr must be > 0 and gp_lambda >= 0")


@dataclass
class DiscriminatorSettings:
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

    def __post_init__(self) -> None:
        if self.name not in DISCRIMINATOR_NAMES:
            raise ValueError(f"name '{self.name}' unknown; choose {', '.join(DISCRIMINATOR_NAMES)}")
        if self.loss not in DISCRIMINATOR_LOSSES:
            raise ValueError(f"loss '{self.loss}' unknown; choose {DISCRIMINATOR_LOSSES}")
        if self.epochs < 1 or self.batch_size < 1 or self.lr <= 0:
            raise ValueError("epochs is out of range (epochs, batch_size >= 1, lr > 0)")


@dataclass
class GanSettings:
    generator: GeneratorSettings = field(default_factory=GeneratorSettings)
    discriminator: DiscriminatorSettings = field(default_factory=DiscriminatorSettings)


class FedGOClient(ClientAlgorithm):
    """FedAvg's local training in the rounds, plus the pre-FL discriminator (Alg. 3)."""

    name = "fedgo"
    Config = GanSettings
    messages = {DISCRIMINATOR_MESSAGE: "train_discriminator"}

    def train_discriminator(self, job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
        """Alg. 3 for one client: train D_k against the received generator, once per run."""
        gs = job.params
        shape = job.data.input_shape
        gen = build_generator(
            gs.generator.name, gs.generator.latent_dim, shape, **gs.generator.model_kwargs()
        )
        gen.load_state_dict(job.content[GENERATOR_KEY].to_torch_state_dict())
        disc = build_discriminator(
            gs.discriminator.name,
            shape,
            seed=derive_seed(job.cfg.seed, "disc-init", job.partition_id),
        )
        stats = train_discriminator(
            disc,
            gen,
            job.data,
            epochs=gs.discriminator.epochs,
            batch_size=gs.discriminator.batch_size,
            lr=gs.discriminator.lr,
            latent_dim=gs.generator.latent_dim,
            # The discriminator is trained once per run: its rng does not depend on a round.
            rng=make_rng(job.cfg.seed, "disc", job.partition_id),
            device=job.device,
            augment=job.cfg.data.augment,
            loss=gs.discriminator.loss,
        )
        disc.cpu()
        metrics = {f"disc_{k}": float(v) for k, v in stats.items() if k != "num_examples"}
        return {ARRAYS: ArrayRecord(disc.state_dict())}, metrics
