"""The Flower ServerApp: load the experiment, discover clients, run the strategy, record results.

The run config (``pyproject.toml`` ``[tool.flwr.app.config]``, changed with ``flwr run
--run-config``) names the experiment: ``config``, the YAML file; the experiment's main keys
(``rounds``, ``seed``, ``strategy.name``, ``data.alpha`` ...; ``""``, their default there, leaves
the YAML's value); and ``overrides``, ``"dotted.key=value ..."`` for any other key. They apply
in that order and are checked as one experiment (:func:`config_from_context`)::

    flwr run . --run-config "rounds=5 seed=3 strategy.name='fedgo' data.alpha=0.05"

A deployment may add ``node-map``, the operator's map from partition ids to the nodes (by node
id or public key) that serve them; without it the nodes' own ``partition-id`` claims are used,
strictly checked (:mod:`fedgo_app.discovery`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from logging import ERROR, INFO
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log
from flwr.supercore.logger import LOGGER_NAME

from fedgo_app.cli import preflight
from fedgo_app.discovery import (
    NODE_MAP,
    SETTLE_SECONDS,
    LateClaims,
    NodeDiscoveryError,
    NodeMap,
    discover_nodes,
    load_node_map,
)
from fedgo_app.noise import quiet_known_noise
from fedgo_flwr.config.experiment import ConfigError, ExperimentConfig, split_overrides
from fedgo_flwr.config.schema import Checker
from fedgo_flwr.learning.task import check_model_inputs, load_bundle, make_partition, new_model
from fedgo_flwr.learning.training import get_device
from fedgo_flwr.records.checkpoint import (
    Checkpoint,
    CheckpointError,
    capture_rng,
    check_resumable,
    config_differences,
    load_checkpoint,
    new_run_token,
    restore_rng,
    save_checkpoint,
)
from fedgo_flwr.records.provenance import LAUNCH_KEY, Launch
from fedgo_flwr.records.recorder import (
    EarlyEvaluation,
    RunRecorder,
    check_output_dir,
    decide_output_dir,
    resolve_output_dir,
)
from fedgo_flwr.records.runlog import RunLog, run_log
from fedgo_flwr.runtime import profiling, shutdown
from fedgo_flwr.runtime.fileio import UnsafePathError
from fedgo_flwr.runtime.kernels import (
    use_channels_last,
    use_deterministic,
    use_gpu_inference_batch,
    use_precision,
)
from fedgo_flwr.runtime.messages import (
    TRAFFIC,
    to_numpy,
    to_record,
    use_waiting_threads,
)
from strategies import load_experiment, require_resolved, strategy_class
from strategies.base import ServerResources

app = ServerApp()

APP_DIR = Path(__file__).resolve().parents[1]


RUN_CONFIG_FILE_KEYS = ("config", "overrides", NODE_MAP, LAUNCH_KEY)
"""Run-config keys that are not experiment keys: the YAML file, the free-form overrides, the
deployment's node map (:mod:`fedgo_app.discovery`) and how ``run.sh`` was started
(:class:`~fedgo_flwr.records.provenance.Launch`)."""


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


REPORTED = "fedgo_reported"
"""Attribute set on an exception that :func:`main` has logged as one line."""


class _SkipReported(logging.Filter):
    """Drops a log record about an exception :func:`main` has already reported as one line:
    Flower logs an exception that ends the ServerApp with its traceback, which says nothing
    more about a configuration error than the line does."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not getattr(exc, REPORTED, False)


_skip_reported = _SkipReported()
logging.getLogger(LOGGER_NAME).addFilter(_skip_reported)  # the same object: added once
quiet_known_noise()  # before Ray starts (fedgo_app.noise)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the experiment named by the run config (and its ``node-map``, if any:
    :mod:`fedgo_app.discovery`).

    A configuration, node-discovery or checkpoint problem is logged as one ERROR line naming
    the key, the node(s) or the checkpoint file and the value; it still ends the run with its
    exception (so Flower marks the run failed and exits non-zero), but Flower's log of that
    exception, its traceback, is left out (:class:`_SkipReported`).
    """
    try:
        cfg = config_from_context(context)
        node_map = load_node_map(context.run_config.get(NODE_MAP, ""))
        launch = Launch.from_json(str(context.run_config.get(LAUNCH_KEY, "") or ""))
        run_experiment(grid, cfg, node_map=node_map, settle=SETTLE_SECONDS, launch=launch)
    except (ConfigError, NodeDiscoveryError, CheckpointError, UnsafePathError) as exc:
        log(ERROR, "fedgo-flwr: %s", exc)
        setattr(exc, REPORTED, True)
        raise


def restore_strategy(strategy: Any, ckpt: Checkpoint, out_dir: Path) -> None:
    """Give ``strategy`` the checkpoint's state, checked first
    (:meth:`~strategies.base.Strategy.state_problem`; a state its ``load_state_dict`` cannot
    take is refused too): :class:`CheckpointError` naming the file. A checkpoint of a finished
    run (its last round, or a strategy that ended early) whose ``summary.json`` is there is
    refused as well, with nothing to resume; without a summary the run writes its final model
    and summary (the run stopped between its last checkpoint and its summary)."""
    where = f"checkpoint {ckpt.source}"
    problem = strategy.state_problem(ckpt.strategy_state, ckpt.round)
    if problem:
        raise CheckpointError(f"{where}: field {problem}")
    strategy.resuming = True
    try:
        strategy.load_state_dict(ckpt.strategy_state)
    except Exception as exc:  # noqa: BLE001 - a state the checks above do not cover
        first = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise CheckpointError(
            f"{where}: field 'strategy_state' does not fit strategy {strategy.name} "
            f"({type(exc).__name__}: {first})"
        ) from exc
    last = type(strategy).final_row(strategy.cfg)
    if ckpt.round < last and not strategy.finished:
        return
    if (out_dir / "summary.json").is_file():
        # More rounds extend a run that ran out of rounds, not one its strategy ended (CPFL).
        more = last == strategy.cfg.rounds and not strategy.finished
        extend = "raise rounds to extend it, or " if more else ""
        raise CheckpointError(
            f"{where} is of round {ckpt.round}, the end of the finished run in {out_dir} "
            f"(summary.json is there): nothing to resume; {extend}set overwrite=true to run "
            "it again"
        )
    log(
        INFO,
        "resume: %s is of round %d, the run's last; writing its final model and summary",
        ckpt.source,
        ckpt.round,
    )


def server_app_for(cfg: ExperimentConfig) -> ServerApp:
    """A ServerApp bound to ``cfg`` (for ``flwr.simulation.run_simulation`` and tests)."""
    bound = ServerApp()

    @bound.main()
    def _main(grid: Grid, context: Context) -> None:
        run_experiment(grid, cfg)

    return bound


def run_experiment(
    grid: Grid,
    cfg: ExperimentConfig,
    node_map: NodeMap | None = None,
    settle: float = 0.0,
    launch: Launch | None = None,
) -> dict:
    """Run one experiment end to end; return its summary (also in summary.json).

    The log lines of the run go to ``run.log`` in its folder too
    (:mod:`fedgo_flwr.records.runlog`). ``launch`` is how the user started it (``run.sh``:
    the command line for ``env.json``, the start time for the summary's ``launch`` stage);
    unknown by default.

    The run folder is ``output_dir``, or a new ``outputs/<name>/<date-time>`` if it is unset
    (with ``resume: true``, the one ``outputs/<name>/latest`` points to):
    :func:`fedgo_flwr.records.recorder.decide_output_dir`. With ``resume: true`` and a
    ``checkpoint.pt`` in the run folder, the run continues after the checkpoint's round
    (:mod:`fedgo_flwr.records.checkpoint`); otherwise it starts from round 1. A folder holding an
    earlier run is refused before anything is written, unless the run resumes it or
    ``overwrite: true`` (:func:`fedgo_flwr.records.recorder.check_output_dir`).
    ``cfg`` comes resolved, its strategy's parameters typed once where it was read
    (:func:`strategies.load_experiment`); an unresolved one is a ``TypeError``.
    ``node_map`` (run config ``node-map``) says which node serves which partition
    (:func:`~fedgo_app.discovery.discover_nodes`; without it the nodes' own claims are used,
    and deployment nodes that connect within ``settle`` seconds after every partition was
    claimed are still asked). A partition claimed by several nodes serves no client; the run
    goes on without its clients if at least ``min_clients`` clients keep a node. Without a
    node map, a node that connects later is asked before every round, and its claim of a
    partition that a node serves refuses both from then on
    (:class:`~fedgo_app.discovery.LateClaims`).
    """
    with run_log() as runlog:
        return _run_experiment(grid, cfg, node_map, settle, launch or Launch(), runlog)


def _run_experiment(
    grid: Grid,
    cfg: ExperimentConfig,
    node_map: NodeMap | None,
    settle: float,
    launch: Launch,
    runlog: RunLog,
) -> dict:
    require_resolved(cfg, "run_experiment")
    marks = [("", time.perf_counter())]  # the start-up's steps, logged before round 1
    launched = launch.seconds_before()  # before this process started (run.sh)
    preflight(cfg)  # the same checks as `prepare`: a plain `flwr run` stops here too
    cfg = decide_output_dir(cfg)  # a new folder unless output_dir is set (or set by `prepare`)
    out_dir = resolve_output_dir(cfg.output_dir)
    torch.set_num_threads(cfg.resources.server_cpus or os.cpu_count() or 1)
    use_channels_last(cfg.resources.channels_last)
    use_gpu_inference_batch(cfg.resources.gpu_inference_batch)
    use_precision(cfg.resources.precision)
    use_deterministic(cfg.resources.deterministic)
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
                raise CheckpointError(
                    f"cannot resume {cfg.output_dir}: the configuration differs from the "
                    f"checkpointed run's in {', '.join(changed)}"
                )
    marks.append(("checks", time.perf_counter()))
    bundle = load_bundle(cfg.data)
    # A model that cannot take the data's inputs is refused by key, before anything is written.
    check_model_inputs(cfg, bundle, Checker(cfg.strategy.sources))
    out_dir = check_output_dir(cfg)  # a folder holding another run: refused before discovery
    partition = make_partition(cfg)
    device = get_device(cfg.device)
    log(
        INFO,
        "fedgo-flwr server: on %s (device: %s); the clients use client_device: %s",
        device,
        cfg.device,
        cfg.client_device,
    )
    model = new_model(cfg, bundle)
    strategy_cls = strategy_class(cfg.strategy.name)
    if ckpt is not None:  # its model and round, against this run's
        template = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
        check_resumable(ckpt, template, strategy_cls.final_row(cfg))
    marks.append(("data, partition and model", time.perf_counter()))
    # Round 0 evaluates the initial model, which needs no node: begun now, it runs while
    # discovery waits for the nodes (in a simulation, for Ray's start).
    early = None
    if ckpt is None and not profiling.enabled():
        early = EarlyEvaluation(model, bundle.test, cfg.eval.batch_size, device)

    seen: set[int] = set()  # the nodes discovery asked; LateClaims asks any other later
    node_ids = discover_nodes(
        grid,
        cfg.data.num_clients,
        node_map=node_map,
        min_clients=cfg.min_clients,
        settle=settle,
        asked_out=seen,
    )
    marks.append((f"node discovery ({len(set(node_ids.values()))} nodes)", time.perf_counter()))
    TRAFFIC.take()  # this run's messages only
    resources = ServerResources(bundle, partition, device, out_dir)
    strategy = strategy_cls(cfg, node_ids, model, resources)
    if node_map is None:  # a node connecting later may claim a partition: ambiguous, refused
        strategy.late_nodes = LateClaims(seen, timeout=min(cfg.round_timeout, 30.0))
    strategy.run_token = ckpt.run_token if ckpt else new_run_token()
    initial = ArrayRecord(model.state_dict())
    if ckpt is not None:
        restore_strategy(strategy, ckpt, out_dir)
        initial = to_record(ckpt.arrays)
    # Only now, with the checkpoint and the strategy's state accepted, are the run folder's
    # files rewritten (config.yaml, metrics.jsonl; a resumed run's old summary.json removed).
    recorder = RunRecorder.create(cfg, ckpt.metrics if ckpt else None, command=launch.command)
    runlog.open(recorder.out_dir)
    log(
        INFO,
        "fedgo-flwr: experiment '%s', strategy %s, output %s",
        cfg.name,
        cfg.strategy.name,
        recorder.out_dir,
    )
    recorder.write_partition(partition.to_json(bundle.train.y, bundle.train.num_classes))
    if ckpt is not None:
        log(INFO, "resume: continuing %s after round %d", recorder.out_dir, ckpt.round)
    set_up = time.perf_counter()
    strategy.setup(grid)  # FedGO's pre-FL stage
    ready = time.perf_counter()
    stages = {"launch": launched} if launched else {}
    stages["startup"] = set_up - marks[0][1]
    stages.update(strategy.stage_times)
    stages["setup"] = ready - set_up - sum(strategy.stage_times.values())
    recorder.attach(
        model, bundle.test, device, started=marks[0][1] - launched, stages=stages, early=early
    )
    if ckpt is not None:
        restore_rng(ckpt.rng)
    marks.append(("strategy set-up", time.perf_counter()))
    log(
        INFO,
        "fedgo-flwr: ServerApp start-up %.1f s: %s",
        marks[-1][1] - marks[0][1],
        ", ".join(f"{name} {t - marks[i][1]:.1f} s" for i, (name, t) in enumerate(marks[1:])),
    )

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
        record=recorder.record,
        first_round=ckpt.round + 1 if ckpt else 1,
        round_end=round_end,
    )
    return recorder.finish(result.arrays if len(result.arrays) else None, strategy.report())
