"""The Flower ClientApp: message handlers that run a client algorithm from ``clients/``.

The server sends the whole experiment config (JSON) in every training message, so a SuperNode
needs only its ``partition-id`` (and optionally ``data-path``) in its node config. Handlers:

- ``query``: reply with the node's partition id and local dataset size (the server maps
  partition ids to node ids with it, for seeded client sampling).
- ``train.discriminator``: FedGO pre-FL stage (``clients/fedgo.py``).
- ``train``: load the global weights, train with the algorithm named in the message, reply with
  the weights, ``num-examples`` and training metrics (plus the algorithm's extra ArrayRecords).
"""

from __future__ import annotations

import os
import time
from logging import WARNING
from pathlib import Path

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.supercore import log

from clients import CLIENTS, ClientJob
from fedgo_flwr.config import ExperimentConfig
from fedgo_flwr.fileio import atomic_torch_save
from fedgo_flwr.recorder import resolve_output_dir
from fedgo_flwr.rng import make_rng
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
    metrics = {"partition-id": _partition_id(context)}
    if "num-partitions" in context.node_config:
        metrics["num-partitions"] = int(context.node_config["num-partitions"])
    return Message(content=RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round of local training by the algorithm the server names."""
    config = msg.content["config"]
    cfg = ExperimentConfig.from_json(str(config["experiment"]))
    algorithm = str(config["client-algorithm"])
    if algorithm not in CLIENTS:
        raise ValueError(f"unknown client algorithm '{algorithm}' (known: {', '.join(CLIENTS)})")
    server_round = int(config["server-round"])
    pid = _partition_id(context)
    torch.set_num_threads(max(1, cfg.resources.client_cpus))
    inject_fault(cfg, pid, server_round, "before")
    state_dir = _state_dir(context, cfg, str(config.get("run-token", "")), pid)
    restore_state(context, state_dir, server_round)

    bundle = load_bundle(cfg.data, _data_path(context))
    data = client_dataset(cfg, pid, _data_path(context))
    model = new_model(cfg, bundle)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    job = ClientJob(
        cfg=cfg,
        partition_id=pid,
        server_round=server_round,
        model=model,
        data=data,
        device=get_device(cfg.device),
        rng=make_rng(cfg.seed, "train", server_round, pid),
        content=msg.content,
        state=context.state,
    )
    stats, extra = CLIENTS[algorithm]().train(job)
    save_state(context, state_dir, server_round)
    metrics = MetricRecord(
        {
            "num-examples": stats.num_examples,
            "train_loss": stats.loss,
            "train_steps": stats.steps,
            "train_time": stats.seconds,
            "partition-id": pid,
        }
    )
    model.cpu()
    state = model.state_dict()
    kind = inject_fault(cfg, pid, server_round, "after")
    if kind is not None:
        state = corrupt(state, kind)
    content = RecordDict({"arrays": ArrayRecord(state), "metrics": metrics, **extra})
    return Message(content=content, reply_to=msg)


@app.train("discriminator")
def train_discriminator(msg: Message, context: Context) -> Message:
    """FedGO pre-FL stage: train this client's discriminator against the server's generator."""
    from clients.fedgo import train_client_discriminator

    cfg = ExperimentConfig.from_json(str(msg.content["config"]["experiment"]))
    pid = _partition_id(context)
    torch.set_num_threads(max(1, cfg.resources.client_cpus))
    data = client_dataset(cfg, pid, _data_path(context))
    arrays, stats = train_client_discriminator(cfg, pid, data, msg.content, get_device(cfg.device))
    metrics = {"num-examples": len(data), "partition-id": pid}
    metrics.update({f"disc_{k}": v for k, v in stats.items() if k != "num_examples"})
    content = RecordDict({"arrays": arrays, "metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)
