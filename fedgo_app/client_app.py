"""The Flower ClientApp: message handlers that run a client algorithm from ``clients/``.

The server sends the core experiment (JSON), the client algorithm's name and that algorithm's
own parameters in every message (:mod:`fedgo_flwr.runtime.messages`), so a SuperNode needs only its
``partition-id`` (and optionally ``data-path``) in its node config. Every reply echoes the reply
token of the message it answers (:func:`reply_token_mod`, whichever handler made it), so that
the server can tell it from a reply to another message. Handlers:

- ``query``: reply with the node's partition id (the server maps partition ids to node ids with
  it, for seeded client sampling).
- ``train``: build the client's own architecture (``model.client_models``, else
  ``model.name``), load the weights the server sent into it, train with the algorithm named in
  the message, reply with the weights, ``num-examples`` and training metrics (plus the
  algorithm's extra ArrayRecords).
- every ``train.<action>`` a client algorithm declares in its ``messages`` (FedGO's
  ``train.discriminator``), answered by the algorithm's method of that name.

What the server sends is not trusted with the node's machine. Node config keys (the node's own,
``--node-config``) bound it: ``state-dir`` (the only folder client state is kept in; the run
token and every state path are checked against it), ``allow-faults`` (whether the config's
``faults`` act on this node), ``allow-code`` (which Python code named by the config this node
may import; :mod:`fedgo_flwr.runtime.trust`), ``max-threads`` (the most torch threads the server
may ask for) and ``share-partitions`` (whether this node serves several clients, keeping each
one's state in files). A simulated node reads ``FEDGO_ALLOW_FAULTS`` / ``FEDGO_ALLOW_CODE``
instead. ``docs/architecture.md`` ("The ClientApp's node config") has each key's default and
rules.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from logging import INFO, WARNING
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable
from flwr.supercore import log

from clients import ClientAlgorithm, ClientJob, client_class
from clients import available as available_clients
from fedgo_app.discovery import parse_index
from fedgo_app.noise import quiet_known_noise
from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.config.schema import build_section
from fedgo_flwr.learning.task import (
    client_dataset,
    client_model_name,
    load_bundle,
    new_client_model,
)
from fedgo_flwr.learning.training import get_device
from fedgo_flwr.records.checkpoint import is_run_token
from fedgo_flwr.records.recorder import resolve_output_dir
from fedgo_flwr.runtime import messages as msgs
from fedgo_flwr.runtime.fileio import atomic_torch_save, safe_torch_load
from fedgo_flwr.runtime.kernels import (
    use_channels_last,
    use_deterministic,
    use_gpu_inference_batch,
    use_precision,
)
from fedgo_flwr.runtime.rng import make_rng
from fedgo_flwr.runtime.trust import node_code_policy


def node_policy_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Run every handler under this node's own ``allow-code`` policy: code that the server's
    config names is imported only if the node's operator allowed it
    (:mod:`fedgo_flwr.runtime.trust`)."""
    with node_code_policy(context.node_config):
        return call_next(msg, context)


def reply_token_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Echo the reply token of the message in its reply (ConfigRecord ``"echo"``), whichever
    handler made the reply: the server takes only a reply that answers the message it sent
    (:class:`fedgo_flwr.protocol.RoundIntake`). A message without a token (the discovery
    query) and an error reply are left as they are."""
    reply = call_next(msg, context)
    config = msg.content.config_records.get(msgs.CONFIG) if msg.has_content() else None
    token = None if config is None else config.get(msgs.REPLY_TOKEN)
    if isinstance(token, str) and reply.has_content():
        reply.content[msgs.ECHO] = ConfigRecord({msgs.REPLY_TOKEN: token})
    return reply


app = ClientApp(mods=[node_policy_mod, reply_token_mod])
quiet_known_noise()  # in a simulation, before Ray starts (fedgo_app.noise)


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


def _faults_on(context: Context, cfg: ExperimentConfig, pid: int, server_round: int) -> bool:
    """Whether to act out ``cfg.faults`` here: only on a node that opted in (WARNING if not)."""
    if faults_allowed(context):
        return True
    kinds = [f.kind for f in cfg.faults if f.applies(pid, server_round)]
    if kinds:
        log(
            WARNING,
            "client %d, round %d: ignoring the server's injected fault(s) %s: this node has not "
            "opted in (node config allow-faults=true, or %s=1 for simulated nodes)",
            pid,
            server_round,
            ", ".join(kinds),
            ALLOW_FAULTS_ENV,
        )
    return False


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
    value = context.node_config["partition-id"]
    pid = parse_index(value)
    if pid is None:
        raise ValueError(f"node config partition-id = {str(value)[:40]!r}: must be an integer >= 0")
    return pid


TRUE_WORDS = ("1", "true", "yes", "on")
ALLOW_FAULTS_ENV = "FEDGO_ALLOW_FAULTS"
SHARE_PARTITIONS = "share-partitions"


def _in_simulation() -> bool:
    """Whether this process is a worker of Flower's Ray simulation runtime."""
    ray = sys.modules.get("ray")
    return bool(ray is not None and ray.is_initialized())


def shares_partitions(context: Context) -> bool:
    """Whether this node may serve partitions other than its own ``partition-id``: node config
    ``share-partitions``, else whether it is a simulated node."""
    value = context.node_config.get(SHARE_PARTITIONS)
    if value is None:
        return _in_simulation()
    return str(value).strip().lower() in TRUE_WORDS


def message_partition(msg: Message, context: Context) -> int:
    """The partition (client) a message is for: its ``group_id`` when the server set one, else
    this node's ``partition-id``. A partition this node does not serve is refused
    (``ValueError``; the reply is an error), naming both."""
    own = _partition_id(context)
    group = msg.metadata.group_id
    if not group:
        return own
    if parse_index(group) is None:
        raise ValueError(f"message group_id {group[:40]!r} is not a partition id")
    pid = int(group)
    if pid == own:
        return pid
    if not shares_partitions(context):
        raise ValueError(
            f"this SuperNode serves partition {own}, the message is for partition {pid}: a "
            "deployment needs one SuperNode per client (or node config share-partitions=true)"
        )
    total = parse_index(context.node_config.get(msgs.NUM_PARTITIONS, 0)) or 0
    if total < 1 or pid % total != own:
        raise ValueError(
            f"node with partition-id {own} of num-partitions {total or '?'} does not serve "
            f"partition {pid} (a node serves the partitions k with k mod num-partitions == "
            "its partition-id)"
        )
    return pid


def faults_allowed(context: Context) -> bool:
    """Whether this node opted in to the config's deliberate faults.

    Node config ``allow-faults``; if the node config lacks it, ``$FEDGO_ALLOW_FAULTS`` of this
    process (simulated nodes have no node config of their own). Never the server's config.
    """
    value = context.node_config.get("allow-faults")
    if value is None:
        value = os.environ.get(ALLOW_FAULTS_ENV, "")
    return str(value).strip().lower() in TRUE_WORDS


def node_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def thread_cap(context: Context) -> int:
    """The most torch threads a server may ask this node for: node config ``max-threads``,
    else :func:`node_cpus`."""
    value = context.node_config.get("max-threads")
    if value is None:
        return node_cpus()
    try:
        cap = int(str(value))
    except ValueError:
        cap = 0
    if cap < 1:
        raise ValueError(f"node config max-threads = {value!r}: must be an integer >= 1")
    return cap


_warned_threads: set[tuple[int, int]] = set()


def client_threads(context: Context, requested: int) -> int:
    """``resources.client_cpus`` from the server, capped at :func:`thread_cap` (WARNING once)."""
    cap = thread_cap(context)
    if requested > cap and (requested, cap) not in _warned_threads:
        _warned_threads.add((requested, cap))
        log(
            WARNING,
            "partition %s: the server asks for %d threads (resources.client_cpus); using %d, "
            "this node's limit (its CPUs, or node config max-threads)",
            context.node_config.get("partition-id"),
            requested,
            cap,
        )
    return max(1, min(requested, cap))


def _data_path(context: Context) -> str | None:
    value = context.node_config.get("data-path")
    return str(value) if value else None


def _state_dir(
    context: Context, cfg: ExperimentConfig, token: str, pid: int, shared: bool = False
) -> Path | None:
    """Where this client keeps its state between rounds (``None``: nowhere, with neither
    ``checkpoint`` nor a node that serves several partitions (``shared``)).

    Node config ``state-dir`` if given, else ``<output_dir>/client-state``; one folder per run
    token (a resumed run keeps its token, a fresh run gets a new one) and partition id. The
    token comes from the server: only the form
    :func:`fedgo_flwr.records.checkpoint.new_run_token` makes is accepted, and the folder must
    resolve inside the base (no ``..``, absolute paths or symbolic links out of it).
    """
    if not (cfg.checkpoint or shared) or not token:
        return None
    if not is_run_token(token):
        raise ValueError(
            f"client {pid}: refusing the server's run token {token[:80]!r}: "
            "a run token is 32 hex digits (it names this node's state folder)"
        )
    value = context.node_config.get("state-dir")
    base = Path(str(value)).expanduser() if value else None
    base = (base or resolve_output_dir(cfg.output_dir) / "client-state").resolve()
    folder = (base / token / f"partition-{pid}").resolve()
    if not folder.is_relative_to(base):
        raise ValueError(f"client {pid}: state folder {folder} is outside {base}; refused")
    return folder


def restore_state(state: RecordDict, folder: Path | None, server_round: int) -> None:
    """Reload the client's state (e.g. SCAFFOLD's c_i) into ``state`` from its files: after a
    restart of the run, and every round on a node that serves several partitions.

    Only when ``state`` holds none; the newest file saved before ``server_round``
    that is readable (loaded with ``weights_only=True``: tensors and plain data only, so a
    planted file runs no code). An unreadable one is skipped with a WARNING for the one
    before it; if none is readable, ``ValueError`` names them (the reply is an error).
    """
    if folder is None or state.array_records or not folder.is_dir():
        return
    saved = sorted(
        (int(f.stem.split("-")[1]), f) for f in folder.glob("round-*.pt") if f.stem[6:].isdigit()
    )
    earlier = [f for r, f in saved if r < server_round]
    problems: list[str] = []
    for path in reversed(earlier):
        try:
            if not path.resolve().is_relative_to(folder):
                raise ValueError(f"client state file {path} points outside {folder}")
            saved = safe_torch_load(path, "client state file")
            records = {str(k): ArrayRecord(v) for k, v in saved.items()}
        except (ValueError, TypeError, AttributeError) as exc:
            log(WARNING, "%s; trying an earlier one", exc)
            problems.append(str(exc))
            continue
        for name, record in records.items():
            state[name] = record
        return
    if problems:
        raise ValueError("no readable client state: " + "; ".join(problems))


def save_state(state: RecordDict, folder: Path | None, server_round: int) -> None:
    """Keep the client's ``state`` after ``server_round`` on disk (the last two rounds)."""
    if folder is None or not state.array_records:
        return
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {k: v.to_torch_state_dict() for k, v in state.array_records.items()}
    atomic_torch_save(folder / f"round-{server_round}.pt", arrays)
    saved = sorted(int(f.stem.split("-")[1]) for f in folder.glob("round-*.pt"))
    for r in saved[:-2]:
        (folder / f"round-{r}.pt").unlink(missing_ok=True)


def load_arrays(
    model: torch.nn.Module, arrays: ArrayRecord, cfg: ExperimentConfig, pid: int
) -> None:
    """Load the server's ``arrays`` into this client's own architecture (``model.client_models``);
    arrays of another architecture raise ``ValueError`` naming it (the reply is an error)."""
    try:
        model.load_state_dict(arrays.to_torch_state_dict())
    except RuntimeError as exc:
        name = client_model_name(cfg, pid)
        raise ValueError(
            f"the server's arrays do not fit client {pid}'s model '{name}': {exc}"
        ) from None


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Report this node's partition id (and the federation size, if its node config says)."""
    metrics = {
        msgs.PARTITION_ID: _partition_id(context),
        msgs.SHARES_PARTITIONS: int(shares_partitions(context)),
    }
    if msgs.NUM_PARTITIONS in context.node_config:
        value = context.node_config[msgs.NUM_PARTITIONS]
        total = parse_index(value)
        if not total:
            raise ValueError(
                f"node config num-partitions = {str(value)[:40]!r}: must be an integer >= 1"
            )
        metrics[msgs.NUM_PARTITIONS] = total
    return Message(content=RecordDict({msgs.METRICS: MetricRecord(metrics)}), reply_to=msg)


def _job(msg: Message, context: Context, message_type: str) -> tuple[ClientAlgorithm, ClientJob]:
    """The client algorithm the message names and the job it is to do (for the partition the
    message names: :func:`message_partition`)."""
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
    pid = message_partition(msg, context)
    torch.set_num_threads(client_threads(context, cfg.resources.client_cpus))
    use_channels_last(cfg.resources.channels_last)
    use_gpu_inference_batch(cfg.resources.gpu_inference_batch)
    use_precision(cfg.resources.precision)
    use_deterministic(cfg.resources.deterministic)
    device = get_device(cfg.client_device)
    _log_device_once(device)
    job = ClientJob(
        cfg=cfg,
        params=params,
        partition_id=pid,
        server_round=server_round,
        data=client_dataset(cfg, pid, _data_path(context)),
        device=device,
        rng=make_rng(cfg.seed, message_type, server_round, pid),
        content=msg.content,
        # A node serving several partitions keeps each one's state in files only.
        state=RecordDict() if shares_partitions(context) else context.state,
    )
    return algorithm(), job


_logged_devices: set[str] = set()


def _log_device_once(device: torch.device) -> None:
    """Say once per process which device the clients here train on."""
    if str(device) not in _logged_devices:
        _logged_devices.add(str(device))
        log(INFO, "fedgo-flwr client: training on %s (pid %d)", device, os.getpid())


def _client_state_dir(msg: Message, context: Context, job: ClientJob) -> Path | None:
    token = str(msg.content[msgs.CONFIG].get(msgs.RUN_TOKEN, ""))
    return _state_dir(context, job.cfg, token, job.partition_id, shares_partitions(context))


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round of local training by the algorithm the server names.

    Besides its training time (``train_time``) the reply says how long the whole handler took,
    set-up and reply included (``handler_time``: parsing the config, the data, the model, the
    state files), so that a benchmark can tell this code's cost per message from Flower's."""
    started = time.perf_counter()
    algorithm, job = _job(msg, context, "train")
    cfg, pid, server_round = job.cfg, job.partition_id, job.server_round
    faults = _faults_on(context, cfg, pid, server_round)
    if faults:
        inject_fault(cfg, pid, server_round, "before")
    state_dir = _client_state_dir(msg, context, job)
    restore_state(job.state, state_dir, server_round)
    job.model = new_client_model(cfg, load_bundle(cfg.data, _data_path(context)), pid)
    load_arrays(job.model, msg.content[msgs.ARRAYS], cfg, pid)
    stats, extra = algorithm.train(job)
    save_state(job.state, state_dir, server_round)
    metrics = MetricRecord(
        {
            msgs.NUM_EXAMPLES: stats.num_examples,
            "train_loss": stats.loss,
            "train_steps": stats.steps,
            "train_time": stats.seconds,
            **stats.metrics,
            msgs.PARTITION_ID: pid,
        }
    )
    job.model.cpu()
    state = job.model.state_dict()
    kind = inject_fault(cfg, pid, server_round, "after") if faults else None
    if kind is not None:
        state = corrupt(state, kind)
    arrays = ArrayRecord(state)
    metrics["handler_time"] = time.perf_counter() - started
    content = RecordDict({msgs.ARRAYS: arrays, msgs.METRICS: metrics, **extra})
    return Message(content=content, reply_to=msg)


def _extra_handler(message_type: str) -> Callable[[Message, Context], Message]:
    """A handler for a message type that client algorithms declare (``messages``)."""

    def handle(msg: Message, context: Context) -> Message:
        algorithm, job = _job(msg, context, message_type)
        method = algorithm.messages.get(message_type)
        if method is None:
            raise ValueError(f"client algorithm '{algorithm.name}' does not handle {message_type}")
        state_dir = _client_state_dir(msg, context, job)
        restore_state(job.state, state_dir, job.server_round)
        records, metrics = getattr(algorithm, method)(job)
        save_state(job.state, state_dir, job.server_round)
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
