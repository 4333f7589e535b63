"""The SCAFFOLD client: drift-corrected local steps and control-variate updates.

Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning", ICML 2020,
Alg. 1. Each local step uses the corrected gradient ``g + c - c_i`` (line 10). After training, the
client control variate is updated by option II (line 12):
``c_i+ = c_i - c + (x - y_i) / (K * lr)``, with ``K`` the number of local steps, and the client
returns ``delta_c_i = c_i+ - c_i`` (line 13) next to its model. ``c_i`` lives in the node's
persistent state (``context.state``) across rounds and starts at zero.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from flwr.app import ArrayRecord

from clients.base import ClientAlgorithm, ClientJob
from fedgo_flwr.learning.training import TrainStats
from fedgo_flwr.protocol.scaffold import CONTROL_DELTA_KEY, CONTROL_KEY

CLIENT_CONTROL_STATE = "scaffold_ci"  # c_i in context.state


def parameter_names(model: torch.nn.Module) -> list[str]:
    return [name for name, _ in model.named_parameters()]


def scaffold_client_update(
    c_i: dict[str, torch.Tensor],
    c: dict[str, torch.Tensor],
    x: dict[str, torch.Tensor],
    y: dict[str, torch.Tensor],
    steps: int,
    lr: float,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Option II of Alg. 1 line 12: returns ``(c_i+, delta c_i)``."""
    if steps < 1:
        zero = {k: torch.zeros_like(v) for k, v in c_i.items()}
        return {k: v.clone() for k, v in c_i.items()}, zero
    new = {k: c_i[k] - c[k] + (x[k] - y[k]) / (steps * lr) for k in c_i}
    return new, {k: new[k] - c_i[k] for k in c_i}


class ScaffoldClient(ClientAlgorithm):
    name = "scaffold"

    def grad_correction(self, job: ClientJob) -> Callable[[torch.nn.Module], None]:
        """Alg. 1 line 10: every local step uses ``g + c - c_i``."""
        correction = self.correction

        def correct(model: torch.nn.Module) -> None:
            for name, p in model.named_parameters():
                if p.grad is not None:
                    p.grad.add_(correction[name])

        return correct

    def train(self, job: ClientJob) -> tuple[TrainStats, dict[str, ArrayRecord]]:
        assert job.model is not None
        names = parameter_names(job.model)
        params = dict(job.model.named_parameters())
        x = {k: params[k].detach().cpu().clone() for k in names}
        c = job.content[CONTROL_KEY].to_torch_state_dict()
        if set(c) != set(names):
            raise ValueError("SCAFFOLD: the server control variate does not match the model")
        if CLIENT_CONTROL_STATE in job.state.array_records:
            c_i = job.state[CLIENT_CONTROL_STATE].to_torch_state_dict()
        else:
            c_i = {k: torch.zeros_like(v) for k, v in x.items()}
        self.correction = {k: (c[k] - c_i[k]).to(job.device) for k in names}
        stats, _ = super().train(job)
        y = {k: v.detach().cpu() for k, v in job.model.named_parameters()}
        c_i_new, delta = scaffold_client_update(c_i, c, x, y, stats.steps, job.cfg.train.lr)
        job.state[CLIENT_CONTROL_STATE] = ArrayRecord(c_i_new)
        return stats, {CONTROL_DELTA_KEY: ArrayRecord(delta)}
