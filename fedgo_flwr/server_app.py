"""The Flower ServerApp: load the experiment, discover clients, run the strategy, record results.

The run config (``pyproject.toml`` ``[tool.flwr.app.config]``, changed with ``flwr run
--run-config``) names the experiment: ``config``, the YAML file; the experiment's main keys
(``rounds``, ``seed``, ``strategy.name``, ``data.alpha`` ...; ``""``, their default there, leaves
the YAML's value); and ``overrides``, ``"dotted.key=value ..."`` for any other key. They apply
in that order and are checked as one experiment (:func:`config_from_context`)::

    flwr run . --run-config "rounds=5 seed=3 strategy.name='fedgo' data.alpha=0.05"
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from logging import INFO
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log

from fedgo_flwr import shutdown
from fedgo_flwr.checkpoint import (
    Checkpoint,
    capture_rng,
    config_differences,
    load_checkpoint,
    new_run_token,
    restore_rng,
    save_checkpoint,
)
from fedgo_flwr.cli import preflight
from fedgo_flwr.config import ExperimentConfig, split_overrides
from fedgo_flwr.kernels import use_channels_last
from fedgo_flwr.messages import (
    CONFIG,
    METRICS,
    NUM_PARTITIONS,
    PARTITION_ID,
    SHARES_PARTITIONS,
    TRAFFIC,
    to_numpy,
    to_record,
    use_waiting_threads,
)
from fedgo_flwr.recorder import RunRecorder, check_output_dir
from fedgo_flwr.schema import Checker
from fedgo_flwr.task import check_model_inputs, load_bundle, make_partition, new_model
from fedgo_flwr.training import get_device
from strategies import load_experiment, resolve, strategy_class
from strategies.base import ServerResources

app = ServerApp()

APP_DIR = Path(__file__).resolve().parent.parent


RUN_CONFIG_FILE_KEYS = ("config", "overrides")
"""Run-config keys that are not experiment keys: the YAML file and the free-form overrides."""


def run_config_overrides(run_config: Mapping[str, Any]) -> list[str]:
    """The run config's experiment keys that are set (not ``""``), as ``key=value`` overrides
    (strings JSON-quoted, so that YAML reads them back as the same string)."""
    out = []
    for key, value in sorted(run_config.items()):
        if key in RUN_CONFIG_FILE_KEYS or value == "":
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, str):
            text = json.dumps(value)
        else:
            text = repr(value)
        out.append(f"{key}={text}")
    return out


def config_from_context(context: Context) -> ExperimentConfig:
    """The validated experiment named by the run config: the YAML file, then the main keys set
    in the run config, then ``overrides``."""
    run_config = context.run_config
    path = str(run_config.get("config", "") or "") or None
    overrides = [
        *run_config_overrides(run_config),
        *split_overrides(str(run_config.get("overrides", "") or "")),
    ]
    return load_experiment(path, overrides, search_dirs=[APP_DIR])


def discover_nodes(grid: Grid, num_clients: int, timeout: float = 600.0) -> dict[int, int]:
    """Map partition ids 0..K-1 to node ids by asking every connected node for its id.

    Each node reports its ``partition-id``, its federation's size (``num-partitions``) and
    whether it may serve several partitions (simulated nodes may). With N < K nodes that may,
    partition k goes to the node with partition-id ``k mod N``, which trains its clients one
    after another (``flwr run .`` with Flower's 2-node default federation); otherwise every
    partition needs a node of its own. Waits up to ``timeout`` seconds for the nodes
    (SuperNodes of a deployment may start late).
    """
    deadline = time.monotonic() + timeout
    hosts: dict[int, int] = {}  # node partition-id -> node id
    asked: set[int] = set()
    sizes: set[int] = set()
    sharing: set[bool] = set()
    while True:
        new = [n for n in grid.get_node_ids() if n not in asked]
        if new:
            messages = [
                Message(
                    content=RecordDict({CONFIG: ConfigRecord({})}),
                    message_type=MessageType.QUERY,
                    dst_node_id=node,
                )
                for node in new
            ]
            for reply in grid.send_and_receive(messages, timeout=timeout):
                node = reply.metadata.src_node_id
                if reply.has_error():
                    raise RuntimeError(
                        f"node {node} failed to report its partition id: {reply.error.reason}"
                    )
                asked.add(node)
                info = reply.content[METRICS]
                pid = int(info[PARTITION_ID])
                sizes.add(int(info.get(NUM_PARTITIONS, num_clients)))
                sharing.add(bool(info.get(SHARES_PARTITIONS, 0)))
                if pid in hosts:
                    raise RuntimeError(
                        f"nodes {hosts[pid]} and {node} both claim partition-id {pid}"
                    )
                hosts[pid] = node
        total = min(sizes) if sizes else num_clients
        if total < num_clients and sharing != {True}:
            raise RuntimeError(
                f"the federation has {total} SuperNodes (num-partitions) but data.num_clients = "
                f"{num_clients}, and its nodes serve one client each: a deployment needs one "
                "SuperNode per client (or node config share-partitions=true on every node)"
            )
        needed = min(total, num_clients)
        if all(p in hosts for p in range(needed)):
            if total < num_clients:
                log(
                    INFO,
                    "%d clients on %d nodes: node k serves the clients k, k+%d, ... in turn",
                    num_clients,
                    total,
                    total,
                )
            unused = sorted(p for p in hosts if p >= needed)
            if unused:
                log(INFO, "Nodes with partition-id %s >= data.num_clients; unused", unused[:10])
            return {k: hosts[k % needed] for k in range(num_clients)}
        if time.monotonic() > deadline:
            missing = sorted(set(range(needed)) - set(hosts))
            raise RuntimeError(
                f"only {len(hosts)} of the {needed} nodes needed for data.num_clients = "
                f"{num_clients} connected within {timeout:.0f}s; missing partition ids "
                f"{missing[:10]}"
            )
        time.sleep(1.0)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the experiment named by the run config."""
    run_experiment(grid, config_from_context(context))


def server_app_for(cfg: ExperimentConfig) -> ServerApp:
    """A ServerApp bound to ``cfg`` (for ``flwr.simulation.run_simulation`` and tests)."""
    bound = ServerApp()

    @bound.main()
    def _main(grid: Grid, context: Context) -> None:
        run_experiment(grid, cfg)

    return bound


def run_experiment(grid: Grid, cfg: ExperimentConfig) -> dict:
    """Run one experiment end to end; return its summary (also in summary.json).

    With ``resume: true`` and a ``checkpoint.pt`` in the run folder, the run continues after
    the checkpoint's round (:mod:`fedgo_flwr.checkpoint`); otherwise it starts from round 1.
    A folder holding an earlier run is refused before anything is written, unless the run
    resumes it or ``overwrite: true`` (:func:`fedgo_flwr.recorder.check_output_dir`).
    The strategy's parameters are built here if ``cfg`` came without them typed.
    """
    cfg = resolve(cfg)
    preflight(cfg)  # the same checks as `prepare`: a plain `flwr run` stops here too
    out_dir = check_output_dir(cfg)
    torch.set_num_threads(cfg.resources.server_cpus or os.cpu_count() or 1)
    use_channels_last(cfg.resources.channels_last)
    use_waiting_threads(cfg.resources.server_cpus_waiting)
    shutdown.watch()
    ckpt = None
    if cfg.resume:
        ckpt = load_checkpoint(out_dir)
        if ckpt is None:
            log(INFO, "resume: no checkpoint in %s; starting from round 1", cfg.output_dir)
        else:
            changed = config_differences(ckpt.config, cfg)
            if changed:
                raise ValueError(
                    f"cannot resume {cfg.output_dir}: the configuration differs from the "
                    f"checkpointed run's in {', '.join(changed)}"
                )
    bundle = load_bundle(cfg.data)
    # A model that cannot take the data's inputs is refused by key, before anything is written.
    check_model_inputs(cfg, bundle, Checker(cfg.strategy.sources))
    recorder = RunRecorder.create(cfg, ckpt.metrics if ckpt else None)
    log(
        INFO,
        "fedgo-flwr: experiment '%s', strategy %s, output %s",
        cfg.name,
        cfg.strategy.name,
        recorder.out_dir,
    )

    partition = make_partition(cfg)
    recorder.write_partition(partition.to_json(bundle.train.y, bundle.train.num_classes))
    device = get_device(cfg.device)
    log(
        INFO,
        "fedgo-flwr server: on %s (device: %s); the clients use client_device: %s",
        device,
        cfg.device,
        cfg.client_device,
    )
    model = new_model(cfg, bundle)

    node_ids = discover_nodes(grid, cfg.data.num_clients)
    TRAFFIC.take()  # this run's messages only
    resources = ServerResources(bundle, partition, device, recorder.out_dir)
    strategy = strategy_class(cfg.strategy.name)(cfg, node_ids, model, resources)
    strategy.run_token = ckpt.run_token if ckpt else new_run_token()
    initial = ArrayRecord(model.state_dict())
    if ckpt is not None:
        log(INFO, "resume: continuing %s after round %d", recorder.out_dir, ckpt.round)
        strategy.resuming = True
        strategy.load_state_dict(ckpt.strategy_state)
        initial = to_record(ckpt.arrays)
    strategy.setup(grid)
    recorder.attach(strategy, model, bundle.test, device)
    if ckpt is not None:
        restore_rng(ckpt.rng)

    def round_end(server_round: int, arrays: ArrayRecord) -> None:
        if not cfg.checkpoint:
            return
        save_checkpoint(
            recorder.out_dir,
            Checkpoint(
                round=server_round,
                arrays=to_numpy(arrays),
                strategy_state=strategy.state_dict(),
                metrics=recorder.rows,
                config=cfg.to_dict(),
                run_token=strategy.run_token,
                rng=capture_rng(),
            ),
        )

    result = strategy.start(
        grid=grid,
        initial_arrays=initial,
        num_rounds=cfg.rounds,
        timeout=cfg.round_timeout,
        train_config=ConfigRecord({}),
        evaluate_fn=recorder.evaluate,
        first_round=ckpt.round + 1 if ckpt else 1,
        round_end=round_end,
    )
    return recorder.finish(result.arrays if len(result.arrays) else None)
