"""FedAvg on Flower's Message API, and the base class of every fedgo-flwr strategy.

McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data",
AISTATS 2017, Alg. 1: each round a fraction C of the K clients trains locally from the global
model; the server replaces the model by the n_k-weighted average of the returned models.

Differences from ``flwr.serverapp.strategy.FedAvg``, which this class extends:

- Client sampling is seeded (:func:`fedgo_flwr.task.sample_clients`) and done over partition
  ids, so every strategy trains the same clients in the same round and a run is repeatable.
- Every reply is checked on its own (error replies, missing or wrongly shaped or non-finite
  arrays, a bad ``num-examples``); a bad reply is logged with its node and partition id and
  dropped, and the round goes on with the rest if at least ``min_clients`` replied.
- The training message carries the experiment config and the name of the client algorithm.
- Evaluation is centralised (server side, every round); no federated evaluation round.

- Replies are folded in one at a time as they arrive (:func:`fedgo_flwr.replies.stream_replies`):
  each accepted reply goes to :meth:`absorb` (FedAvg adds it to a running average) and its
  arrays are then let go, so the server's memory does not grow with the number of clients.

Subclasses override only what differs: :meth:`train_record` (what is sent),
:meth:`absorb` / :meth:`aggregate` (how accepted replies become the next model) and
:meth:`check_reply` (extra reply checks).
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
from flwr.serverapp.strategy import Result
from flwr.supercore import log
from torch import nn

from fedgo_flwr.aggregation import RunningAverage, check_arrays
from fedgo_flwr.config import ExperimentConfig, build_section
from fedgo_flwr.data import DataBundle
from fedgo_flwr.partition import Partition
from fedgo_flwr.replies import stream_replies
from fedgo_flwr.shutdown import raise_if_stopping
from fedgo_flwr.task import sample_clients


@dataclass
class FedAvgParams:
    """FedAvg has no parameters of its own."""


@dataclass
class ServerResources:
    """What the server holds besides the model: its data, partition, device and run folder."""

    bundle: DataBundle
    partition: Partition
    device: torch.device
    out_dir: Path


@dataclass
class Reply:
    """An accepted client reply, unpacked."""

    node_id: int
    partition_id: int
    num_examples: int
    arrays: dict[str, np.ndarray]
    metrics: dict[str, Any]
    content: RecordDict


def to_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in record.items()}


def to_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    # np.asarray(order="C"), not np.ascontiguousarray, which turns a 0-d array (BatchNorm's
    # num_batches_tracked) into shape (1,).
    return ArrayRecord({k: Array(np.asarray(v, order="C")) for k, v in arrays.items()})


class FedAvg(FlowerFedAvg):
    """Federated Averaging with seeded sampling and per-reply validation."""

    name = "fedavg"
    client_algorithm = "fedavg"
    Params: type = FedAvgParams

    def __init__(
        self,
        cfg: ExperimentConfig,
        node_ids: Mapping[int, int],
        model: nn.Module,
        resources: ServerResources | None = None,
    ):
        super().__init__(
            fraction_train=cfg.fraction,
            fraction_evaluate=0.0,
            min_train_nodes=cfg.clients_per_round,
            min_evaluate_nodes=0,
            min_available_nodes=cfg.data.num_clients,
        )
        self.cfg = cfg
        self.params = build_section(self.Params, cfg.strategy.params, "strategy.", self.name)
        self.node_ids = dict(node_ids)  # partition id -> node id
        self.partition_of = {node: pid for pid, node in self.node_ids.items()}
        self.param_names = [name for name, _ in model.named_parameters()]
        self.resources = resources
        self._template = copy.deepcopy(model).cpu()
        self.global_arrays: dict[str, np.ndarray] = {}
        self.last_round: dict[str, float | int] = {}  # read by the run recorder
        self.run_token = ""  # names this run's client-state files (kept when resuming)

    def summary(self) -> None:
        log(INFO, "\t├──> %s, params %s", type(self).__name__, self.cfg.strategy.params)
        log(
            INFO,
            "\t└──> Seeded sampling: %d of %d clients per round (seed %d)",
            self.cfg.clients_per_round,
            self.cfg.data.num_clients,
            self.cfg.seed,
        )

    @classmethod
    def check_params(cls, params: Any) -> None:
        """Checks of ``Params`` that depend on the strategy class (raise ``ValueError``)."""

    def model_factory(self) -> nn.Module:
        """A fresh copy of the experiment's model (weights to be loaded by the caller)."""
        return copy.deepcopy(self._template)

    def setup(self, grid: Grid) -> None:
        """Work before round 1 (e.g. FedGO's discriminator round); nothing for FedAvg."""

    # -- checkpointing ---------------------------------------------------------------------
    resuming: bool = False  # set by the ServerApp when the run continues from a checkpoint

    def state_dict(self) -> dict[str, Any]:
        """Server-side state beyond the global model that a resumed run needs (picklable)."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    # -- the round loop --------------------------------------------------------------------
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
        *,
        first_round: int = 1,
        round_end: Callable[[int, ArrayRecord], None] | None = None,
    ) -> Result:
        """Flower's round loop (train, then centralised evaluation), resumable.

        As :meth:`flwr.serverapp.strategy.Strategy.start`, without the federated evaluation
        phase (this framework evaluates on the server), plus: rounds start at
        ``first_round`` (a resumed run; the initial evaluation is skipped unless it is 1) and
        ``round_end(round, arrays)`` runs after each round's evaluation (checkpointing).
        """
        name = type(self).__name__
        log(INFO, "Starting %s strategy (rounds %d..%d)", name, first_round, num_rounds)
        self.summary()
        train_config = ConfigRecord() if train_config is None else train_config
        result = Result()
        arrays = initial_arrays
        result.arrays = arrays
        if evaluate_fn and first_round == 1:
            res = evaluate_fn(0, arrays)
            if res is not None:
                result.evaluate_metrics_serverapp[0] = res
        for server_round in range(first_round, num_rounds + 1):
            log(INFO, "")
            log(INFO, "[ROUND %s/%s]", server_round, num_rounds)
            messages = self.configure_train(server_round, arrays, ConfigRecord(train_config), grid)
            replies = stream_replies(grid, messages, timeout)
            agg_arrays, agg_metrics = self.aggregate_train(server_round, replies)
            # Clients that died with a Ctrl-C/TERM must not make a round (fedgo_flwr.shutdown).
            raise_if_stopping(f"round {server_round}")
            if agg_arrays is not None:
                arrays = agg_arrays
                result.arrays = arrays
            if agg_metrics is not None:
                result.train_metrics_clientapp[server_round] = agg_metrics
            if evaluate_fn:
                res = evaluate_fn(server_round, arrays)
                if res is not None:
                    result.evaluate_metrics_serverapp[server_round] = res
            if round_end is not None:
                raise_if_stopping(f"round {server_round}'s checkpoint")
                round_end(server_round, arrays)
        return result

    # -- sending ---------------------------------------------------------------------------
    def train_record(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord
    ) -> RecordDict:
        """The content sent to every sampled client (subclasses add their own records)."""
        return RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self.round_start = time.perf_counter()
        self.global_arrays = to_numpy(arrays)
        pids = sample_clients(
            self.cfg.seed, server_round, self.cfg.data.num_clients, self.cfg.clients_per_round
        )
        log(INFO, "configure_train: clients %s", pids)
        config["server-round"] = server_round
        config["client-algorithm"] = self.client_algorithm
        config["experiment"] = json.dumps(self.cfg.to_dict(), sort_keys=True)
        config["run-token"] = self.run_token
        record = self.train_record(server_round, arrays, config)
        self.sampled = pids
        return self._construct_messages(record, [self.node_ids[p] for p in pids], MessageType.TRAIN)

    # -- receiving -------------------------------------------------------------------------
    def check_reply(self, content: RecordDict) -> str | None:
        """Extra checks of a subclass; return why the reply is unusable, or ``None``."""
        return None

    def accept(self, msg: Message) -> Reply | None:
        """Unpack a usable reply; log and drop (``None``) an unusable one."""
        node = msg.metadata.src_node_id
        pid = self.partition_of.get(node, -1)
        reason = self._reply_problem(msg)
        if reason is not None:
            self.rejected += 1
            log(WARNING, "Dropping reply of client %d (node %d): %s", pid, node, reason)
            return None
        content = msg.content
        metrics = dict(content["metrics"])
        return Reply(
            node_id=node,
            partition_id=pid,
            num_examples=int(metrics["num-examples"]),
            arrays=to_numpy(content[self.arrayrecord_key]),
            metrics=metrics,
            content=content,
        )

    def _reply_problem(self, msg: Message) -> str | None:
        if msg.has_error():
            return f"client error: {msg.error.reason}"
        content = msg.content
        if self.arrayrecord_key not in content.array_records:
            return f"no ArrayRecord '{self.arrayrecord_key}'"
        if "metrics" not in content.metric_records:
            return "no MetricRecord 'metrics'"
        n = content["metrics"].get("num-examples")
        if not isinstance(n, (int, float)) or n <= 0 or not np.isfinite(n):
            return f"bad num-examples {n!r}"
        problem = check_arrays(to_numpy(content[self.arrayrecord_key]), self.global_arrays)
        return problem or self.check_reply(content)

    def begin_round(self, server_round: int) -> None:
        """Reset what :meth:`absorb` accumulates."""
        self.running = RunningAverage()

    def absorb(self, server_round: int, reply: Reply) -> None:
        """Fold one accepted reply in; its arrays are dropped afterwards."""
        self.running.add(reply.arrays, reply.num_examples)

    def aggregate(self, server_round: int, replies: list[Reply]) -> dict[str, np.ndarray]:
        """FedAvg: the n_k-weighted average of the client models (``replies`` hold metadata
        only, sorted by partition id; the arrays went through :meth:`absorb`)."""
        return self.running.result()

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        self.rejected = 0
        self.begin_round(server_round)
        accepted: list[Reply] = []
        answered: set[int] = set()
        t_absorb = 0.0
        for msg in replies:  # as they arrive; one reply's arrays in memory at a time
            answered.add(msg.metadata.src_node_id)
            reply = self.accept(msg)
            del msg
            if reply is None:
                continue
            t0 = time.perf_counter()
            self.absorb(server_round, reply)
            t_absorb += time.perf_counter() - t0
            reply.arrays, reply.content = {}, RecordDict()  # let the model go
            accepted.append(reply)
        accepted.sort(key=lambda r: r.partition_id)  # arrival order must not matter
        silent = [p for p in self.sampled if self.node_ids[p] not in answered]
        for pid in silent:
            log(
                WARNING,
                "Round %d: client %d (node %d) sent no reply within round_timeout (%.0fs)",
                server_round,
                pid,
                self.node_ids[pid],
                self.cfg.round_timeout,
            )
        self.last_round = {
            "clients_sampled": len(self.sampled),
            "clients_replied": len(accepted),
            "clients_failed": self.rejected + len(silent),
        }
        if len(accepted) < self.cfg.min_clients:
            log(
                WARNING,
                "Round %d: %d usable replies < min_clients %d; the global model is kept",
                server_round,
                len(accepted),
                self.cfg.min_clients,
            )
            return None, MetricRecord(self.last_round)
        t0 = time.perf_counter()
        arrays = self.aggregate(server_round, accepted)
        self.last_round["aggregate_time"] = time.perf_counter() - t0 + t_absorb
        self.last_round.update(client_metrics(accepted))
        return to_record(arrays), MetricRecord(self.last_round)


def client_metrics(replies: list[Reply]) -> dict[str, float]:
    """Example-weighted train loss; slowest and total client training time."""
    n = np.array([r.num_examples for r in replies], dtype=np.float64)
    loss = np.array([float(r.metrics.get("train_loss", np.nan)) for r in replies])
    times = [float(r.metrics.get("train_time", 0.0)) for r in replies]
    return {
        "train_loss": float((n * loss).sum() / n.sum()),
        "client_time_max": max(times),
        "client_time_sum": float(sum(times)),
    }
