"""Robust aggregation: how accepted replies become the next global model, and the round's metrics.

The default is FedAvg's n_k-weighted average (McMahan et al., AISTATS 2017, Alg. 1), folded in
one reply at a time. Under ``strategy.aggregation``
(:class:`fedgo_flwr.learning.aggregation.AggregationConfig`) it is the coordinate-wise median or
trimmed mean instead, and each client's update may be clipped to ``clip_norm`` against the round's
global model. :class:`RobustAveraging` applies it in :meth:`~RobustAveraging.begin_round` /
:meth:`~RobustAveraging.absorb` / :meth:`~RobustAveraging.averaged`, so FedAvg, FedProx and
FedDF/FedGO's average initialisation get it as they are (SCAFFOLD applies it to its model
update). :meth:`~RobustAveraging.aggregate_train` runs a round's intake and aggregation and
records the round's metrics (``last_round``, read by the run recorder).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from logging import WARNING

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.supercore import log

from fedgo_flwr.learning.aggregation import clip_update
from fedgo_flwr.learning.clipping import ClippedMean, round_average
from fedgo_flwr.runtime.messages import to_record
from strategies._replies import Reply, client_metrics


class RobustAveraging:
    """Aggregation of :class:`strategies.base.Strategy` (a mixin): a running average under
    ``strategy.aggregation`` (``running``) and the count of clipped replies."""

    def begin_round(self, server_round: int) -> None:
        """Reset what :meth:`absorb` accumulates: the round's average, each update clipped
        relative to the round (``clip_factor``, :class:`~fedgo_flwr.learning.clipping.
        ClippedMean`) against the model the clients were sent."""
        self.running = round_average(self.aggregation, self.global_arrays, f"Round {server_round}")
        self.clipped_replies = 0

    def robust(self, reply: Reply) -> dict[str, np.ndarray]:
        """``reply``'s arrays with its update clipped to ``strategy.aggregation.clip_norm``
        against this round's global model (unchanged when there is no bound)."""
        bound = self.aggregation.clip_norm
        if bound is None:
            return reply.arrays
        arrays, clipped = clip_update(reply.arrays, self.global_arrays, bound)
        self.clipped_replies += clipped
        return arrays

    def absorb(self, server_round: int, reply: Reply) -> None:
        """Fold one accepted reply in; its arrays are dropped afterwards (kept by the median
        and trimmed mean, which need all of a round's replies at once)."""
        self.running.add(self.robust(reply), reply.num_examples, reply.partition_id)

    def averaged(self) -> dict[str, np.ndarray]:
        """The round's average under ``strategy.aggregation`` of what :meth:`absorb` took:
        the n_k-weighted mean by default (each update clipped relative to the round), else the
        unweighted median or trimmed mean; with ``clip_norm`` the round records
        ``clients_clipped``, with the relative clip :meth:`record_update_norms`'s figures."""
        if self.aggregation.clip_norm is not None:
            self.last_round["clients_clipped"] = self.clipped_replies
        out = self.running.result()
        self.record_update_norms(self.running)
        return out

    def record_update_norms(self, average: object) -> None:
        """What a :class:`~fedgo_flwr.learning.clipping.ClippedMean` saw, into the round's
        metrics: ``update_ratio_max`` (the largest update norm over the round's lower median),
        ``update_ratio_client`` (whose it is: the client to look at when a round's model turns
        out bad) and ``clients_clipped_relative`` (how many updates ``clip_factor`` clipped)."""
        if not isinstance(average, ClippedMean) or not average.norms:
            return
        ratio, client = average.ratio_max()
        self.last_round["update_ratio_max"] = float(ratio)
        self.last_round["update_ratio_client"] = (
            int(client) if isinstance(client, (int, np.integer)) else -1
        )
        self.last_round["clients_clipped_relative"] = len(average.clipped)

    def aggregate(self, server_round: int, replies: list[Reply]) -> dict[str, np.ndarray]:
        """The average of the client models (``replies`` hold metadata only, sorted by
        partition id; the arrays went through :meth:`absorb`)."""
        return self.averaged()

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        self.begin_round(server_round)
        accepted, t_absorb = self.collect(server_round, replies)
        self.last_round = {
            "clients_sampled": len(self.sampled),
            "clients_replied": len(accepted),
            "clients_failed": self.intake.failed,
        }
        if len(accepted) < self.cfg.min_clients:
            log(
                WARNING,
                "Round %d: %d usable replies < min_clients %d; the global model is kept",
                server_round,
                len(accepted),
                self.cfg.min_clients,
            )
            return None, MetricRecord(self.last_round)
        t0 = time.perf_counter()
        arrays = self.aggregate(server_round, accepted)
        self.last_round["aggregate_time"] = time.perf_counter() - t0 + t_absorb
        self.last_round.update(client_metrics(accepted, self.reply_metrics))
        return to_record(arrays), MetricRecord(self.last_round)
