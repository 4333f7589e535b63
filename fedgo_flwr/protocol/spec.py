"""What a reply must hold: declared scalars and array records, checked by the intake.

A client algorithm declares, per message type it answers, a :class:`ReplySpec`: which
``ArrayRecord`` s the reply carries (their keys, shapes and dtypes come from the server's own
templates at intake time: the model it sent, the generator it sent, the prototypes' shape)
and which metrics, each a :class:`Scalar` with its kind and bounds. Nothing else may be in the
reply: an unknown record or metric key is refused, so a strategy never reads a value nobody
declared. Every reply may also carry the protocol's own ConfigRecord ``"echo"`` (the reply
token of the message it answers, :data:`fedgo_flwr.runtime.messages.ECHO`), which the intake
checks before these records and removes before a strategy sees the reply.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fedgo_flwr.runtime.messages import (
    ARRAYS,
    ECHO,
    METRICS,
    NUM_EXAMPLES,
    NUM_PARTITIONS,
    PARTITION_ID,
)

__all__ = ["COMMON_METRICS", "TRAIN_METRICS", "ReplySpec", "Scalar", "is_number"]


def is_number(value: Any) -> bool:
    """A real scalar as a MetricRecord holds it (``int`` or ``float``; not ``bool``, a list or
    a string)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Scalar:
    """One declared metric: a finite number (``whole``: an integer value) in ``[lo, hi]``."""

    lo: float | None = None
    hi: float | None = None
    whole: bool = False
    required: bool = False

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not what this declares (``None``: it is)."""
        if not is_number(value):
            return f"{value!r} is not a number"
        if not math.isfinite(value):
            return f"{value!r} is not finite"
        if self.whole and not float(value).is_integer():
            return f"{value!r} is not a whole number"
        if self.lo is not None and value < self.lo:
            return f"{value!r} is below {self.lo:g}"
        if self.hi is not None and value > self.hi:
            return f"{value!r} is above {self.hi:g}"
        return None


NONNEGATIVE = Scalar(lo=0.0)
COUNT = Scalar(lo=0.0, hi=2.0**53, whole=True)

COMMON_METRICS: Mapping[str, Scalar] = {
    # n_k: the intake holds it to the server's own count of the partition where it has one.
    NUM_EXAMPLES: Scalar(lo=1.0, hi=2.0**53, whole=True, required=True),
    PARTITION_ID: Scalar(lo=0.0, hi=2.0**31, whole=True),
    NUM_PARTITIONS: Scalar(lo=1.0, hi=2.0**31, whole=True),
}
"""What every reply's ``metrics`` may hold."""

TRAIN_METRICS: Mapping[str, Scalar] = {
    **COMMON_METRICS,
    "train_loss": Scalar(),
    "train_steps": COUNT,
    "train_time": NONNEGATIVE,
    "handler_time": NONNEGATIVE,
}
"""What every ``train`` reply's ``metrics`` may hold (``fedgo_app.client_app.train``)."""


@dataclass(frozen=True)
class ReplySpec:
    """The records of one message type's reply.

    ``arrays``: the ArrayRecords every reply carries; ``optional_arrays``: those it may carry.
    ``metrics``: the declared metrics (exact keys); ``metric_prefixes``: families of keys
    (``disc_`` for the discriminator's training statistics). A reply with any other record or
    metric key is refused.
    """

    arrays: tuple[str, ...] = (ARRAYS,)
    optional_arrays: tuple[str, ...] = ()
    metrics: Mapping[str, Scalar] = field(default_factory=lambda: dict(TRAIN_METRICS))
    metric_prefixes: Mapping[str, Scalar] = field(default_factory=dict)

    def with_metrics(self, **extra: Scalar) -> ReplySpec:
        """This spec with more declared metrics."""
        return ReplySpec(
            self.arrays,
            self.optional_arrays,
            {**self.metrics, **extra},
            dict(self.metric_prefixes),
        )

    def with_arrays(self, *required: str, optional: tuple[str, ...] = ()) -> ReplySpec:
        """This spec with more ArrayRecords (``required`` always, ``optional`` maybe)."""
        return ReplySpec(
            (*self.arrays, *required),
            (*self.optional_arrays, *optional),
            dict(self.metrics),
            dict(self.metric_prefixes),
        )

    def scalar(self, key: str) -> Scalar | None:
        """The declaration of metric ``key`` (``None``: undeclared)."""
        if key in self.metrics:
            return self.metrics[key]
        for prefix, scalar in self.metric_prefixes.items():
            if key.startswith(prefix):
                return scalar
        return None

    def records_problem(self, array_records: Any, metric_records: Any, other: Any) -> str | None:
        """Why the reply's set of records differs from this spec's (``None``: it does not).
        ``other`` (the ConfigRecords) may hold the protocol's :data:`ECHO`, whatever the spec."""
        missing = [k for k in self.arrays if k not in array_records]
        if missing:
            return f"no ArrayRecord {missing[0]!r}"
        allowed = set(self.arrays) | set(self.optional_arrays)
        unknown = sorted(str(k) for k in array_records if k not in allowed)
        if unknown:
            return f"undeclared ArrayRecord {unknown[0]!r}"
        if METRICS not in metric_records:
            return f"no MetricRecord {METRICS!r}"
        extra = sorted(str(k) for k in metric_records if k != METRICS)
        extra += sorted(str(k) for k in other if k != ECHO)
        if extra:
            return f"undeclared record {extra[0]!r}"
        return None

    def metrics_problem(self, metrics: Mapping[str, Any]) -> str | None:
        """Why the reply's metrics differ from this spec's (``None``: they do not)."""
        for key, scalar in self.metrics.items():
            if scalar.required and key not in metrics:
                return f"no metric {key!r}"
        for key, value in metrics.items():
            scalar = self.scalar(key)
            if scalar is None:
                return f"undeclared metric {key!r}"
            problem = scalar.problem(value)
            if problem is not None:
                return f"metric {key!r}: {problem}"
        return None
