"""Client architectures other than the global model's (``model.client_models``).

One-shot FL's model market and Co-Boosting (Dai et al., ICLR 2024) let clients train
architectures other than ``model.name``. :class:`ClientArchitectures`, owned by a strategy as
``self.architectures``, knows them: the seeded initial model of each (built once from the
server's data bundle, the server's own random stream kept), what each client is sent
(:meth:`~ClientArchitectures.initial_record`) and what its reply must match
(:meth:`~ClientArchitectures.reference`). A strategy that averages parameters refuses such
clients (:func:`homogeneous_only` names why). With ``model.client_models`` empty nothing here
costs anything per round.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import numpy as np
import torch
from flwr.app import ArrayRecord
from torch import nn

from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.learning.task import client_model_name, heterogeneous_models, new_model
from fedgo_flwr.runtime.messages import ARRAYS, to_record


def homogeneous_only(strategy: str, cfg: ExperimentConfig) -> str:
    """Why strategy ``strategy``, which averages parameters, refuses ``model.client_models``."""
    return (
        f"strategy {strategy} averages parameters: every client must train model.name "
        f"('{cfg.model.name}'); clients of other architectures need a strategy with "
        "supports_heterogeneous_models"
    )


class ClientArchitectures:
    """The experiment's model (``template``) and the seeded initial model, arrays and record of
    every other client architecture (``templates``, ``initial``, ``records``).

    ``cfg``: the experiment; ``model``: its model (copied to the CPU); ``bundle``: the server's
    data bundle, which sizes the other architectures (needed only with ``model.client_models``);
    ``supported``: whether the owning strategy ``strategy`` takes such clients."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        model: nn.Module,
        bundle: object | None,
        *,
        supported: bool,
        strategy: str,
    ) -> None:
        self.cfg = cfg
        self.main = cfg.model.name
        self.template = copy.deepcopy(model).cpu()
        self.heterogeneous = heterogeneous_models(cfg)
        self.templates: dict[str, nn.Module] = {}
        self.initial: dict[str, dict[str, np.ndarray]] = {}
        self.records: dict[str, ArrayRecord] = {}
        if not self.heterogeneous:
            return
        if not supported:
            raise ValueError(f"model.client_models: {homogeneous_only(strategy, cfg)}")
        if bundle is None:
            raise ValueError(
                "model.client_models: the server needs its data bundle (ServerResources) "
                "to build the clients' architectures"
            )
        names = {client_model_name(cfg, pid) for pid in range(cfg.data.num_clients)}
        for name in sorted(names - {self.main}):
            with torch.random.fork_rng(devices=[]):  # the server's own random stream is kept
                built = new_model(cfg, bundle, name).cpu()
            self.templates[name] = built
            self.initial[name] = {k: v.detach().numpy() for k, v in built.state_dict().items()}
            self.records[name] = to_record(self.initial[name])

    def model(self, arch: str | None = None) -> nn.Module:
        """A fresh copy of the experiment's model, or of client architecture ``arch`` (a name
        of ``model.client_models``), with its initial weights (to be replaced by the caller)."""
        if arch is None or arch == self.main:
            return copy.deepcopy(self.template)
        return copy.deepcopy(self.templates[arch])

    def of(self, pid: int) -> str:
        """The architecture client ``pid`` trains
        (:func:`fedgo_flwr.learning.task.client_model_name`)."""
        return client_model_name(self.cfg, pid)

    def initial_record(self, arch: str, arrays: ArrayRecord) -> ArrayRecord:
        """What clients of architecture ``arch`` start a round from by default: ``model.name``'s
        the global model (``arrays``); any other architecture's its seeded initial model
        (:func:`fedgo_flwr.learning.task.new_model`: seed ``derive_seed(cfg.seed,
        "model-init", arch)``), the same every round, so all clients of one architecture start
        equal (one-shot FL, e.g. Co-Boosting, needs no more)."""
        return arrays if arch == self.main else self.records[arch]

    def reference(
        self, pid: int, global_arrays: Mapping[str, np.ndarray]
    ) -> Mapping[str, np.ndarray]:
        """What client ``pid``'s reply must match in keys, shapes and dtypes: this round's
        global model (``global_arrays``), or the initial model of the client's own
        architecture."""
        if not self.heterogeneous:
            return global_arrays
        arch = self.of(pid)
        return global_arrays if arch == self.main else self.initial[arch]

    def trains_main(self, pid: int) -> bool:
        """Whether client ``pid`` trains ``model.name`` (the global model's architecture)."""
        return not self.heterogeneous or self.of(pid) == self.main

    def record_labels(self, pid: int, key: str) -> tuple[str, str]:
        """How a refused record ``key`` of client ``pid`` is named with ``model.client_models``."""
        if key == ARRAYS:
            return f"arrays (its model '{self.of(pid)}')", "that model"
        return f"ArrayRecord {key!r}", "the server's"
