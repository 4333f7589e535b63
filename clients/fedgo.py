"""FedGO client: FedAvg's local training, and a discriminator trained once (pre-FL stage).

Jang, Park, Lee, ICML 2025, Alg. 3 (App. D): client k receives the generator G, trains its
discriminator D_k for ``epochs`` with the vanilla GAN loss (local data labelled 1, samples of
the frozen G labelled 0) and sends D_k back (message ``train.discriminator``). In the FL rounds
the client trains as in FedAvg.
The discriminator outputs raw logits; the server turns them into odds (``fedgo_flwr.weighting``).

Beyond the paper (``strategy.discriminator.reference``, :class:`~fedgo_flwr.gan.settings.
DiscriminatorConfig`): the negatives may instead be the server's unlabeled images, sent in the
same message (``reference``), or a mix of both; the message then carries only what is used.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord

from clients.base import ClientAlgorithm, ClientJob
from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.gan import fedgan_generator_steps, train_discriminator, train_wgan_gp
from fedgo_flwr.protocol.fedgo import (
    CRITIC_KEY,
    DISCRIMINATOR_MESSAGE,
    FEDGAN_MESSAGE,
    GENERATOR_KEY,
    PROTOCOL,
    REFERENCE_KEY,
)
from fedgo_flwr.runtime.messages import ARRAYS
from fedgo_flwr.runtime.rng import derive_seed, make_rng


class FedGOClient(ClientAlgorithm):
    """FedAvg's local training in the rounds, plus the pre-FL discriminator (Alg. 3)."""

    name = "fedgo"
    Config = PROTOCOL.Config
    messages = {DISCRIMINATOR_MESSAGE: "train_discriminator", FEDGAN_MESSAGE: "train_fedgan"}

    def train_fedgan(self, job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
        """One client's FedGAN round (scenario G3, ``strategies/_fedgan.py``): the received
        generator and critic trained with WGAN-GP for ``generator.local_epochs`` passes of the
        critic over the local data (:func:`~fedgo_flwr.gan.fedgan_generator_steps`), fresh
        Adam states; both go back. ``job.rng`` depends on the round and the client."""
        gp = job.params.generator
        shape = job.data.input_shape
        gen = gp.build(shape, seed=0)  # the weights are the server's; seeded: no global RNG
        gen.load_state_dict(job.content[GENERATOR_KEY].to_torch_state_dict())
        critic = gp.build_critic(shape, seed=0)
        critic.load_state_dict(job.content[CRITIC_KEY].to_torch_state_dict())
        steps = fedgan_generator_steps(len(job.data), gp.batch_size, gp.local_epochs, gp.n_critic)
        stats = train_wgan_gp(
            gen,
            critic,
            job.data,
            steps=steps,
            **gp.wgan_kwargs(),
            rng=job.rng,
            device=job.device,
            augment=job.cfg.data.augment,
        )
        records = {
            GENERATOR_KEY: ArrayRecord(gen.cpu().state_dict()),
            CRITIC_KEY: ArrayRecord(critic.cpu().state_dict()),
        }
        return records, {f"gan_{k}": float(v) for k, v in stats.items()}

    def train_discriminator(self, job: ClientJob) -> tuple[dict[str, ArrayRecord], dict]:
        """Alg. 3 for one client: train D_k against the received generator (and/or the
        server's reference images, ``discriminator.reference``), once per run."""
        gs = job.params
        dp = gs.discriminator
        shape = job.data.input_shape
        gen = None
        if GENERATOR_KEY in job.content.array_records:
            # The server's builder (strategy.generator.name, or its module: importable here too).
            gen = gs.generator.build(shape, seed=derive_seed(job.cfg.seed, "gen-init"))
            gen.load_state_dict(job.content[GENERATOR_KEY].to_torch_state_dict())
        reference = None
        if REFERENCE_KEY in job.content.array_records:
            x = job.content[REFERENCE_KEY][REFERENCE_KEY].numpy()
            reference = ArrayDataset(
                x=x,
                y=np.zeros(len(x), dtype=np.int64),
                num_classes=job.data.num_classes,
                flip=job.data.flip,
            )
        disc = dp.build(shape, seed=derive_seed(job.cfg.seed, "disc-init", job.partition_id))
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
            loss=dp.loss,
            reference=reference,
            mixture={"generator": 0.0, "server": 1.0, "mixture": dp.mixture}[dp.reference],
            label_smoothing=dp.label_smoothing,
            patience=dp.patience,
            holdout=dp.holdout,
        )
        disc.cpu()
        metrics = {f"disc_{k}": float(v) for k, v in stats.items() if k != "num_examples"}
        return {ARRAYS: ArrayRecord(disc.state_dict())}, metrics
