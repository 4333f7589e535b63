"""The FedUV client: local training with classifier-variance and representation-uniformity terms.

Son et al., "FedUV: Uniformity and Variance for Heterogeneous Federated Learning", CVPR 2024
(arXiv 2402.18372). Each client minimises

    CE + variance_weight * L_var + uniformity_weight * L_unif

so that its local model behaves as if its data were IID (FedGO, paper 001, App. E.2: "the
uniformity term (weighted by lambda) and the variance term (weighted by alpha)", lambda = 0.5,
alpha = 2.5, FedUV's own defaults; the server is FedAvg's).

- **Variance** (:func:`variance_term`): ``mean_c ReLU(gamma - std_b softmax(s)_{b,c})``, the
  dimension-wise standard deviation of the batch's class probabilities held above gamma, the
  std of one-hot outputs over a batch that holds every class once: ``gamma = 1/sqrt(C)``.
- **Uniformity** (:func:`uniformity_term`): ``mean_{i<j} exp(-||z_i - z_j||^2 / sigma)`` over
  the features ``z`` that enter the classifier's output layer (:mod:`fedgo_flwr.models.features`).

Only the paper's abstract could be read here, so the terms follow the authors' code
(``sonhamin/FedUV``, ``algs/feduv.py``, ``UVReg``): unbiased batch std; gamma =
``eye(C).std(0).mean()`` (= 1/sqrt(C)); features **not** L2-normalised, no log, and the bandwidth
sigma the batch's median non-zero squared distance, *not* detached (``bandwidth: median``,
``detach_bandwidth: false``, the defaults). The code's features are the output of a projector
MLP that this project's models do not have; here they are the output layer's input. For the
"hyperspherical" reading of the paper's words (Wang & Isola's uniformity on the unit sphere)
``bandwidth: fixed`` uses L2-normalised features and ``exp(-t ||z_i - z_j||^2)``. A batch whose
features are all equal has no non-zero distance: the median term is then 0 (the code gives NaN).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord

from clients.base import ClientAlgorithm, ClientJob
from fedgo_flwr.learning.training import Batch, BatchLoss, TrainStats
from fedgo_flwr.protocol import declaration

__all__ = ["FedUVClient", "iid_gamma", "uniformity_term", "variance_term"]


def iid_gamma(num_classes: int) -> float:
    """The std of a class's one-hot output over a batch holding each class once: 1/sqrt(C)."""
    return float(torch.eye(num_classes).std(dim=0).mean())


def variance_term(logits: torch.Tensor, gamma: float) -> torch.Tensor:
    """``mean_c ReLU(gamma - std_b softmax(logits)_{b,c})`` (unbiased std over the batch)."""
    if logits.shape[0] < 2:
        return logits.sum() * 0.0
    std = F.softmax(logits, dim=1).std(dim=0)
    return F.relu(gamma - std).mean()


def uniformity_term(
    z: torch.Tensor, bandwidth: str = "median", t: float = 2.0, detach: bool = False
) -> torch.Tensor:
    """``mean_{i<j} exp(-||z_i - z_j||^2 / sigma)``, sigma the median non-zero squared distance
    (``median``), or ``mean_{i<j} exp(-t ||u_i - u_j||^2)`` with ``u = z / ||z||`` (``fixed``)."""
    z = z.flatten(1)
    if z.shape[0] < 2:
        return z.sum() * 0.0
    if bandwidth == "fixed":
        return torch.pdist(F.normalize(z, dim=1), p=2).pow(2).mul(-t).exp().mean()
    d2 = torch.pdist(z, p=2).pow(2)
    nonzero = d2[d2 != 0]
    if nonzero.numel() == 0:
        return z.sum() * 0.0
    sigma = torch.median(nonzero)
    if detach:
        sigma = sigma.detach()
    return d2.mul(-1 / sigma).exp().mean()


class FedUVClient(ClientAlgorithm):
    name = "feduv"
    Config = declaration("feduv").Config
    uses_features = True

    def batch_loss(self, job: ClientJob) -> BatchLoss | None:
        p = job.params
        gamma = p.gamma if p.gamma is not None else iid_gamma(job.data.num_classes)
        sums = self.sums = {"uv_var": 0.0, "uv_unif": 0.0, "batches": 0}

        def term(batch: Batch) -> torch.Tensor:
            var = variance_term(batch.logits, gamma)
            assert batch.features is not None
            unif = uniformity_term(batch.features, p.bandwidth, p.t, p.detach_bandwidth)
            sums["uv_var"] += var.item()
            sums["uv_unif"] += unif.item()
            sums["batches"] += 1
            return p.variance_weight * var + p.uniformity_weight * unif

        return term

    def train(self, job: ClientJob) -> tuple[TrainStats, dict[str, ArrayRecord]]:
        stats, extra = super().train(job)
        n = max(self.sums["batches"], 1)
        stats.metrics.update(uv_var=self.sums["uv_var"] / n, uv_unif=self.sums["uv_unif"] / n)
        return stats, extra
