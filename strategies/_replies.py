"""The receiving side: each reply checked, unpacked and folded in as it arrives.

:class:`ReplyIntake` is the part of :class:`strategies.base.Strategy` that takes a round's
replies. Every reply goes through the round's intake (:class:`fedgo_flwr.protocol.RoundIntake`)
before any strategy code sees it: checked against the client algorithm's declared reply
(:meth:`~ReplyIntake.reply_spec`) and the server's templates of its array records
(:meth:`~ReplyIntake.reply_templates`), a model update bounded against the model the client was
sent (:meth:`~ReplyIntake.sent_arrays`, ``strategy.aggregation.update_bound``), then unpacked
into a :class:`Reply`. :meth:`~ReplyIntake.collect` is the one loop over a round's replies: each
into ``absorb`` as it arrives and its arrays let go, so the server's memory does not grow with
the number of clients; ``absorb`` may still drop a reply by raising :class:`ReplyRejected`.
:func:`client_metrics` makes the round's client figures out of the accepted replies.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import Message, RecordDict
from flwr.supercore import log

from fedgo_flwr.learning.aggregation import update_problem, upload_norm
from fedgo_flwr.protocol import TRAIN, ReplySpec, RoundIntake, declaration
from fedgo_flwr.runtime import messages as msgs


class ReplyRejected(Exception):
    """Raised by :meth:`strategies.base.Strategy.absorb` to drop a reply; only before absorb
    changed anything."""


@dataclass
class Reply:
    """An accepted client reply, unpacked."""

    node_id: int
    partition_id: int
    num_examples: int  # n_k: the server's count of the partition (the claim, without resources)
    arrays: dict[str, np.ndarray]
    metrics: dict[str, Any]
    content: RecordDict


class ReplyIntake:
    """Reply intake of :class:`strategies.base.Strategy` (a mixin): the round's
    :class:`~fedgo_flwr.protocol.RoundIntake` (``intake``) and the partitions sent work
    (``sampled``)."""

    def open_round(self, pids: Iterable[int]) -> None:
        """Send work to partitions ``pids`` this round: only their replies are taken, once
        each (:class:`fedgo_flwr.protocol.RoundIntake`)."""
        self.sampled = list(pids)
        self.intake = RoundIntake(
            self.node_ids, self.sampled, self.client_sizes, tokens=self.reply_tokens
        )
        self._sent_norms: dict[int, tuple[Mapping[str, np.ndarray], Any]] = {}  # sent_norm's

    def reply_spec(self) -> ReplySpec:
        """What a ``train`` reply must hold: the client algorithm's declaration
        (:func:`fedgo_flwr.protocol.declaration`)."""
        return declaration(self.client_algorithm).reply(TRAIN)

    def reply_templates(self, pid: int) -> dict[str, Mapping[str, np.ndarray]]:
        """Per ArrayRecord of client ``pid``'s reply, what it must match in keys, shapes and
        dtypes: the model (:meth:`reference_arrays`); subclasses add their records'."""
        return {msgs.ARRAYS: self.reference_arrays(pid)}

    def check_reply(self, content: RecordDict) -> str | None:
        """Extra checks of a subclass, after the intake's; return why the reply is unusable,
        or ``None``."""
        return None

    def accept(self, msg: Message) -> Reply | None:
        """The reply checked by the round's intake, unpacked; ``None`` (logged) if unusable.

        Whatever a client sent, this returns (:meth:`RoundIntake.take`).
        """
        checked = self.intake.take(
            msg,
            self.reply_spec(),
            self.reply_templates,
            lambda c: self.check_reply(c.content),
            self._record_labels if self.heterogeneous else None,
        )
        if checked is None:
            return None
        reply = Reply(
            node_id=checked.node_id,
            partition_id=checked.partition_id,
            num_examples=checked.num_examples,
            arrays=checked.arrays[msgs.ARRAYS],
            metrics=checked.metrics,
            content=checked.content,
        )
        sent = self.sent_arrays(reply.partition_id)
        bound = self.aggregation.update_bound
        if sent is not None and bound is not None:
            problem = update_problem(reply.arrays, sent, bound, self.sent_norm(sent))
            if problem is not None:
                self.drop(reply, problem, model_fault=True)
                return None
        return reply

    def sent_arrays(self, pid: int) -> Mapping[str, np.ndarray] | None:
        """The model client ``pid`` was sent this round, against which its reply's update is
        bounded (``strategy.aggregation.update_bound``, :func:`update_problem`): the global
        model; ``None`` (not checked) for a client of another architecture."""
        if self.heterogeneous and self.client_arch(pid) != self.cfg.model.name:
            return None
        return self.global_arrays or None

    def sent_norm(self, sent: Mapping[str, np.ndarray]) -> Any:
        """``||sent||`` (:func:`upload_norm`), once per model sent this round: every client
        of a round (of a cohort, in CPFL) is bounded against the same one."""
        hit = self._sent_norms.get(id(sent))
        if hit is None or hit[0] is not sent:
            hit = self._sent_norms[id(sent)] = (sent, upload_norm(sent))
        return hit[1]

    def _record_labels(self, pid: int, key: str) -> tuple[str, str]:
        """How a refused record of client ``pid`` is named with ``model.client_models``."""
        if key == msgs.ARRAYS:
            return f"arrays (its model '{self.client_arch(pid)}')", "that model"
        return f"ArrayRecord {key!r}", "the server's"

    def drop(self, reply: Reply, reason: str, model_fault: bool = False) -> None:
        """Drop an accepted ``reply`` after all (:class:`ReplyRejected` from :meth:`absorb`);
        ``model_fault``: the reason points at the model sent (an update beyond
        ``update_bound``: :attr:`RoundIntake.model_faults`)."""
        self.intake.accepted.discard(reply.partition_id)
        self.intake.reject(reply.partition_id, reply.node_id, reason, model_fault)

    def collect(self, server_round: int, replies: Iterable[Message]) -> tuple[list[Reply], float]:
        """The one loop over a round's replies: each, as it arrives, through the intake
        (:meth:`accept`) and into :meth:`absorb`, its arrays let go afterwards; returns the
        accepted replies sorted by partition id (arrival order must not matter) and the
        seconds spent in :meth:`absorb`."""
        accepted: list[Reply] = []
        t_absorb = 0.0
        for msg in replies:  # as they arrive; one reply's arrays in memory at a time
            reply = self.accept(msg)
            del msg
            if reply is None:
                continue
            t0 = time.perf_counter()
            try:
                self.absorb(server_round, reply)
            except ReplyRejected as exc:  # absorb found it unusable before changing anything
                self.drop(reply, str(exc))
                continue
            finally:
                t_absorb += time.perf_counter() - t0
            reply.arrays, reply.content = {}, RecordDict()  # let the model go
            accepted.append(reply)
        accepted.sort(key=lambda r: r.partition_id)
        self.warn_silent(server_round)
        return accepted, t_absorb

    def warn_silent(self, server_round: int) -> None:
        """One WARNING per partition of the round that no reply answered for."""
        for pid in self.intake.silent:
            if pid not in self.node_ids:
                log(
                    WARNING,
                    "Round %d: client %d has no node (refused at node discovery); left out",
                    server_round,
                    pid,
                )
                continue
            log(
                WARNING,
                "Round %d: client %d (node %d) sent no reply within round_timeout (%.0fs)",
                server_round,
                pid,
                self.node_ids[pid],
                self.cfg.round_timeout,
            )


def client_metrics(replies: list[Reply], extra: Iterable[str] = ()) -> dict[str, float]:
    """Example-weighted train loss; slowest and total client training time; the total time of
    the clients' train handlers, set-up included (when the replies say it); the
    example-weighted mean of each ``extra`` metric over the replies that have it."""
    n = np.array([r.num_examples for r in replies], dtype=np.float64)
    loss = np.array([float(r.metrics.get("train_loss", np.nan)) for r in replies])
    times = [float(r.metrics.get("train_time", 0.0)) for r in replies]
    out = {
        "train_loss": float((n * loss).sum() / n.sum()),
        "client_time_max": max(times),
        "client_time_sum": float(sum(times)),
    }
    handlers = [float(r.metrics["handler_time"]) for r in replies if "handler_time" in r.metrics]
    if handlers:
        out["client_handler_time_sum"] = float(sum(handlers))
    for key in extra:
        have = [(r.num_examples, float(r.metrics[key])) for r in replies if key in r.metrics]
        if have:
            w = np.array([h[0] for h in have], dtype=np.float64)
            out[key] = float((w * np.array([h[1] for h in have])).sum() / w.sum())
    return out
