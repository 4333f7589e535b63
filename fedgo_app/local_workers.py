"""Clients of ``--local`` side by side: worker processes that each serve a fixed set of nodes.

:class:`LocalWorkers` starts ``N`` processes (``resources.local_workers``). Node ``n`` is always
served by worker ``(n - 2) mod N``, which holds that node's ``Context`` (so ``Context.state``
persists from round to round as in one process) and its own ClientApp; a handler sets its torch
threads to ``resources.client_cpus`` as it does anywhere. Messages and replies cross the process
boundary in Flower's own serialisation (``flwr.common.serde.message_to_proto``, the protobuf a
SuperLink carries). A worker gets its next message only once it has replied to the one before,
so neither side ever blocks writing to the other.

:meth:`LocalWorkers.serve` yields the replies in the order of the messages, each as soon as it
and every reply before it are made: the strategy folds them in the order that one process
would, so results do not depend on the number of workers. A reply whose handler took longer
than ``timeout`` seconds is dropped, as in :class:`fedgo_app.inprocess.InProcessGrid`. A
worker that dies (killed, or a client that ends its process: the ``exit`` fault) gives an
error reply (``CLIENT_APP_CRASHED``) for every message of the round it had not answered; a new
worker serves its nodes from the next messages on, with empty ``Context.state``, as a
restarted node has. The workers' log records go to this process's Flower logger, so the
terminal and ``run.log`` show the clients' lines as with one process.

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
from collections.abc import Iterator, Mapping
from logging import WARNING
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.proto.message_pb2 import Message as ProtoMessage
from flwr.supercore import log
from flwr.supercore.logger import LOGGER_NAME
from flwr.supercore.task_identity import TaskIdentity

SERVER_NODE_ID = 1
FIRST_NODE_ID = 2

AppRef = ClientApp | str
"""A ClientApp, or ``"module:attribute"`` naming one (what a spawned worker imports)."""


def encode(message: Message) -> bytes:
    """A message as Flower's protobuf bytes."""
    return message_to_proto(message).SerializeToString()


def decode(data: bytes) -> Message:
    """The message of :func:`encode`'s bytes."""
    return message_from_proto(ProtoMessage.FromString(data))


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
    """A worker's loop: take ``("message", bytes)``, answer ``("reply", bytes, seconds)``
    (the handler's own time); end on ``None`` or when the parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and ends us
    logger = logging.getLogger(LOGGER_NAME)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    logger.addHandler(_PipeHandler(conn))
    client_app = _load_app(app)
    contexts = {
        node: Context(
            run_id=run_id, node_id=node, node_config=dict(cfg), state=RecordDict(), run_config={}
        )
        for node, cfg in node_configs.items()
    }
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
        TaskIdentity.node_id = node
        started = time.monotonic()
        try:
            reply = client_app(msg, contexts[node])
        except Exception as exc:  # noqa: BLE001 - reported like Flower's runtime does
            reason = f"{type(exc).__name__}: {exc}"
            reply = Message(error=Error(code=ErrorCode.UNKNOWN, reason=reason), reply_to=msg)
        seconds = time.monotonic() - started
        TaskIdentity.node_id = SERVER_NODE_ID
        conn.send(("reply", encode(reply), seconds))


def start_method(client_cpus: int) -> str:
    """``fork`` on Linux when each worker runs one torch thread, else ``spawn`` (see the module's
    docstring: GNU OpenMP after a fork)."""
    return "fork" if sys.platform.startswith("linux") and client_cpus <= 1 else "spawn"


class _Worker:
    """One worker process, its end of the pipe and the message it is busy with."""

    def __init__(self, ctx: Any, app: AppRef, run_id: int, nodes: dict[int, dict]) -> None:
        self.nodes = sorted(nodes)
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=worker_main, args=(child, app, run_id, nodes), daemon=True
        )
        self.process.start()
        child.close()
        self.busy: int | None = None  # index of the message it serves (this round's)

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

    def worker_of(self, node: int) -> int:
        """The worker that serves ``node`` (always the same one)."""
        return (node - FIRST_NODE_ID) % self.count

    def _worker(self, w: int) -> _Worker:
        worker = self.slots[w]
        if worker is not None and not worker.process.is_alive():  # it ended while idle
            log(
                WARNING,
                "local worker %d (pid %d, nodes %s) ended (exit code %s) between messages; "
                "a new worker serves its nodes",
                w,
                worker.process.pid,
                worker.nodes,
                worker.process.exitcode,
            )
            worker.conn.close()
            worker = self.slots[w] = None
        if worker is None:
            nodes = {n: c for n, c in self.node_configs.items() if self.worker_of(n) == w}
            worker = self.slots[w] = _Worker(self.ctx, self.app, self.run_id, nodes)
        return worker

    def start(self) -> None:
        """Start every worker now (else each starts with its first message)."""
        for w in range(self.count):
            self._worker(w)

    def serve(self, messages: list[Message], timeout: float | None = None) -> Iterator[Message]:
        """Each message to its node's worker; yield the replies in the messages' order."""
        queues: dict[int, list[int]] = {}
        for i, msg in enumerate(messages):
            queues.setdefault(self.worker_of(msg.metadata.dst_node_id), []).append(i)
        done: dict[int, Message | None] = {}
        following = 0
        try:
            for w in queues:
                self._next(w, queues[w], messages, done)
            while following < len(messages):
                while following in done:
                    reply = done.pop(following)
                    following += 1
                    if reply is not None:
                        yield reply
                if following < len(messages):
                    self._wait(queues, messages, done, timeout)
        finally:
            self._drain()

    def _next(
        self,
        w: int,
        queue: list[int],
        messages: list[Message],
        done: dict[int, Message | None],
    ) -> None:
        """Send worker ``w`` the next message of its ``queue``, if any."""
        if queue:
            worker = self._worker(w)
            worker.busy = queue.pop(0)
            try:
                worker.conn.send(("message", encode(messages[worker.busy])))
            except OSError:  # it ended just now
                self._died(w, worker, queue, messages, done)

    def _wait(
        self,
        queues: dict[int, list[int]],
        messages: list[Message],
        done: dict[int, Message | None],
        timeout: float | None,
    ) -> None:
        """Take what the busy workers sent: log lines, replies (the next message then goes
        out), deaths (error replies for what the worker had left)."""
        busy = {w: s for w, s in enumerate(self.slots) if s is not None and s.busy is not None}
        waits: list[Any] = [s.conn for s in busy.values()]
        ready = mpc.wait(waits + [s.process.sentinel for s in busy.values()])
        for w, worker in busy.items():
            if worker.conn in ready:
                try:
                    item = worker.conn.recv()
                except (EOFError, OSError):  # it ended: nothing more will come
                    self._died(w, worker, queues.get(w, []), messages, done)
                    continue
                if item[0] == "log":
                    _relog(*item[1:])
                    continue
                _, data, seconds = item
                index, worker.busy = worker.busy, None
                late = timeout is not None and seconds > timeout
                done[index] = None if late else decode(data)
                self._next(w, queues.get(w, []), messages, done)
            elif worker.process.sentinel in ready and not worker.conn.poll():
                self._died(w, worker, queues.get(w, []), messages, done)

    def _died(
        self,
        w: int,
        worker: _Worker,
        queue: list[int],
        messages: list[Message],
        done: dict[int, Message | None],
    ) -> None:
        worker.process.join(timeout=5)
        code = worker.process.exitcode
        reason = (
            f"local worker {w} (pid {worker.process.pid}, nodes {worker.nodes}) ended "
            f"(exit code {code}) before replying"
        )
        log(WARNING, "%s; a new worker serves its nodes from their next message", reason)
        for index in [worker.busy, *queue]:
            if index is not None:
                done[index] = error_reply(messages[index], reason, ErrorCode.CLIENT_APP_CRASHED)
        queue.clear()
        worker.busy = None
        worker.conn.close()
        self.slots[w] = None

    def _drain(self) -> None:
        """After the caller stopped early: wait for the messages in flight (their replies are
        dropped) so that the next round starts with idle workers; no further message goes
        out."""
        for w, worker in enumerate(self.slots):
            while worker is not None and worker.busy is not None:
                try:
                    item = worker.conn.recv()
                except (EOFError, OSError):
                    worker.busy = None
                    worker.process.join(timeout=5)
                    worker.conn.close()
                    self.slots[w] = None
                    break
                if item[0] == "log":
                    _relog(*item[1:])
                else:
                    worker.busy = None

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
