"""FedGO client, pre-FL stage: train a discriminator once against the server's generator.

Jang, Park, Lee, ICML 2025, Alg. 3 (App. D): client k receives the generator G, trains its
discriminator D_k for ``epochs`` with the vanilla GAN loss (local data labelled 1, samples of
the frozen G labelled 0) and sends D_k back. In the FL rounds the client trains as in FedAvg.
The discriminator outputs raw logits; the server turns them into odds (``fedgo_flwr.weighting``).
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, RecordDict

from fedgo_flwr.config import ExperimentConfig, build_section
from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.gan import build_discriminator, build_generator, train_discriminator
from fedgo_flwr.gan.settings import GanConfig
from fedgo_flwr.rng import derive_seed, make_rng

GENERATOR_KEY = "generator"
DISCRIMINATOR_MESSAGE = "train.discriminator"


def gan_settings(cfg: ExperimentConfig) -> GanConfig:
    params = cfg.strategy.params
    return build_section(
        GanConfig,
        {"generator": params["generator"], "discriminator": params["discriminator"]},
        "strategy.",
    )


def train_client_discriminator(
    cfg: ExperimentConfig,
    partition_id: int,
    data: ArrayDataset,
    content: RecordDict,
    device: torch.device,
) -> tuple[ArrayRecord, dict[str, float]]:
    """Alg. 3 for one client: returns the discriminator's weights and training stats."""
    gs = gan_settings(cfg)
    shape = data.input_shape
    gen = build_generator(
        gs.generator.name, gs.generator.latent_dim, shape, **gs.generator.model_kwargs()
    )
    gen.load_state_dict(content[GENERATOR_KEY].to_torch_state_dict())
    disc = build_discriminator(
        gs.discriminator.name, shape, seed=derive_seed(cfg.seed, "disc-init", partition_id)
    )
    gen_rng = make_rng(cfg.seed, "disc", partition_id)
    stats = train_discriminator(
        disc,
        gen,
        data,
        epochs=gs.discriminator.epochs,
        batch_size=gs.discriminator.batch_size,
        lr=gs.discriminator.lr,
        latent_dim=gs.generator.latent_dim,
        rng=gen_rng,
        device=device,
        augment=cfg.data.augment,
        loss=gs.discriminator.loss,
    )
    disc.cpu()
    return ArrayRecord(disc.state_dict()), {k: float(v) for k, v in stats.items()}
