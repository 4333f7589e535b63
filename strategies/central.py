"""Central training: one model trained on the union of the clients' data (the upper bound).

FedGO (paper 001, Sec. 4.1) compares with "central training that trains the server model
directly using the entire client dataset" as the upper bound of Table 3 (85.33% on CIFAR-10
with ResNet-18), and gives no optimiser, epochs or schedule for it. Choices made here:

- the data is the union of every client's partition, the server's share excluded (it is not
  client data; the FL methods never see its labels);
- the optimiser is the clients' (``train``: FedGO's Adam 1e-3, batch 64, flips), kept with its
  state across rounds (one run, one Adam), and a "round" is ``epochs_per_round`` epochs over
  the union, so its accuracy curve has the other rows' x-axis (``rounds``);
- no client is sampled and no message is sent: the server trains (in simulation and
  deployment alike); the optimiser's state is in the checkpoint, so a resumed run equals an
  uninterrupted one.

Each round records ``train_loss``, ``train_time`` and ``central_examples``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from logging import INFO
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.supercore import log

from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.config.schema import Checker
from fedgo_flwr.learning.training import make_optimizer, train_local
from fedgo_flwr.runtime.messages import to_numpy, to_record
from fedgo_flwr.runtime.rng import make_rng
from strategies.base import Strategy


@dataclass
class CentralConfig:
    """``epochs_per_round``: epochs over the union of the clients' data per round."""

    epochs_per_round: int = 1

    def check(self, c: Checker) -> None:
        c.require("epochs_per_round", self.epochs_per_round >= 1, "must be >= 1")


class Central(Strategy):
    """The server trains the model on all client data; no client takes part."""

    name = "central"
    rolls_back = False  # no clients
    Config = CentralConfig

    @classmethod
    def preflight(cls, cfg: ExperimentConfig, c: Checker) -> None:
        c.at("data.", cfg.data).require(
            "server_fraction",
            cfg.data.server_fraction < 1,
            "must be < 1: central trains on the clients' data",
        )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        res = self.resources
        if res is None:
            raise ValueError("central needs the training data (ServerResources)")
        union = np.concatenate([np.asarray(idx) for idx in res.partition.clients])
        self.union = res.bundle.train.subset(union)
        if len(self.union) == 0:
            raise ValueError("central: the clients hold no data")
        self.train_cfg = dataclasses.replace(
            self.cfg.train, local_epochs=self.params.epochs_per_round
        )
        self.model = self.model_factory().to(res.device)
        self.optimizer = make_optimizer(self.model.parameters(), self.train_cfg)

    def summary(self) -> None:
        log(INFO, "\t└──> Central training on %d client samples", len(self.union))

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("optimizer") is not None:
            self.optimizer.load_state_dict(state["optimizer"])

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self.global_arrays = to_numpy(arrays)
        self.sampled = []
        return []

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        for _ in replies:  # none were asked for
            pass
        res = self.resources
        assert res is not None
        self.model.load_state_dict(
            {k: _tensor(v) for k, v in self.global_arrays.items()}, strict=True
        )
        stats = train_local(
            self.model,
            self.union,
            self.train_cfg,
            rng=make_rng(self.cfg.seed, "central", server_round),
            device=res.device,
            augment=self.cfg.data.augment,
            optimizer=self.optimizer,
        )
        self.last_round = {
            "train_loss": stats.loss,
            "train_time": stats.seconds,
            "central_examples": len(self.union),
        }
        out = {k: v.detach().cpu().numpy().copy() for k, v in self.model.state_dict().items()}
        return to_record(out), MetricRecord(self.last_round)


def _tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(array, copy=True))
