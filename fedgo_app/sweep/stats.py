"""The statistics of a sweep: mean, sample sd, a t confidence interval, a paired t-test.

One place for them, used by ``python -m fedgo_app.sweep`` and by the benchmark drivers
(``benchmarks/sweep.py``), so that every table computes them one way:

- :func:`summarize`: over the finite values (NaN and ``None`` are counted as ``n_nan`` and left
  out), the mean, the sample sd (n - 1) and the 95% interval ``mean ± t(0.975, n-1) sd/sqrt(n)``
  (Student's t: with 3-5 seeds the normal 1.96 would be far too narrow). One value has a mean
  and nothing else; no value, nothing.
- :func:`paired`: per seed that both variants finished with a finite value, the difference
  ``variant - baseline``, and :func:`summarize` of those differences with the two-sided paired
  t-test's p-value (the same as ``scipy.stats.ttest_rel``). Fewer than 2 pairs: no interval, no
  test; differences that are all equal (sd 0): the interval is that one value and there is no
  test.

Only the standard library and Student's t from ``scipy.special`` (``stdtrit``, ``stdtr``: the
functions behind ``scipy.stats.t``), imported when first needed: importing this module imports
neither torch nor SciPy.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

LEVEL = 0.95
"""The confidence level of every interval."""


def finite(value: object) -> bool:
    """Whether ``value`` is a finite number (``None``, NaN, infinities and non-numbers: no)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Summary:
    """``n`` finite values: ``mean``, sample ``sd`` (``None`` below 2), the ``LEVEL`` interval
    ``ci_low``..``ci_high`` (``None`` below 2), and ``n_nan`` values left out as not finite."""

    n: int
    mean: float | None
    sd: float | None
    ci_low: float | None
    ci_high: float | None
    n_nan: int = 0

    @property
    def half_width(self) -> float | None:
        return None if self.ci_low is None else (self.ci_high - self.ci_low) / 2

    def to_dict(self) -> dict:
        return asdict(self)


def t_quantile(n: int, level: float = LEVEL) -> float:
    """The two-sided ``level`` quantile of Student's t with ``n - 1`` degrees of freedom."""
    from scipy.special import stdtrit

    return float(stdtrit(n - 1, 0.5 + level / 2))


def summarize(values: Iterable[float | None], level: float = LEVEL) -> Summary:
    """Mean, sample sd and ``level`` t interval of the finite ``values`` (see the module)."""
    values = list(values)
    kept = [float(v) for v in values if finite(v)]
    n, n_nan = len(kept), len(values) - len(kept)
    if n == 0:
        return Summary(0, None, None, None, None, n_nan)
    mean = math.fsum(kept) / n
    if n == 1:
        return Summary(1, mean, None, None, None, n_nan)
    sd = statistics.stdev(kept)
    half = t_quantile(n, level) * sd / math.sqrt(n)
    return Summary(n, mean, sd, mean - half, mean + half, n_nan)


@dataclass(frozen=True)
class Paired:
    """``variant - baseline`` on the ``seeds`` both finished with a finite value: the per-seed
    ``diffs``, their :class:`Summary` ``diff`` and the two-sided paired t-test (``t``,
    ``p_value``; ``None`` with fewer than 2 pairs or differences that are all equal)."""

    seeds: list
    diffs: list[float]
    diff: Summary
    t: float | None
    p_value: float | None

    def to_dict(self) -> dict:
        return {
            "seeds": list(self.seeds),
            "diffs": list(self.diffs),
            **{f"diff_{k}": v for k, v in self.diff.to_dict().items()},
            "t": self.t,
            "p_value": self.p_value,
            "test": "paired t-test, two-sided",
        }


def paired(
    baseline: Mapping[object, float | None],
    variant: Mapping[object, float | None],
    level: float = LEVEL,
) -> Paired:
    """The paired comparison of ``variant`` against ``baseline`` (per-seed values, keyed by
    seed), on the seeds both have a finite value for, in ``baseline``'s order."""
    seeds = [s for s in baseline if s in variant and finite(baseline[s]) and finite(variant[s])]
    diffs = [float(variant[s]) - float(baseline[s]) for s in seeds]
    diff = summarize(diffs, level)
    t_stat = p_value = None
    if diff.n >= 2 and diff.sd > 0:
        t_stat = diff.mean / (diff.sd / math.sqrt(diff.n))
        from scipy.special import stdtr

        p_value = float(2 * stdtr(diff.n - 1, -abs(t_stat)))
    elif diff.n >= 2:  # every difference the same: the interval is that value, no test
        diff = Summary(diff.n, diff.mean, 0.0, diff.mean, diff.mean, diff.n_nan)
    return Paired(seeds, diffs, diff, t_stat, p_value)


@dataclass(frozen=True)
class RatioSummary:
    """Per-seed ratios summarised on the log scale: the geometric mean ``gmean`` and the
    ``LEVEL`` interval ``ci_low``..``ci_high`` of the mean log-ratio, mapped back with ``exp``
    (``None`` below 2 ratios). ``ratios`` are the finite, positive per-seed ratios kept;
    ``n_left_out`` counts the others (``None``, NaN, zero or negative)."""

    ratios: list[float]
    gmean: float | None
    ci_low: float | None
    ci_high: float | None
    n_left_out: int = 0

    @property
    def n(self) -> int:
        return len(self.ratios)

    def holds_one(self) -> bool:
        """Whether the interval contains 1 (no detectable difference); ``True`` without one."""
        return self.ci_low is None or self.ci_low <= 1.0 <= self.ci_high

    def to_dict(self) -> dict:
        return {**asdict(self), "n": self.n, "scale": "log (geometric mean)"}


def ratio_summary(ratios: Iterable[float | None], level: float = LEVEL) -> RatioSummary:
    """The geometric mean of per-seed ``ratios`` and its ``level`` interval: a t interval of the
    mean of ``log(ratio)`` (:func:`summarize`), exponentiated.

    Ratios (speed-ups, cost ratios) are averaged on the log scale because a ratio and its
    inverse must average to ratios that are inverses of each other: the arithmetic mean of
    2.35, 0.58 and 1.20 is 1.38, the geometric mean 1.18, and 1/x gives 0.85 = 1/1.18 only on
    the log scale. An interval that holds 1 supports neither "faster" nor "slower"."""
    values = list(ratios)
    kept = [float(r) for r in values if finite(r) and float(r) > 0]
    s = summarize([math.log(r) for r in kept], level)
    if s.n == 0:
        return RatioSummary([], None, None, None, len(values))
    low = None if s.ci_low is None else math.exp(s.ci_low)
    high = None if s.ci_high is None else math.exp(s.ci_high)
    return RatioSummary(kept, math.exp(s.mean), low, high, len(values) - len(kept))
