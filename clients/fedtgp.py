"""The FedTGP client: local training pulled towards the server's global class prototypes.

Zhang et al., "FedTGP: Trainable Global Prototypes with Adaptive-Margin-Enhanced Contrastive
Learning for Data and Model Heterogeneity in Federated Learning", AAAI 2024. Each client
minimises

    CE(head(z), y) + lam * MSE(z, P_y)

on each minibatch, where z is the feature that enters the model's output layer
(:mod:`fedgo_flwr.models.features`) and P_y the server's global prototype of the sample's class (no
term in round 1, before any prototype exists). After training it uploads, for every class it
holds, the mean feature of its samples of that class (``eval()`` mode, no augmentation) and the
class counts: the server trains its prototypes on them (``strategies/fedtgp.py``).

Only the AAAI slides could be read here; the term follows the authors' code
(``TsingZ0/FedTGP``, ``clienttgp.py``): ``nn.MSELoss`` (the mean over the batch and the feature
dimension), "following FedProto's official implementation". ``distance: l2`` uses the mean
Euclidean distance ``mean_b ||z_b - P_{y_b}||`` instead. FedGO (paper 001, App. E.2) ran lam =
0.001 ("the contrastive loss was weighted by lambda = 0.001"; in the code lam weights this
client term, and that is the reading here).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord

from clients.base import ClientAlgorithm, ClientJob
from fedgo_flwr.data import batches
from fedgo_flwr.learning.training import Batch, BatchLoss, TrainStats
from fedgo_flwr.models.features import FeatureTap
from fedgo_flwr.protocol.fedtgp import GLOBAL_PROTOS_KEY, PROTOCOL, PROTOS_KEY
from fedgo_flwr.runtime.kernels import place
from fedgo_flwr.runtime.messages import to_numpy, to_record

__all__ = ["FedTGPClient", "class_prototypes", "prototype_term"]


def prototype_term(
    z: torch.Tensor, y: torch.Tensor, protos: torch.Tensor, distance: str = "mse"
) -> torch.Tensor:
    """``MSE(z, protos[y])`` (mean over batch and features) or ``mean_b ||z_b - protos[y_b]||``."""
    target = protos[y]
    if distance == "l2":
        return (z - target).pow(2).sum(dim=1).add(1e-12).sqrt().mean()
    return F.mse_loss(z, target)


@torch.no_grad()
def class_prototypes(
    model: torch.nn.Module, data, batch_size: int, device: torch.device
) -> tuple[np.ndarray, np.ndarray]:
    """Per-class mean feature ``(C, d)`` (zero rows for absent classes) and counts ``(C,)`` of
    ``data`` under ``model`` in ``eval()`` mode, without augmentation."""
    place(model, device).eval()
    sums: torch.Tensor | None = None
    counts = torch.zeros(data.num_classes, dtype=torch.float64)
    with FeatureTap(model) as tap:
        for x, y in batches(data, batch_size, shuffle=False, device=device):
            z = tap.read(model(x)).double().cpu()
            if sums is None:
                sums = torch.zeros(data.num_classes, z.shape[1], dtype=torch.float64)
            sums.index_add_(0, y.cpu(), z)
            counts += torch.bincount(y.cpu(), minlength=data.num_classes).double()
    assert sums is not None, "no data"
    means = sums / counts.clamp(min=1).unsqueeze(1)
    return means.float().numpy(), counts.long().numpy()


class FedTGPClient(ClientAlgorithm):
    name = "fedtgp"
    Config = PROTOCOL.Config
    uses_features = True

    def batch_loss(self, job: ClientJob) -> BatchLoss | None:
        p = job.params
        self.term_sum, self.term_batches = 0.0, 0
        if p.lam == 0 or GLOBAL_PROTOS_KEY not in job.content.array_records:
            return None
        protos = to_numpy(job.content[GLOBAL_PROTOS_KEY])["protos"]
        protos = torch.as_tensor(protos, dtype=torch.float32, device=job.device)

        def term(batch: Batch) -> torch.Tensor:
            assert batch.features is not None
            value = prototype_term(batch.features, batch.y, protos, p.distance)
            self.term_sum += value.item()
            self.term_batches += 1
            return p.lam * value

        return term

    def train(self, job: ClientJob) -> tuple[TrainStats, dict[str, ArrayRecord]]:
        assert job.model is not None
        stats, extra = super().train(job)
        if self.term_batches:
            stats.metrics["proto_loss"] = self.term_sum / self.term_batches
        means, counts = class_prototypes(job.model, job.data, job.cfg.eval.batch_size, job.device)
        extra[PROTOS_KEY] = to_record({"protos": means, "counts": counts})
        return stats, extra
