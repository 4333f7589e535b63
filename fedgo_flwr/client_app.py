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

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from clients import CLIENTS, ClientJob
from fedgo_flwr.config import ExperimentConfig
from fedgo_flwr.task import client_dataset, load_bundle, new_model
from fedgo_flwr.training import get_device, make_generator

app = ClientApp()


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
        generator=make_generator(cfg.seed, "train", server_round, pid),
        content=msg.content,
        state=context.state,
    )
    stats, extra = CLIENTS[algorithm]().train(job)
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
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics, **extra})
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
