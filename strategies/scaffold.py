"""SCAFFOLD: control variates that correct client drift.

Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning",
ICML 2020, Alg. 1. The server keeps a control variate ``c`` (one tensor per trainable
parameter, zero at start) and sends it with the model; clients (``clients/scaffold.py``) keep
their own ``c_i`` across rounds and return ``delta c_i``. The server then applies (lines 16-17)

    x <- x + lr_g * mean_{i in S} (y_i - x)
    c <- c + (1/N) * sum_{i in S} delta c_i

Non-trainable buffers (BatchNorm statistics) have no control variate and are averaged as in
FedAvg. With ``weighted: true`` the model update is n_k-weighted instead of the paper's
uniform mean. Option II of the client update assumes plain SGD; with momentum or Adam the
control variates are an approximation.

A reply's ``delta c_i`` must have the control variate's keys, shapes and dtype (float32), finite
values, and an L2 norm (over all tensors) of at most ``max_control_delta_norm``
(:class:`ScaffoldConfig`); otherwise the reply is dropped, so one client cannot make ``c``
infinite, which would be checkpointed and sent to every client.

``strategy.aggregation`` (:mod:`fedgo_flwr.learning.aggregation`) applies to the model update
(clipping, and the rule in place of ``mean_{i in S}`` above and of the buffers' average; median
and trimmed mean unweighted whatever ``weighted`` says). The control deltas get ``upload_bound``
and the rule, never ``clip_norm``; ``docs/architecture.md`` ("SCAFFOLD") has how, and why the
round's deltas are kept until it ends.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedgo_flwr.config.schema import Checker
from fedgo_flwr.learning.aggregation import bound_uploads, check_arrays, new_average, warn_bounded
from fedgo_flwr.learning.clipping import round_average
from fedgo_flwr.protocol import ModelFault
from fedgo_flwr.protocol.scaffold import CONTROL_DELTA_KEY, CONTROL_KEY
from fedgo_flwr.records.checkpoint import arrays_problem
from fedgo_flwr.runtime.messages import to_numpy, to_record
from strategies.base import BaseConfig, Reply, Strategy, update_norms


@dataclass
class ScaffoldConfig(BaseConfig):
    """``global_lr``: server step size lr_g; ``weighted``: n_k-weighted model update;
    ``max_control_delta_norm``: the largest L2 norm of a client's ``delta c_i`` the server takes.

    Why a bound, and why 1e6: with option II, ``c_i+ = (x - y_i) / (K lr) - c + c_i`` is the
    mean of the client's K local (corrected) step directions, so for plain SGD
    ``delta c_i = c_i+ - c_i`` is the difference of two mean minibatch gradients: its norm is
    at most twice the client's gradient norm. Honest clients of the shipped configs stay far
    below 1e6, with Adam too (its steps are ~lr per coordinate, so the norm grows like the square
    root of the parameter count); only a diverging run comes near it, and such a reply is better
    left out. Each accepted delta then moves ``c`` by at most ``bound * m / N`` per round (m
    replies, N clients), so ``c`` stays finite in float32 for any number of rounds. Raise it
    for models or data whose gradients are larger.
    """

    global_lr: float = 1.0
    weighted: bool = False
    max_control_delta_norm: float = 1e6

    def check(self, c: Checker) -> None:
        c.require("global_lr", self.global_lr > 0, "must be > 0")
        c.require(
            "max_control_delta_norm",
            math.isfinite(self.max_control_delta_norm) and self.max_control_delta_norm > 0,
            "must be a finite number > 0",
        )


class Scaffold(Strategy):
    name = "scaffold"
    client_algorithm = "scaffold"
    Config = ScaffoldConfig

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.control: dict[str, np.ndarray] | None = None

    def train_record(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord
    ) -> RecordDict:
        if self.control is None:
            self.control = {
                k: np.zeros_like(self.global_arrays[k], dtype=np.float32) for k in self.param_names
            }
        record = super().train_record(server_round, arrays, config)
        record[CONTROL_KEY] = to_record(self.control)
        return record

    def state_dict(self) -> dict[str, Any]:
        return {"control": self.control}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.control = state.get("control")

    def state_problem(self, state: Mapping[str, Any], server_round: int) -> str | None:
        """The control variate ``c`` must be ``None`` (no round has sent it yet) or one float32
        array per trainable parameter, shaped like it, of an L2 norm of at most
        ``server_round * sqrt(N) * max_control_delta_norm`` (N = ``data.num_clients``): each
        round adds ``sum_{i in S} delta c_i / N`` to ``c``, every delta at most
        ``max_control_delta_norm`` long; their sum is at most ``m <= N`` of them, and ``m``
        times the coordinate-wise median or trimmed mean is at most ``m * sqrt(m)`` of them, so
        a round moves ``c`` by at most ``sqrt(N)`` deltas' length. A longer ``c`` was never
        made by a run of this configuration; sent to the clients it would make their updates
        diverge."""
        control = state.get("control")
        if control is None:
            return None
        params = dict(self.architectures.template.named_parameters())
        template = {k: np.zeros(tuple(params[k].shape), dtype=np.float32) for k in self.param_names}
        what, of = "'strategy_state.control'", "the model's parameters"
        problem = arrays_problem(control, template, what, of, bound=None)
        if problem:
            return problem
        norm = math.sqrt(
            sum(float(np.sum(np.square(v, dtype=np.float64))) for v in control.values())
        )
        bound = server_round * math.sqrt(self.cfg.data.num_clients)
        bound *= self.params.max_control_delta_norm * (1 + 1e-6)  # float32 rounding
        if not norm <= bound:
            return (
                f"'strategy_state.control': L2 norm {norm:.3g} exceeds {bound:.3g}, the most "
                f"{server_round} rounds can make (strategy.max_control_delta_norm = "
                f"{self.params.max_control_delta_norm:g})"
            )
        return None

    def reply_templates(self, pid: int) -> dict[str, Mapping[str, np.ndarray]]:
        """The model, and the control delta shaped as the server's control variate."""
        assert self.control is not None
        return {**super().reply_templates(pid), CONTROL_DELTA_KEY: self.control}

    def check_reply(self, content: RecordDict) -> str | None:
        if CONTROL_DELTA_KEY not in content.array_records:
            return f"no ArrayRecord '{CONTROL_DELTA_KEY}'"
        assert self.control is not None
        delta = to_numpy(content[CONTROL_DELTA_KEY])
        problem = check_arrays(delta, self.control, CONTROL_DELTA_KEY)
        if problem is not None:
            return problem
        norm = math.sqrt(sum(float(np.sum(np.square(v, dtype=np.float64))) for v in delta.values()))
        bound = self.params.max_control_delta_norm
        if not norm <= bound:  # what honest clients send after a model that diverged
            return ModelFault(
                f"{CONTROL_DELTA_KEY}: L2 norm {norm:.3g} exceeds "
                f"strategy.max_control_delta_norm = {bound:g}"
            )
        return None

    def begin_round(self, server_round: int) -> None:
        super().begin_round(server_round)  # the clipping count
        # uniform (the paper) or n_k-weighted; each update clipped relative to the round
        sent = {k: v for k, v in self.global_arrays.items() if k in (self.control or {})}
        self.param_avg = round_average(self.aggregation, sent, f"Round {server_round}")
        self.buffer_avg = new_average(self.aggregation)  # BatchNorm statistics: as FedAvg
        self.deltas: list[dict[str, np.ndarray]] = []
        self.delta_pids: list[int] = []

    def absorb(self, server_round: int, reply: Reply) -> None:
        assert self.control is not None
        arrays = self.averager.robust(reply.arrays, self.global_arrays)
        params = {k: v for k, v in arrays.items() if k in self.control}
        buffers = {k: v for k, v in arrays.items() if k not in self.control}
        weight = reply.num_examples if self.params.weighted else 1.0
        self.param_avg.add(params, weight, reply.partition_id)
        if buffers:
            self.buffer_avg.add(buffers, reply.num_examples)
        self.deltas.append(to_numpy(reply.content[CONTROL_DELTA_KEY]))
        self.delta_pids.append(reply.partition_id)

    def aggregate(self, server_round: int, replies: list[Reply]) -> dict[str, np.ndarray]:
        assert self.control is not None
        if self.aggregation.clip_norm is not None:
            self.last_round["clients_clipped"] = self.averager.clipped
        averaged = self.param_avg.result()
        self.last_round.update(update_norms(self.param_avg))
        buffers_avg = self.buffer_avg.result() if self.buffer_avg.count else {}
        out: dict[str, np.ndarray] = {}
        for key, x in self.global_arrays.items():
            if key in self.control:
                step = self.params.global_lr * (averaged[key].astype(np.float64) - x)
                out[key] = (x + step).astype(x.dtype)
            else:
                out[key] = buffers_avg[key]
        num_clients = self.cfg.data.num_clients
        totals = self.control_delta_sum(server_round)
        for key in self.control:
            total = totals[key].astype(np.float64)
            self.control[key] = (self.control[key] + total / num_clients).astype(np.float32)
        self.deltas, self.delta_pids = [], []
        return out

    def control_delta_sum(self, server_round: int) -> dict[str, np.ndarray]:
        """``sum_{i in S} delta c_i`` of the round, each ``delta c_i`` first bounded by
        ``strategy.aggregation.upload_bound`` relative to the round's median norm (a WARNING
        names the client); with ``rule: median`` / ``trimmed_mean``, ``m`` times the rule's
        (unweighted) combination of the ``m`` deltas instead of their sum."""
        deltas, bounded = bound_uploads(
            self.deltas, self.aggregation.upload_bound, clients=self.delta_pids
        )
        warn_bounded(bounded, f"round {server_round}: {CONTROL_DELTA_KEY}")
        if self.aggregation.rule != "mean":
            combined = new_average(self.aggregation)
            for delta in deltas:
                combined.add(delta, 1.0)
            m = np.longdouble(len(deltas))
            return {k: m * v.astype(np.longdouble) for k, v in combined.result().items()}
        sums: dict[str, np.ndarray] = {}
        for delta in deltas:
            for key, value in delta.items():
                acc = sums.setdefault(key, np.zeros(value.shape, dtype=np.longdouble))
                acc += value.astype(np.longdouble)
        return sums
