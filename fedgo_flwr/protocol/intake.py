"""The one intake of client replies: every reply is checked here before any strategy sees it.

A round (a training round, the discriminator round, a FedGAN round) opens a
:class:`RoundIntake` with the partitions it sent work to; every reply of that round goes
through :meth:`RoundIntake.take` with the :class:`~fedgo_flwr.protocol.spec.ReplySpec` of its
message type and the server's templates of its array records. ``take`` returns a
:class:`Checked` reply (typed, checked values) or ``None``; a refused reply is logged with one
WARNING naming the client, its node and the reason, and the round goes on. Nothing a client
sends can raise out of ``take``.

Checked, in order: the reply is no error; its ``group_id`` is a partition id in ASCII digits
that the round sent work to and that the replying node serves; it echoes the reply token of the
message this round sent to that partition; the partition has not replied before in this round;
its records and metrics are the declared ones, no more, each metric a finite number of the
declared kind and bounds; ``num-examples`` equals the server's count of the partition (n_k
weighs every average: the server never takes a client's word for it); each ArrayRecord has
exactly its template's keys, shapes and dtypes, and only finite values.

:attr:`RoundIntake.failed` counts each partition the round sent work to that has no accepted
reply once. :attr:`RoundIntake.model_faults` names the partitions refused for a reason that
points at the model the server sent (non-finite values, an update far beyond the model's norm):
when most of a round's replies have them, the round loop rolls back. Every message carries a
fresh, unpredictable reply token of its own (:func:`fedgo_flwr.runtime.messages.new_reply_token`),
so a reply captured from one client cannot be passed off as another's. ``docs/architecture.md``
("The reply intake") has each check and why the token is per message.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import Message, RecordDict
from flwr.supercore import log

from fedgo_flwr.learning.aggregation import check_arrays
from fedgo_flwr.protocol.spec import ReplySpec
from fedgo_flwr.runtime.messages import (
    ECHO,
    METRICS,
    NUM_EXAMPLES,
    REPLY_TOKEN,
    echoed_token,
    to_numpy,
)

__all__ = ["Checked", "ModelFault", "RoundIntake", "parse_group_id", "partition_of_reply"]


class ModelFault(str):
    """A reason for refusing a reply that points at the model the server sent, not at the
    client (:attr:`RoundIntake.model_faults`): a strategy's extra check returns one where
    honest training from a diverged model gives what it refuses (SCAFFOLD's control delta far
    beyond its bound)."""


Templates = Mapping[str, Mapping[str, np.ndarray]]
"""Per ArrayRecord key, the arrays a reply's record must match in keys, shapes and dtypes."""


def parse_group_id(group: Any) -> int | None:
    """The partition id a group id names: ASCII digits only (``None`` otherwise)."""
    if not isinstance(group, str) or not group or not group.isascii() or not group.isdigit():
        return None
    if len(group) > 12:  # no partition id has 13 digits; int() of a huge string is costly
        return None
    return int(group)


def partition_of_reply(
    msg: Message, node_ids: Mapping[int, int], partition_of: Mapping[int, int]
) -> int:
    """The partition ``msg`` answers for (``-1``: none this server knows): its group id, which
    must be a partition the sending node serves; without one, the node's only partition."""
    node = msg.metadata.src_node_id
    group = msg.metadata.group_id
    if group:
        pid = parse_group_id(group)
        return pid if pid is not None and node_ids.get(pid) == node else -1
    return partition_of.get(node, -1)


@dataclass
class Checked:
    """A reply that passed the intake: its partition, n_k and checked contents."""

    node_id: int
    partition_id: int
    num_examples: int  # the server's count (the claim, where the server has none)
    arrays: dict[str, dict[str, np.ndarray]]  # ArrayRecord key -> its arrays
    metrics: dict[str, Any]
    content: RecordDict


class RoundIntake:
    """The replies of one round: which partitions may answer, which did, which failed.

    ``node_ids``: partition id -> node id; ``expected``: the partitions sent work this round;
    ``client_sizes``: the server's n_k per partition (``None``: take the claim, which must be
    a whole number in ``[1, 2**53]``); ``what``: how the WARNING names the round's replies;
    ``tokens``: partition id -> the reply token of the latest message sent to it, read when
    each reply is taken (the strategy's own mapping, filled as it sends: messages and intake
    may be made in either order); a reply must echo its partition's.
    """

    def __init__(
        self,
        node_ids: Mapping[int, int],
        expected: Collection[int],
        client_sizes: Sequence[int] | None = None,
        what: str = "reply",
        *,
        tokens: Mapping[int, str],
    ) -> None:
        self.node_ids = node_ids
        served: dict[int, int] = {}
        for node in node_ids.values():
            served[node] = served.get(node, 0) + 1
        self.partition_of = {n: p for p, n in node_ids.items() if served[n] == 1}
        self.expected = set(expected)
        self.client_sizes = client_sizes
        self.what = what
        self.tokens = tokens
        self.accepted: set[int] = set()
        self.answered: set[int] = set()  # partitions some reply was credited to
        self.rejected = 0  # replies refused (a partition may be refused more than once)
        self.model_faults: dict[int, str] = {}  # partition -> why its reply points at the model

    def pid_of(self, msg: Message) -> int:
        return partition_of_reply(msg, self.node_ids, self.partition_of)

    @property
    def failed(self) -> int:
        """Partitions sent work this round without an accepted reply."""
        return len(self.expected - self.accepted)

    @property
    def silent(self) -> list[int]:
        """Partitions sent work this round that no reply answered for, in order."""
        return sorted(self.expected - self.answered)

    def take(
        self,
        msg: Message,
        spec: ReplySpec,
        templates: Templates | Callable[[int], Templates],
        extra_check: Callable[[Checked], str | None] | None = None,
        labels: Callable[[int, str], tuple[str, str]] | None = None,
    ) -> Checked | None:
        """``msg`` checked against ``spec`` and ``templates`` (or a function of the partition
        id giving them), then ``extra_check``; ``None`` (logged) if it is refused.
        ``labels(pid, key)`` names a record and its template in the reason (default:
        ``"arrays"`` / ``"ArrayRecord 'key'"`` against the global model)."""
        node = msg.metadata.src_node_id
        pid = self.pid_of(msg)
        if pid in self.expected:
            self.answered.add(pid)
        elif pid < 0:  # credit an unattributable reply to the node's partition, if it has one
            own = self.partition_of.get(node)
            if own is not None and own in self.expected:
                self.answered.add(own)
        checked = None
        try:
            reason = self._problem(msg, pid, spec)
            if reason is None:
                checked = self._unpack(msg, pid)
                reason = self._arrays_problem(checked, spec, templates, labels)
            if reason is None and extra_check is not None:
                reason = extra_check(checked)
        except Exception as exc:  # noqa: BLE001 - no reply may end the run
            reason = f"unreadable reply ({type(exc).__name__}: {exc})"
        if reason is not None:
            fault = isinstance(reason, ModelFault) or _nonfinite(msg)
            self.reject(pid, node, reason, model_fault=pid in self.expected and fault)
            return None
        self.accepted.add(pid)
        return checked

    def reject(self, pid: int, node: int, reason: str, model_fault: bool = False) -> None:
        """Count and log a refused reply of partition ``pid`` (``-1``: unknown) from ``node``;
        ``model_fault``: the reason points at the model the server sent
        (:attr:`model_faults`)."""
        self.rejected += 1
        if model_fault and pid >= 0:
            self.model_faults.setdefault(pid, reason)
        log(WARNING, "Dropping %s of client %d (node %d): %s", self.what, pid, node, reason)

    @property
    def arrived(self) -> int:
        """Partitions sent work this round that some reply answered for."""
        return len(self.answered & self.expected)

    def model_broken(self) -> bool:
        """Whether most of the replies that arrived were refused for reasons that point at
        the model sent (:attr:`model_faults`): strictly more than half of them, so that one
        client of two cannot make a round look broken."""
        faults = len(self.model_faults.keys() & self.expected)
        return faults > 0 and 2 * faults > self.arrived

    def _problem(self, msg: Message, pid: int, spec: ReplySpec) -> str | None:
        if msg.has_error():
            return f"client error: {msg.error.reason}"
        if msg.metadata.group_id and parse_group_id(msg.metadata.group_id) is None:
            return f"group id {msg.metadata.group_id!r} is not a partition id in ASCII digits"
        if pid < 0:
            return "not a partition this node serves"
        if pid not in self.expected:
            return "not sent work in this round"
        reason = self._token_problem(msg.content, pid)
        if reason is not None:
            return reason
        if pid in self.accepted:
            return "a second reply for this client in this round"
        content = msg.content
        reason = spec.records_problem(
            content.array_records, content.metric_records, content.config_records
        )
        if reason is not None:
            return reason
        metrics = content[METRICS]
        if self.client_sizes is not None and NUM_EXAMPLES in metrics:
            size, claim = self.client_sizes[pid], metrics[NUM_EXAMPLES]
            if isinstance(claim, bool) or claim != size:
                return (
                    f"claims {NUM_EXAMPLES} {claim!r}, but the server's count of partition "
                    f"{pid} is {size}"
                )
        return spec.metrics_problem(metrics)

    def _token_problem(self, content: RecordDict, pid: int) -> str | None:
        """Why the reply does not answer the message this round sent to partition ``pid``."""
        sent = self.tokens.get(pid)
        echo = echoed_token(content)
        if sent is None:  # the strategy sent no token: nothing could answer it
            return "the server holds no reply token for this client's message"
        if echo is None:
            return (
                f"echoes no reply token (a ConfigRecord {ECHO!r} holding only a string "
                f"{REPLY_TOKEN!r}): it answers no message sent"
            )
        if not (echo.isascii() and hmac.compare_digest(echo.encode(), sent.encode())):
            return (
                "answers another instruction: its reply token is not that of the message sent "
                "to this client in this round (a reply of an earlier round, or another client's)"
            )
        return None

    def _unpack(self, msg: Message, pid: int) -> Checked:
        # The echo has been checked: no strategy sees it.
        content = RecordDict({k: v for k, v in msg.content.items() if k != ECHO})
        metrics = dict(content[METRICS])
        claim = int(metrics[NUM_EXAMPLES])
        return Checked(
            node_id=msg.metadata.src_node_id,
            partition_id=pid,
            num_examples=claim if self.client_sizes is None else int(self.client_sizes[pid]),
            arrays={k: to_numpy(record) for k, record in content.array_records.items()},
            metrics=metrics,
            content=content,
        )

    def _arrays_problem(
        self,
        checked: Checked,
        spec: ReplySpec,
        templates: Templates | Callable[[int], Templates],
        labels: Callable[[int, str], tuple[str, str]] | None,
    ) -> str | None:
        pid = checked.partition_id
        refs = templates(pid) if callable(templates) else templates
        for key, arrays in checked.arrays.items():
            ref = refs.get(key)
            if ref is None:  # declared, but the strategy gave no template: refuse, never guess
                return f"ArrayRecord {key!r} has no server template to check it against"
            if labels is not None:
                what, of = labels(pid, key)
            else:
                what = "arrays" if key == spec.arrays[0] else f"ArrayRecord {key!r}"
                of = "the global model" if key == spec.arrays[0] else "the server's"
            problem = check_arrays(arrays, ref, what, of)
            if problem is not None:
                return problem
        return None


def _nonfinite(msg: Message) -> bool:
    """Whether a refused reply holds a non-finite metric (a NaN training loss) or non-finite
    floating arrays: what honest training from a diverged model sends."""
    try:
        if msg.has_error():
            return False
        content = msg.content
        for record in content.metric_records.values():
            for value in record.values():
                if isinstance(value, float) and not np.isfinite(value):
                    return True
        for record in content.array_records.values():
            for value in to_numpy(record).values():
                if value.dtype.kind == "f" and not np.isfinite(value).all():
                    return True
    except Exception:  # noqa: BLE001 - an unreadable reply is the client's fault
        return False
    return False
