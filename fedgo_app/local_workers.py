"""Clients of ``--local`` side by side: worker processes that take a round's messages as they
come free.

:class:`LocalWorkers` starts ``N`` processes (``resources.local_workers``). Each message goes to
the first worker that is free, as Flower's Ray backend hands it to the first free actor: a round
whose clients take unequal times keeps every worker busy until its last messages. A node's
``Context.state`` lives in this process and travels with its message (Flower's protobuf of the
``RecordDict``, nothing when it is empty), and the worker sends it back with the reply, so any
worker can serve any node and the state persists from round to round as in one process (Flower's
simulation keeps the node's ``Context`` in the runtime the same way). Two messages to one node
never run at once: the second waits for the first's reply and its state. A handler sets its torch
threads to ``resources.client_cpus`` as it does anywhere. Messages and replies cross the process
boundary in Flower's own serialisation (``flwr.common.serde.message_to_proto``, the protobuf a
SuperLink carries). A worker gets its next message only once it has replied to the one before,
so neither side ever blocks writing to the other.

:meth:`LocalWorkers.serve` yields the replies in the order of the messages, each as soon as it
and every reply before it are made: the strategy folds them in the order that one process
would, so results do not depend on the number of workers. A reply whose handler took longer
than ``timeout`` seconds is dropped, as in :class:`fedgo_app.inprocess.InProcessGrid` (the
node's state keeps what the handler did, as it would in one process). A worker that dies
(killed, or a client that ends its process: the ``exit`` fault) gives an error reply
(``CLIENT_APP_CRASHED``) for the message it was serving, and that node keeps the state it had
before the message (what a SuperNode holds when its ClientApp process crashes); a new worker
takes the slot's next message. The workers' log records go to this process's Flower logger, so
the terminal and ``run.log`` show the clients' lines as with one process.

Start method: on Linux the workers are forked from this process (they share its loaded modules
and data) when each runs one torch thread. GNU OpenMP, which PyTorch's CPU kernels use, is not
fork-safe: a child that runs a parallel region with 2 or more threads after its parent ran one
hangs (measured: a forked 2-thread matmul never returns). So with ``client_cpus`` above 1, and
on other systems, the workers are spawned (a fresh interpreter each: imports and data loading
once per worker: several seconds, more under load).
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import multiprocessing.connection as mpc
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Iterator, Mapping
from logging import WARNING
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.common.serde import (
    message_from_proto,
    message_to_proto,
    recorddict_from_proto,
    recorddict_to_proto,
)
from flwr.proto.message_pb2 import Message as ProtoMessage
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict
from flwr.supercore import log
from flwr.supercore.logger import LOGGER_NAME
from flwr.supercore.task_identity import TaskIdentity

SERVER_NODE_ID = 1

AppRef = ClientApp | str
"""A ClientApp, or ``"module:attribute"`` naming one (what a spawned worker imports)."""


def encode(message: Message) -> bytes:
    """A message as Flower's protobuf bytes."""
    return message_to_proto(message).SerializeToString()


def decode(data: bytes) -> Message:
    """The message of :func:`encode`'s bytes."""
    return message_from_proto(ProtoMessage.FromString(data))


def encode_state(state: RecordDict) -> bytes | None:
    """A node's ``Context.state`` as Flower's protobuf bytes; ``None`` when it is empty."""
    return recorddict_to_proto(state).SerializeToString() if len(state) else None


def decode_state(data: bytes | None) -> RecordDict:
    """The state of :func:`encode_state`'s bytes (empty for ``None``)."""
    return RecordDict() if data is None else recorddict_from_proto(ProtoRecordDict.FromString(data))


def resolve_workers(value: int | str, nodes: int, cpus: int, client_cpus: int) -> int:
    """How many workers ``resources.local_workers`` asks for: an int as it is, ``auto`` one per
    ``client_cpus`` of the ``cpus`` available; never more than there are ``nodes``."""
    wanted = max(1, cpus // max(1, client_cpus)) if value == "auto" else int(value)
    return max(1, min(wanted, nodes))


def error_reply(msg: Message, reason: str, code: int = ErrorCode.UNKNOWN) -> Message:
    """An error reply to ``msg``, made as if by the node it went to."""
    TaskIdentity.node_id = msg.metadata.dst_node_id
    try:
        return Message(error=Error(code=code, reason=reason), reply_to=msg)
    finally:
        TaskIdentity.node_id = SERVER_NODE_ID


class _PipeHandler(logging.Handler):
    """A worker's log records, sent to the parent as ``("log", level, text, created)``."""

    def __init__(self, conn: mpc.Connection) -> None:
        super().__init__(logging.DEBUG)
        self.conn = conn

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.conn.send(("log", record.levelno, record.getMessage(), record.created))
        except Exception:  # noqa: BLE001 - logging must not end the worker
            self.handleError(record)


def _load_app(app: AppRef) -> ClientApp:
    if isinstance(app, ClientApp):
        return app
    module, _, name = app.partition(":")
    return getattr(importlib.import_module(module), name)


def worker_main(
    conn: mpc.Connection, app: AppRef, run_id: int, node_configs: Mapping[int, Mapping[str, Any]]
) -> None:
    """A worker's loop: take ``("message", bytes, state)``, answer ``("reply", bytes, seconds,
    state)`` (the handler's own time; the node's ``Context.state`` after it, as
    :func:`encode_state`); end on ``None`` or when the parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and ends us
    logger = logging.getLogger(LOGGER_NAME)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    logger.addHandler(_PipeHandler(conn))
    client_app = _load_app(app)
    TaskIdentity.run_id = run_id
    TaskIdentity.task_id = run_id
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        msg = decode(job[1])
        node = msg.metadata.dst_node_id
        context = Context(
            run_id=run_id,
            node_id=node,
            node_config=dict(node_configs[node]),
            state=decode_state(job[2]),
            run_config={},
        )
        TaskIdentity.node_id = node
        started = time.monotonic()
        try:
            reply = client_app(msg, context)
        except Exception as exc:  # noqa: BLE001 - reported like Flower's runtime does
            reason = f"{type(exc).__name__}: {exc}"
            reply = Message(error=Error(code=ErrorCode.UNKNOWN, reason=reason), reply_to=msg)
        seconds = time.monotonic() - started
        TaskIdentity.node_id = SERVER_NODE_ID
        conn.send(("reply", encode(reply), seconds, encode_state(context.state)))


def start_method(client_cpus: int) -> str:
    """``fork`` on Linux when each worker runs one torch thread, else ``spawn`` (see the module's
    docstring: GNU OpenMP after a fork)."""
    return "fork" if sys.platform.startswith("linux") and client_cpus <= 1 else "spawn"


class _Worker:
    """One worker process, its end of the pipe and the message it is busy with."""

    def __init__(
        self, ctx: Any, app: AppRef, run_id: int, node_configs: dict[int, dict[str, Any]]
    ) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=worker_main, args=(child, app, run_id, node_configs), daemon=True
        )
        self.process.start()
        child.close()
        self.busy: int | None = None  # index of the message it serves (this round's)
        self.node: int | None = None  # and that message's node

    def stop(self) -> None:
        """End the process: asked to when idle, killed when busy (the run is ending: its
        reply would go nowhere)."""
        if self.busy is not None:
            self.process.kill()
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


class _Round:
    """One :meth:`LocalWorkers.serve` call: its messages, those not sent yet (in order) and the
    replies made (``None``: too late)."""

    def __init__(self, messages: list[Message], timeout: float | None) -> None:
        self.messages = messages
        self.timeout = timeout
        self.waiting: deque[int] = deque(range(len(messages)))
        self.done: dict[int, Message | None] = {}

    def node(self, index: int) -> int:
        return int(self.messages[index].metadata.dst_node_id)


class LocalWorkers:
    """``workers`` processes serving the nodes of ``node_configs`` (node id -> node config)."""

    def __init__(
        self,
        client_app: ClientApp,
        node_configs: Mapping[int, Mapping[str, Any]],
        workers: int,
        run_id: int = 1,
        client_cpus: int = 1,
        app_ref: str | None = None,
        method: str | None = None,
    ) -> None:
        self.method = method or start_method(client_cpus)
        if self.method != "fork" and app_ref is None:
            raise ValueError(
                f"local workers started by {self.method} import their ClientApp: give app_ref "
                "('module:attribute')"
            )
        self.app: AppRef = client_app if self.method == "fork" else str(app_ref)
        self.ctx = multiprocessing.get_context(self.method)
        self.run_id = run_id
        self.count = workers
        self.node_configs = {int(n): dict(c) for n, c in node_configs.items()}
        self.slots: list[_Worker | None] = [None] * workers
        # node -> its Context.state (encode_state); a node without an entry has an empty one
        self.states: dict[int, bytes] = {}

    def state(self, node: int) -> RecordDict:
        """A copy of ``node``'s ``Context.state`` as its last handler left it."""
        return decode_state(self.states.get(node))

    def _worker(self, w: int) -> _Worker:
        worker = self.slots[w]
        if worker is not None and not worker.process.is_alive():  # it ended while idle
            log(
                WARNING,
                "local worker %d (pid %d) ended (exit code %s) between messages; a new worker "
                "takes its place",
                w,
                worker.process.pid,
                worker.process.exitcode,
            )
            worker.conn.close()
            worker = self.slots[w] = None
        if worker is None:
            worker = self.slots[w] = _Worker(self.ctx, self.app, self.run_id, self.node_configs)
        return worker

    def start(self) -> None:
        """Start every worker now (else each starts with its first message)."""
        for w in range(self.count):
            self._worker(w)

    def serve(self, messages: list[Message], timeout: float | None = None) -> Iterator[Message]:
        """Each message to the first free worker; yield the replies in the messages' order."""
        job = _Round(list(messages), timeout)
        following = 0
        try:
            self._dispatch(job)
            while following < len(job.messages):
                while following in job.done:
                    reply = job.done.pop(following)
                    following += 1
                    if reply is not None:
                        yield reply
                if following < len(job.messages):
                    self._wait(job)
        finally:
            self._drain()

    def _dispatch(self, job: _Round) -> None:
        """Give each free worker the first message not sent yet whose node no worker is
        serving (a node's next message needs the state its last one leaves)."""
        for w in range(self.count):
            while job.waiting:
                slot = self.slots[w]
                if slot is not None and slot.busy is not None:
                    break
                serving = {s.node for s in self.slots if s is not None and s.busy is not None}
                index = next((i for i in job.waiting if job.node(i) not in serving), None)
                if index is None:
                    return
                job.waiting.remove(index)
                worker = self._worker(w)
                worker.busy, worker.node = index, job.node(index)
                state = self.states.get(worker.node)
                try:
                    worker.conn.send(("message", encode(job.messages[index]), state))
                except OSError:  # it ended just now: the slot takes the next message
                    self._died(w, worker, job)

    def _wait(self, job: _Round) -> None:
        """Take what the busy workers sent: log lines, replies (with their node's state),
        deaths (an error reply); then give the free workers their next messages."""
        busy = {w: s for w, s in enumerate(self.slots) if s is not None and s.busy is not None}
        if not busy:  # _dispatch always sends a message to a free worker while any waits
            raise RuntimeError("local workers: messages wait but no worker serves any")
        waits: list[Any] = [s.conn for s in busy.values()]
        ready = mpc.wait(waits + [s.process.sentinel for s in busy.values()])
        for w, worker in busy.items():
            if worker.conn in ready:
                try:
                    item = worker.conn.recv()
                except (EOFError, OSError):  # it ended: nothing more will come
                    self._died(w, worker, job)
                    continue
                if item[0] == "log":
                    _relog(*item[1:])
                    continue
                _, data, seconds, state = item
                index = self._replied(worker, state)
                late = job.timeout is not None and seconds > job.timeout
                job.done[index] = None if late else decode(data)
            elif worker.process.sentinel in ready and not worker.conn.poll():
                self._died(w, worker, job)
        self._dispatch(job)

    def _replied(self, worker: _Worker, state: bytes | None) -> int:
        """Keep the state the worker's handler left its node; the worker is free again. The
        index of the message it answered."""
        assert worker.busy is not None and worker.node is not None
        if state is None:
            self.states.pop(worker.node, None)
        else:
            self.states[worker.node] = state
        index, worker.busy, worker.node = worker.busy, None, None
        return index

    def _died(self, w: int, worker: _Worker, job: _Round) -> None:
        worker.process.join(timeout=5)
        code = worker.process.exitcode
        reason = (
            f"local worker {w} (pid {worker.process.pid}) ended (exit code {code}) before "
            f"replying to node {worker.node}"
        )
        log(
            WARNING,
            "%s; the node keeps the state it had before the message and a new worker takes the "
            "next message",
            reason,
        )
        if worker.busy is not None:
            msg = job.messages[worker.busy]
            job.done[worker.busy] = error_reply(msg, reason, ErrorCode.CLIENT_APP_CRASHED)
        worker.busy = worker.node = None
        worker.conn.close()
        self.slots[w] = None

    def _drain(self) -> None:
        """After the caller stopped early: wait for the messages in flight (their replies are
        dropped, their nodes' states kept) so that the next round starts with idle workers;
        no further message goes out."""
        for w, worker in enumerate(self.slots):
            while worker is not None and worker.busy is not None:
                try:
                    item = worker.conn.recv()
                except (EOFError, OSError):
                    worker.busy = worker.node = None
                    worker.process.join(timeout=5)
                    worker.conn.close()
                    self.slots[w] = None
                    break
                if item[0] == "log":
                    _relog(*item[1:])
                else:
                    self._replied(worker, item[3])

    def close(self) -> None:
        """Stop every worker."""
        for w, worker in enumerate(self.slots):
            if worker is not None:
                worker.stop()
                self.slots[w] = None

    def idle(self) -> bool:
        """Whether no worker is busy with a message."""
        return all(s is None or s.busy is None for s in self.slots)

    def pids(self) -> list[int | None]:
        """The worker processes' ids (``None``: not started)."""
        return [None if s is None else s.process.pid for s in self.slots]


def _relog(level: int, text: str, created: float) -> None:
    """A worker's log record, handled by this process's Flower logger."""
    logger = logging.getLogger(LOGGER_NAME)
    if not logger.isEnabledFor(level):
        return
    record = logger.makeRecord(LOGGER_NAME, level, "(worker)", 0, "%s", (text,), None)
    record.created = created
    record.msecs = (created - int(created)) * 1000
    record.process = os.getpid()
    logger.handle(record)
