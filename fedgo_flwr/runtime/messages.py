"""What server and clients say to each other: record keys, message types, array conversion and
the streaming of a round's replies.

Every message of a round carries, in ``content``:

- ``"arrays"`` (:data:`ARRAYS`): the model (server -> client: the global model; client -> server:
  the trained one) or, in a strategy's extra message, the payload (FedGO's discriminator);
- ``"config"`` (:data:`CONFIG`), server -> client: :data:`SERVER_ROUND`, :data:`ALGORITHM` (the
  client algorithm, a module of ``clients/``), :data:`EXPERIMENT` (the core experiment as JSON,
  without any strategy's parameters), :data:`CLIENT_PARAMS` (the client algorithm's own
  parameters as JSON), :data:`RUN_TOKEN` (names the client's state files) and
  :data:`REPLY_TOKEN` (names this one message: :func:`new_reply_token`);
- ``"metrics"`` (:data:`METRICS`), client -> server: :data:`NUM_EXAMPLES`, :data:`PARTITION_ID` and
  training metrics;
- ``"echo"`` (:data:`ECHO`), client -> server: a ConfigRecord holding only :data:`REPLY_TOKEN`,
  the token of the message the reply answers (the ClientApp adds it to every reply:
  :func:`fedgo_app.client_app.reply_token_mod`; the intake compares it with the one it
  sent: :class:`fedgo_flwr.protocol.RoundIntake`).

Every message to a client names its partition in ``metadata.group_id`` (``str(k)``), and the
reply carries it back: a simulated node may serve several partitions
(:func:`fedgo_app.client_app.message_partition`). Algorithms add records of their own
(SCAFFOLD's control variates); their keys live with the algorithm (``clients/<x>.py``).

:data:`TRAFFIC` counts the bytes of the arrays every message that :func:`stream_replies` sends
carries, and those of every reply (the serialised ``Array`` data of all ArrayRecords; configs
and metrics are a few hundred bytes and not counted); the recorder puts them in each round's
``bytes_down`` / ``bytes_up`` (round 0: the pre-FL stage, e.g. FedGO's discriminator round).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Message, RecordDict
from flwr.serverapp import Grid

# Records of a message's content
ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"

# Keys of the server's ConfigRecord
SERVER_ROUND = "server-round"
ALGORITHM = "client-algorithm"
EXPERIMENT = "experiment"
CLIENT_PARAMS = "client-params"
RUN_TOKEN = "run-token"
REPLY_TOKEN = "reply-token"

# The client's echo of the message it answers (a ConfigRecord of the reply)
ECHO = "echo"

# Keys of a client's MetricRecord
NUM_EXAMPLES = "num-examples"
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
SHARES_PARTITIONS = "shares-partitions"  # query reply: the node may serve several partitions


def new_reply_token() -> str:
    """A fresh token for one message to a client: 32 hex digits from the operating system's
    randomness (:mod:`secrets`), never from the run's seeded generators, so that nobody can
    predict it and no seeded result depends on it."""
    return secrets.token_hex(16)


def echoed_token(content: RecordDict) -> str | None:
    """The reply token a reply's ``content`` echoes (``None``: no :data:`ECHO` ConfigRecord
    holding exactly one string :data:`REPLY_TOKEN`)."""
    echo = content.config_records.get(ECHO)
    if echo is None or set(echo.keys()) != {REPLY_TOKEN}:
        return None
    token = echo[REPLY_TOKEN]
    return token if isinstance(token, str) else None


def to_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    """An ArrayRecord as plain NumPy arrays, key by key."""
    return {k: v.numpy() for k, v in record.items()}


def to_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    """NumPy arrays as an ArrayRecord (0-d arrays stay 0-d)."""
    # np.asarray(order="C"), not np.ascontiguousarray, which turns a 0-d array (BatchNorm's
    # num_batches_tracked) into shape (1,).
    return ArrayRecord({k: Array(np.asarray(v, order="C")) for k, v in arrays.items()})


def array_bytes(content: RecordDict) -> int:
    """Bytes of the serialised arrays in a message's ``content`` (all its ArrayRecords)."""
    return sum(len(a.data) for record in content.array_records.values() for a in record.values())


@dataclass
class Traffic:
    """Array bytes sent to clients (``down``) and received from them (``up``)."""

    down: int = 0
    up: int = 0

    def take(self) -> tuple[int, int]:
        """``(down, up)`` since the last call; starts counting again from zero."""
        out = (self.down, self.up)
        self.down = self.up = 0
        return out

    def received(self, reply: Message) -> Message:
        if not reply.has_error():
            self.up += array_bytes(reply.content)
        return reply


TRAFFIC = Traffic()
"""The server process's count (the ServerApp resets it when a run starts)."""


MIN_POLL = 0.02
"""The shortest wait of :func:`stream_replies` between two pulls, in seconds."""

_waiting_threads: int | None = None


def use_waiting_threads(threads: int | None) -> None:
    """Torch threads of this process while :func:`stream_replies` waits for clients that are
    still training (``resources.server_cpus_waiting``); ``None``: leave the count alone."""
    global _waiting_threads
    _waiting_threads = threads


def waiting_threads() -> int | None:
    """What :func:`use_waiting_threads` set (``None``: leave the count alone)."""
    return _waiting_threads


def stream_replies(
    grid: Grid, messages: Iterable[Message], timeout: float, poll_interval: float = 0.2
) -> Iterator[Message]:
    """Push ``messages``; yield their replies in arrival order until all came or ``timeout``.

    Flower's ``Grid.send_and_receive`` returns only when every reply has come (or the timeout
    has passed), holding all of them in memory, and the deployment grid polls the SuperLink
    every 3 s. This yields each reply as soon as it is pulled, so a strategy can fold it in (add
    it to a running average, turn it into teacher logits) and drop it while slower clients are
    still training. A grid with a ``stream`` method of its own
    (:class:`fedgo_app.inprocess.InProcessGrid`) serves the messages itself: one after
    another in this process, or side by side in its local workers, where it applies the
    waiting threads below itself.

    Polling backs off: after a pull that found a reply the next comes :data:`MIN_POLL` seconds
    later, and each empty pull doubles the wait, up to ``poll_interval``. Replies of clients
    that finish close together are picked up within tens of milliseconds, and a long wait for
    a slow client costs one short call every ``poll_interval`` (a fixed wait would hold the
    last reply of a round for half of it on average). Every pull asks for all pending ids:
    pulling a few at a time made many-client rounds slower without lowering the server's peak
    memory (``benchmarks/studies/framework-overhead.md``, "Backoff polling";
    ``benchmarks/studies/scale.md``, "Pull batches").

    With :func:`use_waiting_threads` set (``resources.server_cpus_waiting``), the server's work
    on the replies (FedDF's teacher logits) runs with that many torch threads while any client
    of the round still trains, and with the process's own count again once the last reply has
    been pulled (also when the caller stops early). In a simulation on one machine the clients'
    workers and the server then do not oversubscribe the cores
    (``benchmarks/studies/performance.md``, "Thread layout"); a deployed server on its own
    machine has no reason to set it.

    An error reply that the SuperLink makes in a node's place (``Node Unavailable``, when the
    node's heartbeats stopped) comes from the SuperLink's own node id; it is yielded as from the
    node the message went to, so that the strategy counts and names the right client.
    """
    messages = list(messages)
    TRAFFIC.down += sum(array_bytes(m.content) for m in messages)
    own = getattr(grid, "stream", None)
    if own is not None:
        for reply in own(messages, timeout=timeout):
            yield TRAFFIC.received(reply)
        return
    ids = list(grid.push_messages(messages))
    # Flower returns one id per message, in order (a test grid may return ids alone).
    sent_to = {mid: m.metadata.dst_node_id for mid, m in zip(ids, messages, strict=False) if mid}
    pending = set(ids)
    deadline = time.monotonic() + timeout
    wait = 0.0
    full = torch.get_num_threads()
    if _waiting_threads is not None and pending:
        torch.set_num_threads(min(_waiting_threads, full))
    try:
        while pending:
            before = len(pending)
            pulled = list(grid.pull_messages(set(pending)))
            for reply in pulled:
                pending.discard(reply.metadata.reply_to_message_id)
            if not pending:  # no client trains any more: the server's work gets every thread
                torch.set_num_threads(full)
            for reply in pulled:
                yield TRAFFIC.received(_from_destination(reply, sent_to))
            if not pending:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                return
            wait = MIN_POLL if len(pending) < before or not wait else min(2 * wait, poll_interval)
            time.sleep(min(wait, left))
    finally:
        torch.set_num_threads(full)


def _from_destination(reply: Message, sent_to: Mapping[str, int]) -> Message:
    """``reply``, as sent by the node its message went to if the SuperLink made it instead."""
    node = sent_to.get(reply.metadata.reply_to_message_id)
    if node is not None and reply.has_error() and reply.metadata.src_node_id != node:
        # Metadata has no setter; Flower itself fills metadata fields this way (message ids).
        reply.metadata.__dict__["_src_node_id"] = node
    return reply
