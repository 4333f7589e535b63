"""FedDF and the ensemble-distillation family: FedAvg init + distillation of a weighted ensemble.

Lin, Kong, Stich, Jaggi, "Ensemble Distillation for Robust Model Fusion in Federated Learning",
NeurIPS 2020, Alg. 1: each round the server model starts from the n_k-weighted average of the
client models and is distilled on unlabeled server data towards the clients' ensemble
(AVGLOGITS: softmax of the averaged logits). The FedGO paper (Jang et al., ICML 2025, Sec. 2 and
Alg. 1) generalises the average to a per-sample weighting ``w_k(x)``; this class implements that
general form, and the weighting is chosen by name (``strategy.weighting``):

- ``uniform`` (FedDF), ``data_size`` (n_k only: FedGO without discriminators),
  ``variance`` (Fed-ET), ``entropy`` (FedHKT/FedDS) need nothing but the teachers;
- ``oracle`` uses the true labels of the server set and the clients' class counts (FedGO
  Thm 3.4 under label skew): a simulation-only upper bound, never a deployable method;
- ``fedgo`` and ``domain`` (DaFKD) need client discriminators: ``strategies/fedgo.py``.

The distillation set is the server's unlabeled share of the training data (FedGO scenario D1).
The ``feddf`` distillation protocol holds out ``val_fraction`` of it, with labels, for early
stopping, as FedDF's reference code does; the ``fedgo`` protocol uses all of it, unlabeled.

Per round it records: ``distill_loss``, ``distill_steps``, ``teacher_time`` (teacher logits
and weights), ``distill_time`` and, every ``ensemble_eval_every`` rounds and in the last,
``init_test_accuracy``/``init_test_loss`` (the parameter average before distillation),
``ensemble_test_accuracy``/``ensemble_test_loss`` (the weighted ensemble of the round's client
models on the test split) and ``ensemble_eval_time``; with ``diagnostics``,
``pl_acc_<method>``: the pseudo-label accuracy on the server set under every available weighting
and the label oracle, for the same client models (the server set's labels are known in
simulation, never used for training).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.distill import (
    DistillConfig,
    TeacherBank,
    distill,
    num_views,
    predict_views,
    pseudo_label_targets,
)
from fedgo_flwr.rng import make_rng
from fedgo_flwr.training import evaluate
from fedgo_flwr.weighting import WEIGHTING_NAMES, WeightingInputs, compute_weights
from strategies.fedavg import FedAvg, Reply

NEEDS_DISCRIMINATORS = ("fedgo", "domain")
INITS = ("average", "previous")


@dataclass
class FedDFParams:
    """Parameters of the ensemble-distillation strategies (``strategy.<key>`` in YAML)."""

    weighting: str = "uniform"
    entropy_temperature: float = 1.0
    init: str = "average"
    val_fraction: float = 0.0
    ensemble_eval_every: int = 1
    diagnostics: bool = True
    teacher_batch_size: int = 128
    distill: DistillConfig = field(default_factory=DistillConfig)

    def __post_init__(self) -> None:
        if self.weighting not in WEIGHTING_NAMES:
            raise ValueError(f"weighting '{self.weighting}' unknown; choose {WEIGHTING_NAMES}")
        if self.init not in INITS:
            raise ValueError(f"init must be one of {', '.join(INITS)}")
        if not 0 <= self.val_fraction < 1:
            raise ValueError("val_fraction must be in [0, 1)")
        if self.distill.protocol == "feddf" and self.val_fraction == 0:
            raise ValueError("val_fraction must be > 0 for the feddf protocol (early stopping)")
        if self.ensemble_eval_every < 0:
            raise ValueError("ensemble_eval_every must be >= 0 (0: never)")
        if self.entropy_temperature <= 0 or self.teacher_batch_size < 1:
            raise ValueError("entropy_temperature must be > 0 and teacher_batch_size >= 1")


class FedDF(FedAvg):
    """Ensemble distillation with a per-sample weighting chosen by name."""

    name = "feddf"
    client_algorithm = "fedavg"
    Params = FedDFParams
    uses_discriminators = False

    @classmethod
    def check_params(cls, params: FedDFParams) -> None:
        if params.weighting in NEEDS_DISCRIMINATORS and not cls.uses_discriminators:
            raise ValueError(
                f"weighting '{params.weighting}' needs client discriminators: "
                "use strategy.name=fedgo"
            )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.check_params(self.params)
        res = self.resources
        if res is None:
            raise ValueError(f"{self.name} needs the server's data (ServerResources)")
        server_set = res.bundle.train.subset(res.partition.server)
        if len(server_set) == 0:
            raise ValueError(f"{self.name} needs server data: data.server_fraction is 0")
        rng = np.random.default_rng(self.cfg.seed)
        order = rng.permutation(len(server_set))
        n_val = int(round(self.params.val_fraction * len(server_set)))
        self.val_set = server_set.subset(order[:n_val]) if n_val else None
        self.distill_set: ArrayDataset = server_set.subset(np.sort(order[n_val:]))
        self.views = num_views(self.distill_set, self.params.distill.augment)
        # Known in simulation only; used for diagnostics and the oracle, never for training.
        self.distill_labels: Tensor | None = torch.as_tensor(self.distill_set.y)
        self.class_counts = torch.as_tensor(
            res.partition.histogram(res.bundle.train.y, res.bundle.train.num_classes),
            dtype=torch.float64,
        )
        self.scratch = self.model_factory()
        self.student = self.model_factory()
        self.previous: dict[str, np.ndarray] | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"previous": self.previous}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.previous = state.get("previous")

    # -- weighting -------------------------------------------------------------------------
    def disc_logits(self, pids: list[int], split: str) -> Tensor | None:
        """``(K, V, N)`` discriminator logits of clients ``pids`` (none for plain FedDF)."""
        return None

    def weights(
        self,
        name: str,
        logits: Tensor,
        replies: list[Reply],
        split: str,
        labels: Tensor | None,
        params: dict | None = None,
    ) -> Tensor:
        """``(K, V, N)`` weights of method ``name`` for teacher logits ``(K, V, N, C)``."""
        pids = [r.partition_id for r in replies]
        disc = self.disc_logits(pids, split)
        if params is None:
            params = {"temperature": self.params.entropy_temperature} if name == "entropy" else {}
            if name in NEEDS_DISCRIMINATORS:
                params = self.discriminator_params(name)
        per_view = []
        for v in range(logits.shape[1]):
            inputs = WeightingInputs(
                logits=logits[:, v],
                num_examples=torch.tensor([float(r.num_examples) for r in replies]),
                disc_logits=None if disc is None else disc[:, v],
                labels=labels if name == "oracle" else None,
                class_counts=self.class_counts[pids] if name == "oracle" else None,
            )
            per_view.append(compute_weights(name, inputs, **params))
        return torch.stack(per_view, dim=1)

    def discriminator_params(self, name: str) -> dict:
        return {}

    def diagnostic_weightings(self) -> list[tuple[str, str, dict | None]]:
        """``(metric suffix, method, params or None for the configured ones)`` to diagnose."""
        return [(n, n, None) for n in ("uniform", "data_size", "variance", "entropy", "oracle")]

    # -- aggregation -----------------------------------------------------------------------
    def begin_round(self, server_round: int) -> None:
        super().begin_round(server_round)
        self.bank = TeacherBank(
            self.distill_set,
            augment=self.params.distill.augment,
            batch_size=self.params.teacher_batch_size,
        )
        every = self.params.ensemble_eval_every
        self.ensemble_eval = every > 0 and (
            server_round % every == 0 or server_round == self.cfg.rounds
        )
        self.test_logits: dict[int, Tensor] = {}
        self.teacher_time = self.eval_time = 0.0

    def absorb(self, server_round: int, reply: Reply) -> None:
        """Add the model to the running average and turn it into teacher logits; the model
        itself is not kept (one client model in memory at a time)."""
        super().absorb(server_round, reply)
        res = self.resources
        assert res is not None
        t0 = time.perf_counter()
        self.scratch.load_state_dict(self.to_state(reply.arrays))
        self.bank.add(self.scratch, res.device, key=reply.partition_id)
        self.teacher_time += time.perf_counter() - t0
        if self.ensemble_eval:
            t0 = time.perf_counter()
            self.test_logits[reply.partition_id] = predict_views(
                self.scratch, res.bundle.test, 1, self.params.teacher_batch_size, res.device
            )
            self.eval_time += time.perf_counter() - t0

    def aggregate(self, server_round: int, replies: list[Reply]) -> dict[str, np.ndarray]:
        res = self.resources
        assert res is not None
        device = res.device
        average = self.running.result()
        init = average if self.params.init == "average" or self.previous is None else self.previous
        ensemble_eval, eval_time = self.ensemble_eval, self.eval_time

        t0 = time.perf_counter()
        bank = self.bank
        logits = bank.logits
        distill_labels = self.distill_labels
        weights = self.weights(self.params.weighting, logits, replies, "distill", distill_labels)
        targets = pseudo_label_targets(logits, weights, self.params.distill.temperature)
        metrics = {"teacher_time": self.teacher_time + time.perf_counter() - t0}

        if self.params.diagnostics and distill_labels is not None:
            for suffix, name, params in self.diagnostic_weightings():
                w = self.weights(name, logits[:, :1], replies, "distill", distill_labels, params)
                pred = (w[:, 0].unsqueeze(-1) * logits[:, 0]).sum(0).argmax(-1)
                metrics[f"pl_acc_{suffix}"] = (pred == distill_labels).float().mean().item()
        if ensemble_eval:
            t_eval = time.perf_counter()
            tl = torch.stack([self.test_logits[r.partition_id] for r in replies])  # (K,1,N,C)
            test_labels = torch.as_tensor(res.bundle.test.y)
            w = self.weights(self.params.weighting, tl, replies, "test", test_labels)
            mixed = (w.unsqueeze(-1) * tl).sum(0)[0]
            metrics["ensemble_test_accuracy"] = (
                (mixed.argmax(-1) == test_labels).float().mean().item()
            )
            metrics["ensemble_test_loss"] = F.cross_entropy(mixed, test_labels).item()

        self.student.load_state_dict(self.to_state(init))
        if ensemble_eval:
            loss, acc = evaluate(self.student, res.bundle.test, self.cfg.eval.batch_size, device)
            metrics.update(init_test_accuracy=acc, init_test_loss=loss)
            metrics["ensemble_eval_time"] = eval_time + time.perf_counter() - t_eval
        result = distill(
            self.student,
            self.distill_set,
            targets,
            self.params.distill,
            server_round=server_round,
            rng=make_rng(self.cfg.seed, "distill", server_round),
            device=device,
            validate=self.validate if self.val_set is not None else None,
        )
        metrics.update(
            distill_loss=result.loss, distill_steps=result.steps, distill_time=result.seconds
        )
        self.last_round.update(metrics)
        self.bank, self.test_logits = None, {}
        out = {k: v.detach().cpu().numpy() for k, v in self.student.state_dict().items()}
        self.previous = out
        return out

    def validate(self, model: nn.Module) -> float:
        assert self.val_set is not None and self.resources is not None
        return evaluate(model, self.val_set, self.cfg.eval.batch_size, self.resources.device)[1]

    @staticmethod
    def to_state(arrays: dict[str, np.ndarray]) -> dict[str, Tensor]:
        return {k: torch.from_numpy(np.array(v, copy=True)) for k, v in arrays.items()}
