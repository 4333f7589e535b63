"""FedGKD's server side: a buffer of the last M global models, sent to clients as teachers.

Yao et al., "FedGKD: Towards Heterogeneous Federated Learning via Global Knowledge
Distillation", IEEE Trans. Computers 2023; FedGO (paper 001, App. E.2): "an additional buffer of
length M on the server, where the server model is stored after each round. The server then
creates an additional model with averaged parameters from the models stored in the buffer and
sends this model to the clients each round."

:class:`GlobalModelBuffer` is a part that FedGKD (``strategies/fedgkd.py``, on FedAvg) and
FedGKD+ (``strategies/fedgkd_plus.py``, on FedDF) own as ``self.gkd``: after each round's
aggregation the strategy pushes the new global model (FedGKD+: the distilled one) into its FIFO
buffer of ``buffer_length`` models (:meth:`~GlobalModelBuffer.push`), and every training message
carries the teacher(s) (:meth:`~GlobalModelBuffer.add_teachers`, :mod:`clients.fedgkd`):

- ``teacher: average`` (FedGKD, what FedGO ran): one model, the uniform parameter average of the
  buffer, BatchNorm statistics included (the authors' code, ``master_fedgkd.py``), so the
  teacher of round t+1 averages the global models of rounds t-M+1..t, the one sent included;
- ``teacher: all`` (the paper's FedGKD-VOTE): all buffered models, the KD terms weighted by
  ``vote_weights``: ``uniform``, or ``val_loss``, beta = softmax(-val_loss / vote_temperature)
  of each model on the server's labelled validation split (the code's ``get_global_weights``;
  only where there is one: FedGKD+ with ``val_fraction > 0``). The authors' code of VOTE does
  not run (``docs/design/peers.md`` §1.2); this follows its intent.

Round 1 has an empty buffer: the teacher is the model being sent (the code's initial model), and
the client adds no KD term before ``kd_from_round`` (2). The buffer is in the checkpoint, so a
resumed run sends the teachers an uninterrupted one would. Each round records
``teacher_distance``, the L2 distance between the (first) teacher and the model sent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedgo_flwr.config.schema import Checker
from fedgo_flwr.learning.aggregation import RunningAverage
from fedgo_flwr.protocol.fedgkd import TEACHER_WEIGHTS_KEY, FedGKDConfig, teacher_key
from fedgo_flwr.runtime.messages import to_numpy, to_record

__all__ = ["GlobalModelBuffer", "GKDBufferConfig", "buffer_average"]

TEACHERS = ("average", "all")
VOTE_WEIGHTS = ("uniform", "val_loss")
MAX_BUFFER = 100


@dataclass
class GKDBufferConfig(FedGKDConfig):
    """The client's KD parameters and the server's ``buffer_length`` (M), ``teacher``
    (``average`` | ``all``), ``vote_weights`` and ``vote_temperature`` (``teacher: all``)."""

    buffer_length: int = 5
    teacher: str = "average"
    vote_weights: str = "uniform"
    vote_temperature: float = 1.0

    def check(self, c: Checker) -> None:
        c.require(
            "buffer_length",
            1 <= self.buffer_length <= MAX_BUFFER,
            f"must be in [1, {MAX_BUFFER}]",
        )
        c.choice("teacher", TEACHERS)
        c.choice("vote_weights", VOTE_WEIGHTS)
        c.require(
            "vote_temperature",
            math.isfinite(self.vote_temperature) and self.vote_temperature > 0,
            "must be a finite number > 0",
        )
        if self.vote_weights == "val_loss":
            c.require("teacher", self.teacher == "all", "must be 'all' for vote_weights val_loss")


def buffer_average(models: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The uniform parameter average of ``models``, each array cast back to its dtype."""
    avg = RunningAverage()
    for model in models:
        avg.add(model, 1.0)
    return avg.result()


def _distance(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> float:
    return math.sqrt(
        sum(
            float(np.sum((a[k].astype(np.float64) - b[k].astype(np.float64)) ** 2))
            for k in a
            if np.issubdtype(a[k].dtype, np.floating)
        )
    )


class GlobalModelBuffer:
    """The FIFO buffer of global models (``buffer``) and the teachers of every training
    message, under ``params`` (``buffer_length``, ``teacher``, ``vote_weights``,
    ``vote_temperature``); ``validation_loss``: a model's loss on the server's labelled
    validation split, for ``vote_weights: val_loss`` (FedGKD+ only; the config check refuses
    it elsewhere)."""

    def __init__(
        self,
        params: GKDBufferConfig,
        validation_loss: Callable[[dict[str, np.ndarray]], float] | None = None,
    ) -> None:
        self.params = params
        self.validation_loss = validation_loss
        self.buffer: list[dict[str, np.ndarray]] = []
        self.teacher_distance = math.nan  # of the latest message's first teacher

    def teachers(self, arrays: dict[str, np.ndarray]) -> tuple[list[dict], list[float]]:
        """The teacher models of the next round and their weights (the buffer, or the model
        being sent while it is empty)."""
        buffer = self.buffer or [arrays]
        if self.params.teacher == "average":
            return [buffer_average(buffer)], [1.0]
        if self.params.vote_weights == "val_loss":
            if self.validation_loss is None:
                raise ValueError("vote_weights val_loss needs a labelled validation split")
            losses = torch.tensor([self.validation_loss(m) for m in buffer], dtype=torch.float64)
            beta = F.softmax(-losses / self.params.vote_temperature, dim=0).tolist()
        else:
            beta = [1.0 / len(buffer)] * len(buffer)
        return list(buffer), beta

    def add_teachers(self, record: RecordDict, arrays: ArrayRecord) -> RecordDict:
        """``record``, a training message's content that sends ``arrays``, with the teachers
        and their weights; the distance of the first teacher to ``arrays`` is kept."""
        sent = to_numpy(arrays)
        models, beta = self.teachers(sent)
        for m, model in enumerate(models):
            record[teacher_key(m)] = to_record(model)
        record[TEACHER_WEIGHTS_KEY] = ConfigRecord({"beta": [float(b) for b in beta]})
        self.teacher_distance = _distance(models[0], sent)
        return record

    def push(self, model: Mapping[str, np.ndarray]) -> None:
        """A round's new global model into the buffer (a copy; the oldest leaves a full one)."""
        kept = {k: np.array(v, copy=True) for k, v in model.items()}  # never a view of a live model
        self.buffer = [*self.buffer, kept][-self.params.buffer_length :]

    def state_dict(self) -> dict[str, Any]:
        """The buffer, for the strategy's checkpoint state (``gkd_buffer``)."""
        return {"gkd_buffer": self.buffer}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the buffer from the strategy's checkpoint ``state``."""
        self.buffer = list(state.get("gkd_buffer") or [])

    def state_problem(
        self, state: Mapping[str, Any], model_problem: Callable[[Any, str], str | None]
    ) -> str | None:
        """Why ``state``'s buffer is not at most ``buffer_length`` models of ``model.name``
        (``model_problem(arrays, what)``: the strategy's check of one model), or ``None``."""
        buffer = state.get("gkd_buffer") or []
        if not isinstance(buffer, list):
            return "'strategy_state.gkd_buffer': not a list of models"
        if len(buffer) > self.params.buffer_length:
            return (
                f"'strategy_state.gkd_buffer': {len(buffer)} models, more than "
                f"strategy.buffer_length = {self.params.buffer_length}"
            )
        for i, arrays in enumerate(buffer):
            problem = model_problem(arrays, f"'strategy_state.gkd_buffer[{i}]'")
            if problem is not None:
                return problem
        return None
