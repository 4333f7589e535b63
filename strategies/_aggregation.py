"""Robust averaging: how accepted models become the round's average, and what it records.

The default is the consensus rule (:mod:`fedgo_flwr.learning.consensus`), which keeps the
round's models; ``rule: mean`` is FedAvg's n_k-weighted average (McMahan et al., AISTATS 2017,
Alg. 1), folded in one reply at a time; under ``strategy.aggregation``
(:class:`fedgo_flwr.learning.aggregation.AggregationConfig`) it may also be the coordinate-wise
median or trimmed mean, and each client's update may be clipped to ``clip_norm`` against the
round's global model. :class:`RobustAveraging`, owned by a strategy as ``self.averager``,
applies it: :meth:`~RobustAveraging.begin` at the start of a round's intake,
:meth:`~RobustAveraging.add` per accepted reply, :meth:`~RobustAveraging.result` once, which
also returns the round's figures of it (``clients_clipped``, ``update_ratio_*``). FedAvg,
FedProx and FedDF/FedGO's average initialisation get it as they are (SCAFFOLD applies it to its
model update).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from fedgo_flwr.learning.aggregation import AggregationConfig, clip_update
from fedgo_flwr.learning.clipping import ClippedMean, ratio_max, round_average
from fedgo_flwr.learning.consensus import ConsensusStack


class RobustAveraging:
    """A round's running average under ``config`` (``strategy.aggregation``): ``running``, the
    accumulator, and ``clipped``, how many replies ``clip_norm`` clipped this round."""

    def __init__(self, config: AggregationConfig) -> None:
        self.config = config
        self.running = round_average(config, None)
        self.clipped = 0

    def begin(self, reference: Mapping[str, np.ndarray], label: str) -> None:
        """Reset for a round whose clients were sent ``reference``: each update is clipped
        relative to the round (``clip_factor``, :class:`~fedgo_flwr.learning.clipping.
        ClippedMean`) against it; ``label`` names the round in its log lines."""
        self.running = round_average(self.config, reference, label)
        self.clipped = 0

    def robust(
        self, arrays: dict[str, np.ndarray], against: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """``arrays`` with its update clipped to ``clip_norm`` against ``against`` (the model
        the client was sent); unchanged when there is no bound."""
        bound = self.config.clip_norm
        if bound is None:
            return arrays
        out, clipped = clip_update(arrays, against, bound)
        self.clipped += clipped
        return out

    def add(
        self,
        arrays: dict[str, np.ndarray],
        weight: float,
        pid: int,
        against: Mapping[str, np.ndarray],
    ) -> None:
        """Fold in client ``pid``'s model ``arrays`` with n_k ``weight``, clipped
        (:meth:`robust`) against ``against``."""
        self.running.add(self.robust(arrays, against), weight, pid)

    @property
    def count(self) -> int:
        """How many models were folded in this round."""
        return self.running.count

    def result(self) -> tuple[dict[str, np.ndarray], dict[str, float | int]]:
        """The round's average of what :meth:`add` took (by default the consensus rule; the
        n_k-weighted mean with each update clipped relative to the round under ``rule: mean``;
        else the unweighted median or trimmed mean) and its figures: ``clients_clipped`` with
        ``clip_norm``, then :func:`update_norms`'."""
        metrics: dict[str, float | int] = {}
        if self.config.clip_norm is not None:
            metrics["clients_clipped"] = self.clipped
        out = self.running.result()
        metrics.update(update_norms(self.running))
        return out, metrics


def update_norms(average: object) -> dict[str, float | int]:
    """What a :class:`~fedgo_flwr.learning.clipping.ClippedMean` or a
    :class:`~fedgo_flwr.learning.consensus.ConsensusStack` saw, for the round's metrics:
    ``update_ratio_max`` (the largest update norm over the round's lower median),
    ``update_ratio_client`` (whose it is: the client to look at when a round's model turns out
    bad) and ``clients_clipped_relative`` (how many updates ``clip_factor`` clipped; with the
    consensus rule, how many had an array clipped to ``consensus_clip``); with the consensus
    rule also ``consensus_trust_min`` (the lowest trust score), ``consensus_trust_client``
    (whose) and ``consensus_distrusted`` (how many scored below 1); nothing for another
    accumulator."""
    if not isinstance(average, (ClippedMean, ConsensusStack)) or not average.norms:
        return {}
    ratio, client = ratio_max(average.norms)
    figures: dict[str, float | int] = {
        "update_ratio_max": float(ratio),
        "update_ratio_client": _client_id(client),
        "clients_clipped_relative": len(average.clipped),
    }
    if isinstance(average, ConsensusStack):
        least, trust = min(average.trust.items(), key=lambda kv: (kv[1], str(kv[0])))
        figures.update(
            consensus_trust_min=float(trust),
            consensus_trust_client=_client_id(least),
            consensus_distrusted=sum(1 for t in average.trust.values() if t < 1),
        )
    return figures


def _client_id(client: object) -> int:
    return int(client) if isinstance(client, (int, np.integer)) else -1
