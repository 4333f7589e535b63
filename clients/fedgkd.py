"""The FedGKD client: local training distilled towards the server's historical global models.

Yao et al., "FedGKD: Towards Heterogeneous Federated Learning via Global Knowledge
Distillation", IEEE Trans. Computers 2023 (arXiv 2107.00051). The server
(``strategies/fedgkd.py``, ``strategies/fedgkd_plus.py``) sends, besides the global model, a
teacher: the parameter average of its last M global models, or all M of them. The client
minimises

    CE(f_w(x), y) + kd_weight * sum_m beta_m KL( softmax(f_m(x)/tau) || softmax(f_w(x)/tau) )

on each (augmented) minibatch, with frozen teachers f_m in ``eval()`` mode and the server's
weights beta (a single teacher: beta = 1).

**The weight of the KD term.** FedGO (paper 001, App. E.2) describes it as "multiplies this
loss by gamma/2" (``kd_scale: paper``, the default: ``gamma/2 * KL``); the authors' code
(``CGCL-codes/FedGKD``, ``worker_fedgkd.py``) uses ``gamma * tau^2 * KL`` (``kd_scale: code``),
18 times more at FedGO's tau = 3. FedGO's values: M = 5, tau = 3, gamma = 0.001. The code adds
no KD term in round 1 (its teacher would be the initial model): ``kd_from_round`` (default 2).
The code's worker keeps the first teacher it ever got when M = 1 (a stale teacher); here every
round's teacher is the one the server sent.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord
from torch import nn

from clients.base import ClientAlgorithm, ClientJob
from fedgo_flwr.learning.training import Batch, BatchLoss, TrainStats
from fedgo_flwr.protocol.fedgkd import PROTOCOL, TEACHER_WEIGHTS_KEY, teacher_key

__all__ = ["FedGKDClient", "kd_term"]


def kd_term(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float
) -> torch.Tensor:
    """``KL(softmax(t/tau) || softmax(s/tau))``, the mean over the batch of per-sample KLs."""
    log_p_student = F.log_softmax(student_logits / temperature, dim=1)
    log_p_teacher = F.log_softmax(teacher_logits / temperature, dim=1)
    return F.kl_div(log_p_student, log_p_teacher, reduction="batchmean", log_target=True)


class FedGKDClient(ClientAlgorithm):
    name = "fedgkd"
    Config = PROTOCOL.Config

    def teachers(self, job: ClientJob) -> tuple[list[nn.Module], list[float]]:
        """The frozen teachers the server sent and their weights."""
        assert job.model is not None
        weights = [float(b) for b in job.content[TEACHER_WEIGHTS_KEY]["beta"]]
        models = []
        for m in range(len(weights)):
            teacher = copy.deepcopy(job.model)
            teacher.load_state_dict(job.content[teacher_key(m)].to_torch_state_dict())
            teacher.to(job.device).eval().requires_grad_(False)
            models.append(teacher)
        return models, weights

    def batch_loss(self, job: ClientJob) -> BatchLoss | None:
        p = job.params
        self.kd_sum, self.kd_batches = 0.0, 0
        if p.gamma == 0 or job.server_round < p.kd_from_round:
            return None
        teachers, beta = self.teachers(job)
        factor = p.kd_weight()

        def term(batch: Batch) -> torch.Tensor:
            kd = batch.logits.new_zeros(())
            for teacher, b in zip(teachers, beta, strict=True):
                with torch.no_grad():
                    t = teacher(batch.x)
                kd = kd + b * kd_term(batch.logits, t, p.temperature)
            self.kd_sum += kd.item()
            self.kd_batches += 1
            return factor * kd

        return term

    def train(self, job: ClientJob) -> tuple[TrainStats, dict[str, ArrayRecord]]:
        stats, extra = super().train(job)
        if self.kd_batches:
            stats.metrics["kd_loss"] = self.kd_sum / self.kd_batches
        return stats, extra
