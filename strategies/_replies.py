"""The receiving side: each reply checked, unpacked and folded in as it arrives.

:class:`ReplyIntake`, owned by a strategy as ``self.intake``, takes a round's replies. Every
reply goes through the round's :class:`fedgo_flwr.protocol.RoundIntake` (``intake.round``)
before any strategy code sees it: checked against the client algorithm's declared reply and the
server's templates of its array records, a model update bounded against the model the client
was sent (``strategy.aggregation.update_bound``), then unpacked into a :class:`Reply`
(:meth:`~ReplyIntake.accept`; the strategy hands it these as call arguments).
:meth:`~ReplyIntake.collect` is the one loop over a round's replies: each into the strategy's
``absorb`` as it arrives and its arrays let go, so the server's memory does not grow with the
number of clients; ``absorb`` may still drop a reply by raising :class:`ReplyRejected`.
:func:`client_metrics` makes the round's client figures out of the accepted replies.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import Message, RecordDict
from flwr.supercore import log

from fedgo_flwr.learning.aggregation import update_problem, upload_norm
from fedgo_flwr.protocol import ReplySpec, RoundIntake
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
    """A strategy's reply intake: the round's :class:`~fedgo_flwr.protocol.RoundIntake`
    (``round``, opened by :meth:`open`) and the norms of the models sent this round.

    ``node_ids``: partition id -> node id; ``client_sizes``: n_k of every partition as the
    server counts it (``None``: trust the claim); ``tokens``: partition id -> the reply token
    of its latest message (shared with the sending side, which writes it);
    ``round_timeout``: named in the WARNING about a client that did not reply."""

    def __init__(
        self,
        node_ids: Mapping[int, int],
        client_sizes: Any,
        tokens: Mapping[int, str],
        round_timeout: float,
    ) -> None:
        self.node_ids = node_ids
        self.client_sizes = client_sizes
        self.tokens = tokens
        self.round_timeout = round_timeout
        self.round = RoundIntake(node_ids, (), tokens=tokens)
        self._sent_norms: dict[int, tuple[Mapping[str, np.ndarray], Any]] = {}

    def open(self, pids: Iterable[int]) -> None:
        """A round sent work to partitions ``pids``: only their replies are taken, once each
        (:class:`fedgo_flwr.protocol.RoundIntake`)."""
        self.round = RoundIntake(self.node_ids, list(pids), self.client_sizes, tokens=self.tokens)
        self._sent_norms = {}

    def accept(
        self,
        msg: Message,
        spec: ReplySpec,
        templates: Callable[[int], dict[str, Mapping[str, np.ndarray]]],
        check: Callable[[RecordDict], str | None],
        labels: Callable[[int, str], tuple[str, str]] | None,
        sent: Callable[[int], Mapping[str, np.ndarray] | None],
        update_bound: float | None,
    ) -> Reply | None:
        """``msg`` checked by the round's intake, unpacked; ``None`` (logged) if unusable.

        ``spec``: what the reply must hold; ``templates(pid)``: per ArrayRecord, what it must
        match; ``check(content)``: the strategy's own checks (why unusable, or ``None``);
        ``labels``: how a refused record is named (``model.client_models``); ``sent(pid)``:
        the model client ``pid`` was sent, against which its update is bounded by
        ``update_bound`` (``None``: not bounded). Whatever a client sent, this returns
        (:meth:`RoundIntake.take`)."""
        checked = self.round.take(msg, spec, templates, lambda c: check(c.content), labels)
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
        reference = sent(reply.partition_id)
        if reference is not None and update_bound is not None:
            problem = update_problem(
                reply.arrays, reference, update_bound, self.sent_norm(reference)
            )
            if problem is not None:
                self.drop(reply, problem, model_fault=True)
                return None
        return reply

    def sent_norm(self, sent: Mapping[str, np.ndarray]) -> Any:
        """``||sent||`` (:func:`upload_norm`), once per model sent this round: every client
        of a round (of a cohort, in CPFL) is bounded against the same one."""
        hit = self._sent_norms.get(id(sent))
        if hit is None or hit[0] is not sent:
            hit = self._sent_norms[id(sent)] = (sent, upload_norm(sent))
        return hit[1]

    def drop(self, reply: Reply, reason: str, model_fault: bool = False) -> None:
        """Drop an accepted ``reply`` after all (:class:`ReplyRejected` from ``absorb``);
        ``model_fault``: the reason points at the model sent (an update beyond
        ``update_bound``: :attr:`RoundIntake.model_faults`)."""
        self.round.accepted.discard(reply.partition_id)
        self.round.reject(reply.partition_id, reply.node_id, reason, model_fault)

    def collect(
        self,
        server_round: int,
        replies: Iterable[Message],
        accept: Callable[[Message], Reply | None],
        absorb: Callable[[int, Reply], None],
    ) -> tuple[list[Reply], float]:
        """The one loop over a round's replies: each, as it arrives, through ``accept`` and
        into ``absorb``, its arrays let go afterwards; returns the accepted replies sorted by
        partition id (arrival order must not matter) and the seconds spent in ``absorb``."""
        accepted: list[Reply] = []
        t_absorb = 0.0
        for msg in replies:  # as they arrive; one reply's arrays in memory at a time
            reply = accept(msg)
            del msg
            if reply is None:
                continue
            t0 = time.perf_counter()
            try:
                absorb(server_round, reply)
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
        for pid in self.round.silent:
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
                self.round_timeout,
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
