"""Client architectures other than the global model's (``model.client_models``).

One-shot FL's model market and Co-Boosting (Dai et al., ICLR 2024) let clients train
architectures other than ``model.name``. :class:`ClientArchitectures` is the part of
:class:`strategies.base.Strategy` that knows them: the seeded initial model of each (built once
from the server's data bundle, the server's own random stream kept), what each client is sent
(:meth:`~ClientArchitectures.arrays_for`) and what its reply must match
(:meth:`~ClientArchitectures.reference_arrays`). A strategy that averages parameters refuses
such clients (:meth:`~ClientArchitectures._homogeneous_only` names why). With
``model.client_models`` empty nothing here costs anything per round.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from flwr.app import ArrayRecord
from torch import nn

from fedgo_flwr.experiment.config import ExperimentConfig
from fedgo_flwr.experiment.task import client_model_name, new_model
from fedgo_flwr.runtime.messages import to_record


class ClientArchitectures:
    """Per-architecture templates of :class:`strategies.base.Strategy` (a mixin): the
    experiment's model (``_template``) and the seeded initial model, arrays and record of every
    other client architecture (``_arch_templates``, ``_arch_arrays``, ``_arch_records``)."""

    @classmethod
    def _homogeneous_only(cls, cfg: ExperimentConfig) -> str:
        return (
            f"strategy {cls.name} averages parameters: every client must train model.name "
            f"('{cfg.model.name}'); clients of other architectures need a strategy with "
            "supports_heterogeneous_models"
        )

    def _build_architectures(self) -> None:
        """The seeded initial model of every client architecture other than ``model.name``."""
        if not self.supports_heterogeneous_models:
            raise ValueError(f"model.client_models: {self._homogeneous_only(self.cfg)}")
        if self.resources is None:
            raise ValueError(
                "model.client_models: the server needs its data bundle (ServerResources) "
                "to build the clients' architectures"
            )
        names = {client_model_name(self.cfg, pid) for pid in range(self.cfg.data.num_clients)}
        for name in sorted(names - {self.cfg.model.name}):
            with torch.random.fork_rng(devices=[]):  # the server's own random stream is kept
                model = new_model(self.cfg, self.resources.bundle, name).cpu()
            self._arch_templates[name] = model
            self._arch_arrays[name] = {k: v.detach().numpy() for k, v in model.state_dict().items()}
            self._arch_records[name] = to_record(self._arch_arrays[name])

    def model_factory(self, arch: str | None = None) -> nn.Module:
        """A fresh copy of the experiment's model, or of client architecture ``arch`` (a name
        of ``model.client_models``), with its initial weights (to be replaced by the caller)."""
        if arch is None or arch == self.cfg.model.name:
            return copy.deepcopy(self._template)
        return copy.deepcopy(self._arch_templates[arch])

    def client_arch(self, pid: int) -> str:
        """The architecture client ``pid`` trains
        (:func:`fedgo_flwr.experiment.task.client_model_name`)."""
        return client_model_name(self.cfg, pid)

    def arrays_for(self, arch: str, arrays: ArrayRecord) -> ArrayRecord:
        """What clients of architecture ``arch`` start the round from.

        ``model.name``'s clients get the global model (``arrays``). Clients of any other
        architecture get that architecture's seeded initial model
        (:func:`fedgo_flwr.experiment.task.new_model`: seed ``derive_seed(cfg.seed, "model-init",
        arch)``), the same every round, so all clients of one architecture start equal (one-shot FL,
        e.g. Co-Boosting, needs no more). A strategy that keeps a model per architecture
        overrides this.
        """
        if arch == self.cfg.model.name:
            return arrays
        return self._arch_records[arch]

    def reference_arrays(self, pid: int) -> dict[str, np.ndarray]:
        """What client ``pid``'s reply must match in keys, shapes and dtypes: this round's
        global model, or the initial model of the client's own architecture."""
        if not self.heterogeneous:
            return self.global_arrays
        arch = self.client_arch(pid)
        return self.global_arrays if arch == self.cfg.model.name else self._arch_arrays[arch]
