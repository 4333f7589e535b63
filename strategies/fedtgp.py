"""FedTGP: trainable global prototypes with an adaptive-margin contrastive loss.

Zhang et al., "FedTGP: Trainable Global Prototypes with Adaptive-Margin-Enhanced Contrastive
Learning for Data and Model Heterogeneity in Federated Learning", AAAI 2024. Clients
(``clients/fedtgp.py``) pull their features towards the global prototype of each sample's class
and upload their per-class mean features. The server keeps a small trainable network, the TGP
(:class:`TrainableGlobalPrototypes`: Embedding(C, d) -> Linear(d, h) -> ReLU -> Linear(h, d)),
whose output for class c is the global prototype P_c, and trains it each round on the uploaded
(prototype, class) pairs with

    L = CE(-(dist(p, P) + delta * onehot(c)), c),   dist_j = ||p - P_j||_2

(:func:`tgp_loss`), a contrastive loss whose margin adapts: delta = min(max_c gap_c, tau), with
gap_c the distance from class c's mean uploaded prototype to the nearest other class's
(:func:`adaptive_margin`).

FedGO's Table 3 reports a *server* test accuracy of a homogeneous model for FedTGP, whose
official version has no server model; so this strategy averages the client models as FedAvg and
trains the TGP beside, and each round records ``proto_test_accuracy`` (the averaged model's
nearest-prototype accuracy). Settings: FedGO App. E.2 and the official defaults. Uploads are
checked before they count (:meth:`FedTGP.absorb`: the server's class count and counts, the
model's feature size, finite values) and each prototype is bounded relative to the round's
(``strategy.aggregation.upload_bound``, :meth:`FedTGP.bounded_uploads`). Why this reading, the
authors' code it follows and its one deviation: ``docs/design/peers.md`` §5 and §8.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from torch import nn

from fedgo_flwr.config.schema import Checker
from fedgo_flwr.data import batches
from fedgo_flwr.learning.aggregation import bound_uploads, scale_upload, warn_bounded
from fedgo_flwr.models.features import FeatureTap
from fedgo_flwr.protocol.fedtgp import GLOBAL_PROTOS_KEY, PROTOS_KEY, FedTGPConfig
from fedgo_flwr.records.checkpoint import arrays_problem
from fedgo_flwr.runtime.messages import to_numpy, to_record
from fedgo_flwr.runtime.rng import derive_seed, make_rng
from strategies.base import BaseConfig, Reply, ReplyRejected
from strategies.fedavg import FedAvg

__all__ = [
    "FedTGP",
    "FedTGPServerConfig",
    "TrainableGlobalPrototypes",
    "adaptive_margin",
    "tgp_loss",
]

ABSENT_GAP = 1e9
"""The code's sentinel gap of a class nobody uploaded (replaced by the smallest gap)."""


@dataclass
class FedTGPServerConfig(FedTGPConfig, BaseConfig):
    """The client's ``lam`` / ``distance``, the TGP's training (``tgp_epochs`` per round, 0:
    frozen; ``tgp_batch_size``; ``tgp_lr``), ``margin_threshold`` (tau), ``tgp_hidden`` (null:
    the feature size d) and ``dist_eps``."""

    tgp_epochs: int = 1000
    tgp_batch_size: int = 10
    tgp_lr: float = 0.005
    margin_threshold: float = 100.0
    tgp_hidden: int | None = None
    dist_eps: float = 1e-12

    def check(self, c: Checker) -> None:
        c.require("tgp_epochs", self.tgp_epochs >= 0, "must be >= 0 (0: the TGP is not trained)")
        c.require("tgp_batch_size", self.tgp_batch_size >= 1, "must be >= 1")
        c.require("tgp_lr", math.isfinite(self.tgp_lr) and self.tgp_lr > 0, "must be > 0")
        c.require(
            "margin_threshold",
            math.isfinite(self.margin_threshold) and self.margin_threshold >= 0,
            "must be a finite number >= 0",
        )
        if self.tgp_hidden is not None:
            c.require("tgp_hidden", self.tgp_hidden >= 1, "must be >= 1 (or null: d)")
        c.require("dist_eps", math.isfinite(self.dist_eps) and self.dist_eps >= 0, "must be >= 0")


class TrainableGlobalPrototypes(nn.Module):
    """Embedding(C, d) -> Linear(d, h) -> ReLU -> Linear(h, d); ``forward()`` gives all C."""

    def __init__(self, num_classes: int, dim: int, hidden: int):
        super().__init__()
        self.embedding = nn.Embedding(num_classes, dim)
        self.middle = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU())
        self.fc = nn.Linear(hidden, dim)

    def forward(self) -> torch.Tensor:
        return self.fc(self.middle(self.embedding.weight))


def adaptive_margin(
    uploads: list[tuple[np.ndarray, np.ndarray]], num_classes: int, threshold: float
) -> tuple[float, np.ndarray]:
    """``(delta, gaps)`` from the round's uploads ``[(protos (C, d), counts (C,)), ...]``.

    The class means are unweighted over the clients that hold the class; gap_c is the
    distance to the nearest other class mean; a class nobody uploaded gets the smallest gap;
    ``delta = min(max_c gap_c, threshold)``.
    """
    means = {}
    for c in range(num_classes):
        rows = [p[c].astype(np.float64) for p, n in uploads if n[c] > 0]
        if rows:
            means[c] = np.mean(rows, axis=0)
    gaps = np.full(num_classes, ABSENT_GAP)
    present = sorted(means)
    for i in present:
        for j in present:
            if i > j:
                d = float(np.linalg.norm(means[i] - means[j]))
                gaps[i] = min(gaps[i], d)
                gaps[j] = min(gaps[j], d)
    smallest = gaps.min()
    gaps[gaps > 1e8] = smallest
    return float(min(gaps.max(), threshold)), gaps


def tgp_loss(
    protos: torch.Tensor,
    labels: torch.Tensor,
    generated: torch.Tensor,
    margin: float,
    eps: float = 1e-12,
) -> torch.Tensor:
    """``CE(-(dist + margin * onehot(y)), y)``, dist the Euclidean distances ``(B, C)`` from
    each uploaded prototype to every generated global prototype."""
    dist = (protos.unsqueeze(1) - generated.unsqueeze(0)).pow(2).sum(-1).add(eps).sqrt()
    dist = dist + margin * F.one_hot(labels, generated.shape[0]).to(dist.dtype)
    return F.cross_entropy(-dist, labels)


class FedTGP(FedAvg):
    """FedAvg's parameter average plus trainable global prototypes (FedGO's Table-3 reading)."""

    name = "fedtgp"
    client_algorithm = "fedtgp"
    Config = FedTGPServerConfig
    reply_metrics = ("proto_loss",)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        res = self.resources
        if res is None:
            raise ValueError("FedTGP needs the server's data and partition (ServerResources)")
        train = res.bundle.train
        self.num_classes = train.num_classes
        self.class_counts = res.partition.histogram(train.y, train.num_classes)
        probe = self.model_factory().eval()
        x, _ = next(batches(train.subset(np.arange(1)), 1, shuffle=False))
        with torch.no_grad(), FeatureTap(probe) as tap:
            self.dim = int(tap.read(probe(x)).shape[1])
        hidden = self.params.tgp_hidden or self.dim
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.cfg.seed, "tgp"))
            self.tgp = TrainableGlobalPrototypes(self.num_classes, self.dim, hidden)
        self.global_protos: np.ndarray | None = None  # (C, d), from round 1's aggregation on

    def state_dict(self) -> dict[str, Any]:
        return {
            "tgp": {k: v.clone() for k, v in self.tgp.state_dict().items()},
            "global_protos": self.global_protos,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("tgp") is not None:
            self.tgp.load_state_dict(state["tgp"])
        self.global_protos = state.get("global_protos")

    def state_problem(self, state: Mapping[str, Any], server_round: int) -> str | None:
        """The TGP network's state is this run's network's (keys, shapes, dtypes, finite); the
        global prototypes are ``None`` or a finite float32 ``(C, d)`` array, as the TGP
        network makes them."""
        tgp = state.get("tgp")
        if tgp is not None:
            if not isinstance(tgp, Mapping) or not all(
                isinstance(v, torch.Tensor) for v in tgp.values()
            ):
                return "'strategy_state.tgp': not a dict of tensors"
            arrays = {k: v.detach().cpu().numpy() for k, v in tgp.items()}
            template = {k: v.numpy() for k, v in self.tgp.state_dict().items()}
            problem = arrays_problem(arrays, template, "'strategy_state.tgp'", "the TGP", None)
            if problem:
                return problem
        protos = state.get("global_protos")
        if protos is None:
            return None
        template = {"protos": np.zeros((self.num_classes, self.dim), dtype=np.float32)}
        return arrays_problem(
            {"protos": protos} if isinstance(protos, np.ndarray) else protos,
            template,
            "'strategy_state.global_protos'",
            f"({self.num_classes}, {self.dim}) prototypes",
            None,
        )

    def train_record(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord
    ) -> RecordDict:
        record = super().train_record(server_round, arrays, config)
        if self.global_protos is not None:
            record[GLOBAL_PROTOS_KEY] = to_record({"protos": self.global_protos})
        return record

    def begin_round(self, server_round: int) -> None:
        super().begin_round(server_round)
        self.uploads: list[tuple[np.ndarray, np.ndarray]] = []
        self.upload_pids: list[int] = []

    def reply_templates(self, pid: int) -> dict[str, Mapping[str, np.ndarray]]:
        """The model, and ``(C, d)`` float32 prototypes with ``(C,)`` int64 class counts."""
        upload = {
            "protos": np.zeros((self.num_classes, self.dim), np.float32),
            "counts": np.zeros(self.num_classes, np.int64),
        }
        return {**super().reply_templates(pid), PROTOS_KEY: upload}

    def upload_of(self, reply: Reply) -> tuple[np.ndarray, np.ndarray]:
        """The reply's (protos, counts), checked (:class:`ReplyRejected` naming the problem)."""
        if PROTOS_KEY not in reply.content.array_records:
            raise ReplyRejected(f"no ArrayRecord '{PROTOS_KEY}'")
        arrays = to_numpy(reply.content[PROTOS_KEY])
        if set(arrays) != {"protos", "counts"}:
            raise ReplyRejected(f"'{PROTOS_KEY}' holds {sorted(arrays)}, not counts and protos")
        protos, counts = arrays["protos"], arrays["counts"]
        c, d = self.num_classes, self.dim
        if protos.shape != (c, d) or protos.dtype != np.float32:
            raise ReplyRejected(f"protos: {protos.dtype} {protos.shape}, expected float32 {(c, d)}")
        if not np.isfinite(protos).all():
            raise ReplyRejected("protos: values that are not finite")
        if counts.shape != (c,) or not np.issubdtype(counts.dtype, np.integer):
            raise ReplyRejected(f"counts: {counts.dtype} {counts.shape}, expected integers {(c,)}")
        own = self.class_counts[reply.partition_id]
        if not np.array_equal(counts, own):
            raise ReplyRejected(
                f"counts {counts.tolist()} differ from the server's class counts of partition "
                f"{reply.partition_id}: {own.tolist()}"
            )
        return protos, counts

    def absorb(self, server_round: int, reply: Reply) -> None:
        upload = self.upload_of(reply)  # before anything changes
        super().absorb(server_round, reply)
        self.uploads.append(upload)
        self.upload_pids.append(reply.partition_id)

    def aggregate(self, server_round: int, replies: list[Reply]) -> dict[str, np.ndarray]:
        out = super().aggregate(server_round, replies)
        self.uploads = self.bounded_uploads(server_round)
        margin, _ = adaptive_margin(self.uploads, self.num_classes, self.params.margin_threshold)
        loss = self.train_tgp(server_round, margin)
        self.tgp.eval()
        with torch.no_grad():
            self.global_protos = self.tgp().float().numpy().copy()
        self.last_round.update(
            tgp_margin=margin,
            tgp_loss=loss,
            proto_test_accuracy=self.prototype_accuracy(out),
        )
        self.uploads = []
        return out

    def bounded_uploads(self, server_round: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """The round's uploads under ``strategy.aggregation.upload_bound``, prototype by
        prototype: a class's mean feature whose norm exceeds the bound times the round's
        prototype norm is scaled down to it, with a WARNING naming the client and the class.
        Each is one training pair of the TGP and one term of a class mean in the margin, so
        each is bounded on its own (a client's whole upload has as many rows as it holds
        classes). The round's median is over the clients, of each client's median prototype
        norm (:func:`~fedgo_flwr.learning.aggregation.round_median`): a client holding more classes
        than the others must not set it."""
        rows = [(i, c) for i, (_, n) in enumerate(self.uploads) for c in np.flatnonzero(n > 0)]
        _, bounded = bound_uploads(
            [{"p": self.uploads[i][0][c]} for i, c in rows],
            self.aggregation.upload_bound,
            clients=[f"{self.upload_pids[i]} (class {c})" for i, c in rows],
            groups=[i for i, _ in rows],  # one vote per client in the median
        )
        warn_bounded(bounded, f"round {server_round}: the prototype")
        out = list(self.uploads)
        for b in bounded:
            i, c = rows[b.index]
            protos = out[i][0] if out[i][0] is not self.uploads[i][0] else out[i][0].copy()
            protos[c] = scale_upload({"p": protos[c]}, None, b.scale)["p"]
            out[i] = (protos, out[i][1])
        return out

    def train_tgp(self, server_round: int, margin: float) -> float:
        """``tgp_epochs`` epochs of SGD on the round's (prototype, class) pairs; the mean loss
        of the last epoch (NaN when there is nothing to train on)."""
        pairs = [(p[c], c) for p, n in self.uploads for c in range(self.num_classes) if n[c] > 0]
        p = self.params
        if not pairs or p.tgp_epochs == 0:
            return float("nan")
        x = torch.as_tensor(np.stack([q for q, _ in pairs]), dtype=torch.float32)
        y = torch.as_tensor([c for _, c in pairs], dtype=torch.long)
        optimizer = torch.optim.SGD(self.tgp.parameters(), lr=p.tgp_lr)
        rng = make_rng(self.cfg.seed, "tgp", server_round)
        self.tgp.train()
        last = float("nan")
        for _ in range(p.tgp_epochs):
            order = torch.randperm(len(y), generator=rng)
            total = 0.0
            for start in range(0, len(y), p.tgp_batch_size):
                idx = order[start : start + p.tgp_batch_size]
                loss = tgp_loss(x[idx], y[idx], self.tgp(), margin, p.dist_eps)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                total += loss.item() * len(idx)
            last = total / len(y)
        return last

    @torch.no_grad()
    def prototype_accuracy(self, arrays: dict[str, np.ndarray]) -> float:
        """Test accuracy of the nearest global prototype to the model's features."""
        res = self.resources
        assert res is not None and self.global_protos is not None
        model = self.model_factory()
        model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in arrays.items()})
        model.to(res.device).eval()
        protos = torch.as_tensor(self.global_protos, device=res.device)
        correct = 0
        test = res.bundle.test
        with FeatureTap(model) as tap:
            for x, y in batches(test, self.cfg.eval.batch_size, shuffle=False, device=res.device):
                z = tap.read(model(x))
                pred = torch.cdist(z.float(), protos).argmin(dim=1)
                correct += int((pred == y).sum())
        return correct / max(len(test), 1)
