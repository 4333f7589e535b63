"""The Flower ClientApp: message handlers that run a client algorithm from ``clients/``.

The server sends the core experiment (JSON), the client algorithm's name and that algorithm's
own parameters in every message (:mod:`fedgo_flwr.messages`), so a SuperNode needs only its
``partition-id`` (and optionally ``data-path``) in its node config. Handlers:

- ``query``: reply with the node's partition id (the server maps partition ids to node ids with
  it, for seeded client sampling).
- ``train``: load the global weights, train with the algorithm named in the message, reply with
  the weights, ``num-examples`` and training metrics (plus the algorithm's extra ArrayRecords).
- every ``train.<action>`` a client algorithm declares in its ``messages`` (FedGO's
  ``train.discriminator``), answered by the algorithm's method of that name.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from logging import WARNING
from pathlib import Path

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.supercore import log

from clients import ClientAlgorithm, ClientJob, client_class
from clients import available as available_clients
from fedgo_flwr import messages as msgs
from fedgo_flwr.config import ExperimentConfig
from fedgo_flwr.fileio import atomic_torch_save
from fedgo_flwr.recorder import resolve_output_dir
from fedgo_flwr.rng import make_rng
from fedgo_flwr.schema import build_section
from fedgo_flwr.task import client_dataset, load_bundle, new_model
from fedgo_flwr.training import get_device

app = ClientApp()


def inject_fault(cfg: ExperimentConfig, pid: int, server_round: int, stage: str) -> str | None:
    """Act out the config's deliberate failure for this client and round, if any.

    ``stage`` is ``"before"`` (crash, hang, exit happen before training) or ``"after"``;
    returns the kind that must corrupt the reply (``nan`` or ``shape``), else ``None``.
    """
    for fault in cfg.faults:
        if not fault.applies(pid, server_round):
            continue
        if stage == "before" and fault.kind == "crash":
            raise RuntimeError(f"injected fault: client {pid} crashes in round {server_round}")
        if stage == "before" and fault.kind == "hang":
            log(WARNING, "injected fault: client %d hangs %.0fs", pid, fault.seconds)
            time.sleep(fault.seconds)
        if stage == "before" and fault.kind == "exit":
            log(WARNING, "injected fault: client %d exits in round %d", pid, server_round)
            os._exit(1)
        if stage == "after" and fault.kind in ("nan", "shape"):
            return fault.kind
    return None


def corrupt(state: dict[str, torch.Tensor], kind: str) -> dict[str, torch.Tensor]:
    """A reply the server must reject: non-finite values or a wrongly shaped first array."""
    state = dict(state)
    first = next(iter(state))
    if kind == "nan":
        state[first] = torch.full_like(state[first], float("nan"))
    else:
        state[first] = torch.zeros(*state[first].shape, 2)
    return state


def _partition_id(context: Context) -> int:
    if "partition-id" not in context.node_config:
        raise ValueError(
            "this SuperNode has no 'partition-id' in its node config; start it with "
            '--node-config "partition-id=<k> num-partitions=<K>"'
        )
    return int(context.node_config["partition-id"])


def _data_path(context: Context) -> str | None:
    value = context.node_config.get("data-path")
    return str(value) if value else None


def _state_dir(context: Context, cfg: ExperimentConfig, token: str, pid: int) -> Path | None:
    """Where this client keeps its state between runs (``None``: nowhere).

    Node config ``state-dir`` if given, else ``<output_dir>/client-state``; one folder per run
    token (a resumed run keeps its token, a fresh run gets a new one) and partition id.
    """
    if not cfg.checkpoint or not token:
        return None
    value = context.node_config.get("state-dir")
    base = Path(str(value)) if value else resolve_output_dir(cfg.output_dir) / "client-state"
    return base / token / f"partition-{pid}"


def restore_state(context: Context, folder: Path | None, server_round: int) -> None:
    """Reload the client's state (e.g. SCAFFOLD's c_i) after a restart of the run.

    Only when the node holds none in memory; the newest file saved before ``server_round``.
    """
    if folder is None or context.state.array_records or not folder.is_dir():
        return
    saved = sorted(
        (int(f.stem.split("-")[1]), f) for f in folder.glob("round-*.pt") if f.stem[6:].isdigit()
    )
    earlier = [f for r, f in saved if r < server_round]
    if earlier:
        for name, tensors in torch.load(earlier[-1], map_location="cpu").items():
            context.state[name] = ArrayRecord(tensors)


def save_state(context: Context, folder: Path | None, server_round: int) -> None:
    """Keep the client's state after ``server_round`` on disk (the last two rounds)."""
    if folder is None or not context.state.array_records:
        return
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.to_torch_state_dict() for k, v in context.state.array_records.items()}
    atomic_torch_save(folder / f"round-{server_round}.pt", state)
    saved = sorted(int(f.stem.split("-")[1]) for f in folder.glob("round-*.pt"))
    for r in saved[:-2]:
        (folder / f"round-{r}.pt").unlink(missing_ok=True)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Report this node's partition id (and the federation size, if its node config says)."""
    metrics = {msgs.PARTITION_ID: _partition_id(context)}
    if msgs.NUM_PARTITIONS in context.node_config:
        metrics[msgs.NUM_PARTITIONS] = int(context.node_config[msgs.NUM_PARTITIONS])
    return Message(content=RecordDict({msgs.METRICS: MetricRecord(metrics)}), reply_to=msg)


def _job(msg: Message, context: Context, message_type: str) -> tuple[ClientAlgorithm, ClientJob]:
    """The client algorithm the message names and the job it is to do."""
    config = msg.content[msgs.CONFIG]
    cfg = ExperimentConfig.from_json(str(config[msgs.EXPERIMENT]))
    algorithm = client_class(str(config[msgs.ALGORITHM]))
    params = build_section(
        algorithm.Config,
        json.loads(str(config.get(msgs.CLIENT_PARAMS, "{}"))),
        "strategy.",
        owner=algorithm.name,
    )
    server_round = int(config.get(msgs.SERVER_ROUND, 0))
    pid = _partition_id(context)
    torch.set_num_threads(max(1, cfg.resources.client_cpus))
    job = ClientJob(
        cfg=cfg,
        params=params,
        partition_id=pid,
        server_round=server_round,
        data=client_dataset(cfg, pid, _data_path(context)),
        device=get_device(cfg.device),
        rng=make_rng(cfg.seed, message_type, server_round, pid),
        content=msg.content,
        state=context.state,
    )
    return algorithm(), job


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round of local training by the algorithm the server names."""
    algorithm, job = _job(msg, context, "train")
    cfg, pid, server_round = job.cfg, job.partition_id, job.server_round
    inject_fault(cfg, pid, server_round, "before")
    state_dir = _state_dir(context, cfg, str(msg.content[msgs.CONFIG].get(msgs.RUN_TOKEN, "")), pid)
    restore_state(context, state_dir, server_round)
    job.model = new_model(cfg, load_bundle(cfg.data, _data_path(context)))
    job.model.load_state_dict(msg.content[msgs.ARRAYS].to_torch_state_dict())
    stats, extra = algorithm.train(job)
    save_state(context, state_dir, server_round)
    metrics = MetricRecord(
        {
            msgs.NUM_EXAMPLES: stats.num_examples,
            "train_loss": stats.loss,
            "train_steps": stats.steps,
            "train_time": stats.seconds,
            msgs.PARTITION_ID: pid,
        }
    )
    job.model.cpu()
    state = job.model.state_dict()
    kind = inject_fault(cfg, pid, server_round, "after")
    if kind is not None:
        state = corrupt(state, kind)
    content = RecordDict({msgs.ARRAYS: ArrayRecord(state), msgs.METRICS: metrics, **extra})
    return Message(content=content, reply_to=msg)


def _extra_handler(message_type: str) -> Callable[[Message, Context], Message]:
    """A handler for a message type that client algorithms declare (``messages``)."""

    def handle(msg: Message, context: Context) -> Message:
        algorithm, job = _job(msg, context, message_type)
        method = algorithm.messages.get(message_type)
        if method is None:
            raise ValueError(f"client algorithm '{algorithm.name}' does not handle {message_type}")
        records, metrics = getattr(algorithm, method)(job)
        metrics = {msgs.NUM_EXAMPLES: len(job.data), msgs.PARTITION_ID: job.partition_id, **metrics}
        return Message(
            content=RecordDict({**records, msgs.METRICS: MetricRecord(metrics)}), reply_to=msg
        )

    return handle


def register_client_messages() -> None:
    """Register every ``train.<action>`` message that a client algorithm declares.

    Runs when this module is imported; again after adding client modules at run time (tests).
    """
    for name in available_clients():
        for message_type in client_class(name).messages:
            category, _, action = message_type.partition(".")
            if category != "train" or not action:
                raise ValueError(
                    f"clients/{name}.py declares message type '{message_type}'; "
                    "extra messages must be 'train.<action>'"
                )
            if message_type not in _registered:
                app.train(action)(_extra_handler(message_type))
                _registered.add(message_type)


_registered: set[str] = set()
register_client_messages()
