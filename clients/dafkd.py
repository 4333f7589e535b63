"""The DaFKD client: the classifier, a domain discriminator on its features and the generator,
trained together.

Wang et al., "DaFKD: Domain-aware Federated Knowledge Distillation", CVPR 2023. Each client's
local data is a "domain"; its discriminator D_k shares the classifier's trunk h (the features
that enter the output layer, :mod:`fedgo_flwr.models.features`) and adds a head d_k = Linear(d, 1):
D_k(x) = sigmoid(d_k(h(x))). Each local step (the authors' code, ``haozhaowang/DaFKD2023``,
``trainer/my_model_trainer_MTL.py``) minimises, over trunk, classifier and head,

    CE(f(x), y) + BCE(D_k(x), 1) + BCE(D_k(G(z)), 0) + gp_lambda * GP

with G's samples detached, then takes a non-saturating generator step on BCE(D_k(G(z)), 1) with
its own Adam (betas (0.5, 0.99), AMSGrad, as the code). GP is the gradient penalty of D_k on
interpolates of real and generated images (``gp_norm: sample``: the norm of each sample's
gradient, as in WGAN-GP; ``channel``: the code's ``gradients.norm(2, dim=1)`` over channels of
the image tensor, per pixel). The head is this client's own, kept across rounds in the node's
state (the code shares one head between all clients by accident, ``docs/design/peers.md``
§3.2) and uploaded with the model and the generator; the server evaluates D_k on its
distillation set (``strategies/dafkd.py``).

**Schedule.** FedGO describes DaFKD as training "the generator and discriminators at each
round" (paper 001, App. E.2 and G.2); the authors' code trains the discriminator terms only in
rounds 0-2 and the generator only in rounds 0-4, in the first 5 local epochs. ``disc_rounds``,
``generator_rounds`` and ``gan_epochs`` (0: all) give both; the default is every round and
epoch, FedGO's reading (the paper's body could not be read here). ``gan_schedule:
participations`` counts a client's own participations instead of rounds (under partial
participation "round < 3" leaves most clients' heads untrained).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord
from torch import nn

from clients.base import ClientAlgorithm, ClientJob
from fedgo_flwr.data import batches
from fedgo_flwr.learning.training import Batch, BatchLoss, TrainStats
from fedgo_flwr.models.features import FeatureTap
from fedgo_flwr.protocol.dafkd import DISC_HEAD_KEY, GENERATOR_KEY, PROTOCOL
from fedgo_flwr.runtime.messages import to_numpy, to_record
from fedgo_flwr.runtime.rng import derive_seed, make_rng

__all__ = ["DaFKDClient", "gradient_penalty"]

HEAD_STATE = "dafkd_head"
"""The head and the client's participation count in the node's state."""
GEN_BETAS = (0.5, 0.99)


def gradient_penalty(
    disc, real: torch.Tensor, fake: torch.Tensor, rng: torch.Generator, norm: str = "sample"
) -> torch.Tensor:
    """``mean((||grad_x D(x_hat)|| - 1)^2)`` on interpolates ``x_hat`` of ``real`` and ``fake``
    (``disc`` maps images to probabilities); the norm per sample or, as DaFKD's code, over the
    channel dimension per pixel (``channel``)."""
    alpha = torch.rand(real.shape[0], *([1] * (real.ndim - 1)), generator=rng).to(real.device)
    x_hat = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
    (grad,) = torch.autograd.grad(disc(x_hat).sum(), x_hat, create_graph=True)
    size = grad.flatten(1).norm(2, dim=1) if norm == "sample" else grad.norm(2, dim=1)
    return (size - 1).pow(2).mean()


class DaFKDClient(ClientAlgorithm):
    name = "dafkd"
    Config = PROTOCOL.Config

    def active(self, job: ClientJob, limit: int) -> bool:
        """Whether a GAN part with a limit of ``limit`` rounds (0: all) runs now."""
        count = (
            self.participation
            if job.params.gan_schedule == "participations"
            else (job.server_round)
        )
        return limit == 0 or count <= limit

    def train(self, job: ClientJob) -> tuple[TrainStats, dict[str, ArrayRecord]]:
        model, p = job.model, job.params
        assert model is not None
        pid, seed = job.partition_id, job.cfg.seed
        shape = tuple(job.data.input_shape)
        self.generator = p.generator.build(shape, seed=derive_seed(seed, "gen-init"))
        self.generator.to(job.device)
        self.generator.load_state_dict(job.content[GENERATOR_KEY].to_torch_state_dict())
        self.head, self.participation = self.load_head(job)
        self.head.to(job.device)
        self.gan_rng = make_rng(seed, "dafkd-gan", job.server_round, pid)
        self.head_opt = torch.optim.Adam(self.head.parameters(), lr=job.cfg.train.lr)
        self.gen_opt = torch.optim.Adam(
            self.generator.parameters(), lr=p.generator.lr, betas=GEN_BETAS, amsgrad=True
        )
        self.sums = {"d": 0.0, "d_n": 0, "g": 0.0, "g_n": 0}
        with FeatureTap(model) as self.tap:
            stats, extra = super().train(job)
        self.tap = None
        if self.sums["d_n"]:
            stats.metrics["gan_d_loss"] = self.sums["d"] / self.sums["d_n"]
        if self.sums["g_n"]:
            stats.metrics["gan_g_loss"] = self.sums["g"] / self.sums["g_n"]
        head = {k: v.detach().cpu() for k, v in self.head.state_dict().items()}
        job.state[HEAD_STATE] = ArrayRecord(
            {**head, "participations": torch.tensor(self.participation, dtype=torch.int64)}
        )
        extra[GENERATOR_KEY] = to_record(
            {k: v.detach().cpu().numpy() for k, v in self.generator.state_dict().items()}
        )
        extra[DISC_HEAD_KEY] = to_record({k: v.numpy() for k, v in head.items()})
        return stats, extra

    def load_head(self, job: ClientJob) -> tuple[nn.Linear, int]:
        """The client's head (seeded on its first participation) and its participation count
        including this one."""
        model = job.model
        assert model is not None
        x, _ = next(batches(job.data.subset(np.arange(1)), 1, shuffle=False, device=job.device))
        was_training = model.training
        model.eval()
        with torch.no_grad(), FeatureTap(model) as tap:
            dim = tap.read(model(x)).shape[1]
        model.train(was_training)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(job.cfg.seed, "dafkd-head", job.partition_id))
            head = nn.Linear(dim, 1)
        if HEAD_STATE in job.state.array_records:
            saved = to_numpy(job.state[HEAD_STATE])
            count = int(saved.pop("participations"))
            head.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in saved.items()})
            return head, count + 1
        return head, 1

    def disc_logit(self, x: torch.Tensor) -> torch.Tensor:
        """``d_k(h(x))``, the discriminator's logit (a forward pass of the model)."""
        assert self.tap is not None and self.job_model is not None
        return self.head(self.tap.read(self.job_model(x))).squeeze(1)

    def fake(self, n: int, device: torch.device) -> torch.Tensor:
        z = torch.randn(n, self.generator_latent, generator=self.gan_rng).to(device)
        return self.generator(z)

    def batch_loss(self, job: ClientJob) -> BatchLoss | None:
        p = job.params
        self.job_model = job.model
        self.generator_latent = p.generator.latent_dim
        if not self.active(job, p.disc_rounds):
            return None

        def term(batch: Batch) -> torch.Tensor:
            if p.gan_epochs and batch.epoch >= p.gan_epochs:
                return batch.logits.new_zeros(())
            assert self.tap is not None
            real_logit = self.head(self.tap.read(batch.logits)).squeeze(1)
            fake = self.fake(len(batch.y), batch.x.device).detach()
            fake_logit = self.disc_logit(fake)
            d_loss = F.binary_cross_entropy_with_logits(
                real_logit, torch.ones_like(real_logit)
            ) + F.binary_cross_entropy_with_logits(fake_logit, torch.zeros_like(fake_logit))
            if p.gp_lambda > 0:

                def disc(x: torch.Tensor) -> torch.Tensor:
                    return torch.sigmoid(self.disc_logit(x))

                gp = gradient_penalty(disc, batch.x, fake, self.gan_rng, p.gp_norm)
                d_loss = d_loss + p.gp_lambda * gp
            self.sums["d"] += d_loss.item()
            self.sums["d_n"] += 1
            return d_loss

        return term

    def after_step(self, job: ClientJob):
        p = job.params
        disc_on = self.active(job, p.disc_rounds)
        gen_on = self.active(job, p.generator_rounds)

        def step(batch: Batch) -> None:
            in_epochs = not p.gan_epochs or batch.epoch < p.gan_epochs
            if disc_on and in_epochs:
                self.head_opt.step()  # its gradients came with the classifier's objective
            self.head_opt.zero_grad(set_to_none=True)
            if not (gen_on and in_epochs):
                return
            logit = self.disc_logit(self.fake(len(batch.y), batch.x.device))
            g_loss = F.binary_cross_entropy_with_logits(logit, torch.ones_like(logit))
            params = list(self.generator.parameters())
            grads = torch.autograd.grad(g_loss, params)
            for param, grad in zip(params, grads, strict=True):
                param.grad = grad
            self.gen_opt.step()
            self.gen_opt.zero_grad(set_to_none=True)
            self.sums["g"] += g_loss.item()
            self.sums["g_n"] += 1

        return step
