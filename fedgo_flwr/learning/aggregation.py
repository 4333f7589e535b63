"""Parameter aggregation and client-reply checks (NumPy/PyTorch, no Flower types).

Arrays are plain ``dict[str, np.ndarray]`` here; strategies convert from and to Flower's
``ArrayRecord`` at their edge. Averages accumulate in extended precision and are cast back to
each array's own dtype (integer buffers such as BatchNorm's ``num_batches_tracked`` are rounded).

The default rule of every parameter-averaging strategy is the consensus rule
(:mod:`fedgo_flwr.learning.consensus`: FLTrust's trust-weighted combination with the round's
median update as reference). Besides it and FedAvg's n_k-weighted mean (:class:`RunningAverage`,
``rule: mean``) there are robust rules (``strategy.aggregation``,
:class:`AggregationConfig`): the coordinate-wise median and trimmed mean of the round's client
models (:func:`coordinate_median`, :func:`trimmed_mean`; Yin et al., "Byzantine-Robust
Distributed Learning: Towards Optimal Statistical Rates", ICML 2018, Sec. 3-4) and the clipping
of each client's update to a norm bound before any rule (:func:`clip_update`; Sun et al., "Can
You Really Backdoor Federated Learning?", 2019, Sec. 4 "norm thresholding"). Before any of
them, a client model whose update is many times longer than the model it was sent is dropped
(``update_bound``, on by default: :func:`update_problem`): no training gives it, and the
streaming mean would take it at full weight.

The uploads other than the classifier that a server averages or otherwise combines (FedGAN's
generator and critic, DaFKD's generator and discriminator heads, FedTGP's prototypes,
SCAFFOLD's control deltas) have no absolute scale a user could give a ``clip_norm`` for, so
they get a bound relative to the round itself (``upload_bound``, on by default): an upload
whose L2 norm -- of its update against what the server sent, where the server sent one --
exceeds ``upload_bound`` times the round's (lower) median of those norms is scaled down to
that norm (:func:`bound_uploads`, :class:`BoundedAverage`), and a WARNING names the client.
Scaled, not dropped (why: ``docs/architecture.md``, "Aggregation"). The same factor bounds each
teacher's logit scale (:func:`fedgo_flwr.learning.distill.teacher_scale_outliers`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedgo_flwr.config.schema import Checker
from fedgo_flwr.learning.consensus import ConsensusStack
from fedgo_flwr.learning.numerics import KeptReplies, lower_median
from fedgo_flwr.learning.numerics import cast_like as _cast_like

Arrays = Mapping[str, np.ndarray]

log = logging.getLogger(__name__)

run_log = logging.getLogger("flwr")
"""The run's log (Flower's logger, which the ServerApp prints): the warnings that name a client
go there, beside the reply checks'."""

AGGREGATION_RULES: tuple[str, ...] = ("mean", "median", "trimmed_mean", "consensus")
"""``mean``: FedAvg's n_k-weighted mean (streams); ``median`` / ``trimmed_mean``: unweighted,
coordinate-wise over the round's client models; ``consensus``: each array of each update
clipped relative to the round and weighed by its cosine with the round's median update
(:mod:`fedgo_flwr.learning.consensus`). All but ``mean`` keep every reply of the round in
memory."""

DEFAULT_UPLOAD_BOUND = 10.0
"""``upload_bound``'s default: above the largest honest ratio of an upload's norm (or a
teacher's logit scale) to its round's median (``benchmarks/studies/trust.md``, "Honest ratios
under the reply bounds"); one client's upload moves a combination by at most 10 typical ones."""


DEFAULT_CLIP_FACTOR = 10.0
"""``clip_factor``'s default: above the largest honest ratio (``benchmarks/studies/trust.md``,
"Honest ratios under the reply bounds"), so that honest runs keep FedAvg's mean bit for bit."""

DEFAULT_CONSENSUS_CLIP = 2.0
"""``strategy.aggregation.consensus_clip``'s default: with ``rule: consensus`` each array of an
update is clipped to twice the round's lower median norm of that array's updates; chosen on the
tuning seeds against the adversary profile (``benchmarks/results/robust-rule-cost/``, "The
consensus rule")."""

DEFAULT_RADIAL_CLIP = 8.0
"""``radial_clip``'s default, chosen on the tuning seeds between 2, 4, 8 and 16
(``benchmarks/results/robust-rule-cost/``, "The radial clip")."""

DEFAULT_DISCRIMINATOR_BOUND = 25.0
"""``discriminator_bound``'s default: 2.3 times the largest honest ratio measured (DaFKD's
heads, 10.8; FedGO's discriminators 2.5: ``benchmarks/studies/trust.md``)."""

DEFAULT_TEACHER_ARRAY_BOUND = 50.0
"""``teacher_array_bound``'s default: 3.7 times the largest honest ratio measured (DaFKD, 13.4;
``benchmarks/studies/trust.md``, "Teachers left out" and "The radial clip"); the adversary
profile's attacks reach 448 and more."""

DEFAULT_CLIP_KEEP = 3
"""``clip_keep``'s default (:class:`ClippedMean`)."""


DEFAULT_UPDATE_BOUND = 50.0
"""``strategy.aggregation.update_bound``'s default (:func:`update_problem`): an update may be
up to 50 times as long as the model it started from, 38 times the largest honest ratio
measured (``benchmarks/studies/trust.md``, "Honest ratios under the reply bounds"); the tampered
uploads it is for are 1e5 times the model and more."""


@dataclass
class AggregationConfig:
    """How the round's client models become one (``strategy.aggregation.<key>`` in YAML). The
    default rule is ``consensus``, so that one client cannot own or freeze a run under the
    defaults (``benchmarks/results/robust-rule-cost/``, "The consensus rule", measures what it
    costs honest runs); ``rule: mean`` is FedAvg's aggregation bit for bit (with
    ``clip_factor`` not binding), and the paper and benchmark presets (``conf/paper``,
    ``conf/bench``) set it, as the papers do.

    The classifier's average keeps streaming one reply at a time: its bounds are
    ``update_bound``, ``clip_norm``, ``clip_factor`` and the rules. Every other upload is
    bounded by ``upload_bound`` instead (bounding the classifier so would need the round's
    models in memory), and takes ``rule`` and ``trim_fraction`` too where it is averaged.
    """

    rule: str = "consensus"
    """How every averaging strategy (FedAvg, FedProx, SCAFFOLD's model update, the FedDF family's
    average initialisation) combines the round's client models: ``mean`` (n_k-weighted, FedAvg),
    ``median`` or ``trimmed_mean`` (coordinate-wise and unweighted unless ``weighted``, Yin et
    al., ICML 2018), ``consensus`` (FLTrust's rule with the round's median update as its
    reference: :mod:`fedgo_flwr.learning.consensus`); these keep the round's models in
    memory."""
    trim_fraction: float = 0.2
    """``trimmed_mean`` drops ``floor(trim_fraction * m)`` of the ``m`` replies at each end of every
    coordinate (Yin et al. need it above the share of bad clients); it must trim at least one of
    the clients sampled per round."""
    clip_norm: float | None = None
    """Clip each client's update ``y_k - x`` (every floating array of the model) to this L2 norm
    before the rule (Sun et al. 2019); rounds record ``clients_clipped``; ``null``: no clipping.
    SCAFFOLD's control variates are not clipped, nor the other uploads (an absolute bound in the
    classifier's units)."""
    clip_factor: float | None = DEFAULT_CLIP_FACTOR
    """Clip each client's update to this many times the round's lower median update norm before
    the mean (:mod:`fedgo_flwr.learning.clipping`; ``null``: off). Relative to the round, so it
    needs no scale from the user; honest runs stay below it (the mean is then FedAvg's bit for
    bit), and one client moves the average by at most ``clip_factor`` typical updates times its
    weight. Only with ``rule: mean`` (the median and trimmed mean need no clipping to stay
    within the honest values)."""
    clip_keep: int = DEFAULT_CLIP_KEEP
    """How many of the round's largest updates the streaming mean keeps to clip them exactly
    (more outliers raise the bound to the next largest norm, with a WARNING)."""
    consensus_clip: float | None = DEFAULT_CONSENSUS_CLIP
    """With ``rule: consensus``: each array of a client's update is clipped to this many times
    the round's lower median norm of that array's updates before it is weighed
    (:mod:`fedgo_flwr.learning.consensus`; ``null``: not clipped)."""
    radial_clip: float | None = DEFAULT_RADIAL_CLIP
    """With ``rule: consensus``: each array's update's part along that array (what scales it,
    all of a scaled model ``y = x - c x``) is clipped to this many times the round's lower
    median of those parts first (:mod:`fedgo_flwr.learning.consensus`; ``null``: not)."""
    upload_bound: float | None = DEFAULT_UPLOAD_BOUND
    """Bounds FedGAN's generator and critic (G3), DaFKD's generator and discriminator heads,
    FedTGP's prototypes (each class's; the median one vote per client), SCAFFOLD's control deltas
    and each teacher's logit scale (FedDF family: rescaled to the median; one-shot: left out). An
    upload whose L2 norm exceeds ``upload_bound`` times the round's (lower) median is scaled
    down to it, with a WARNING naming the client (:func:`bound_uploads`); ``null``: off."""
    discriminator_bound: float | None = DEFAULT_DISCRIMINATOR_BOUND
    """A discriminator (FedGO, CPFL's odds, Co-Boosting + FedGO, DaFKD's heads) whose logit scale
    exceeds this many times the round's lower median gets neutral weight, with a WARNING naming
    the client (:func:`fedgo_flwr.gan.screen_discriminators`); ``null``: off."""
    teacher_array_bound: float | None = DEFAULT_TEACHER_ARRAY_BOUND
    """FedDF's family (FedDF, FedGO, FedGKD+, DaFKD), under a rule that keeps the round's
    models (``consensus``, ``median``, ``trimmed_mean``; at least 3 replies): a client model
    with an array whose update is longer than this many times the round's lower median norm
    of that array's updates is left out of the ensemble, with a WARNING naming the client
    (:func:`fedgo_flwr.learning.clipping.array_outliers`; its model still goes into the
    average, under the rule); ``null``: off."""
    update_bound: float | None = DEFAULT_UPDATE_BOUND
    """A client model whose update ``y_k - x`` is longer than this many times the model ``x`` it
    was sent is dropped, naming the client (:func:`update_problem`; ``null``: off). It needs
    nothing but ``x``, so the mean keeps streaming; it stops a scaled or corrupted model, not a
    well-scaled bad one (that is what ``rule`` and ``clip_norm`` are for)."""
    weighted: bool = False
    """The median and trimmed mean weigh each reply by its weight (FedAvg's ``n_k``) as the mean
    does, cutting by count (:mod:`fedgo_flwr.learning.weighted_rules`); unweighted by default,
    Yin et al.'s rules, whose guarantee is in clients. It applies to the round's classifier
    models (the other uploads' rules stay unweighted)."""

    def check(self, c: Checker) -> None:
        c.choice("rule", AGGREGATION_RULES)
        c.require("trim_fraction", 0 <= self.trim_fraction < 0.5, "must be in [0, 0.5)")
        if self.clip_norm is not None:
            c.require(
                "clip_norm",
                math.isfinite(self.clip_norm) and self.clip_norm > 0,
                "must be a finite number > 0 (or null: no clipping)",
            )
        if self.clip_factor is not None:
            c.require(
                "clip_factor",
                math.isfinite(self.clip_factor) and self.clip_factor >= 1,
                "must be a finite number >= 1, a multiple of the round's median update norm "
                "(or null: no clipping)",
            )
        c.require(
            "clip_keep",
            isinstance(self.clip_keep, int)
            and not isinstance(self.clip_keep, bool)
            and 1 <= self.clip_keep <= 1000,
            "must be a whole number in [1, 1000]",
        )
        if self.consensus_clip is not None:
            c.require(
                "consensus_clip",
                math.isfinite(self.consensus_clip) and self.consensus_clip >= 1,
                "must be a finite number >= 1, a multiple of the round's median norm of each "
                "array's updates (or null: no clipping)",
            )
        if self.radial_clip is not None:
            c.require(
                "radial_clip",
                math.isfinite(self.radial_clip) and self.radial_clip >= 1,
                "must be a finite number >= 1, a multiple of the round's median radial part of "
                "each array's updates (or null: no clipping)",
            )
        if self.upload_bound is not None:
            c.require(
                "upload_bound",
                math.isfinite(self.upload_bound) and self.upload_bound >= 1,
                "must be a finite number >= 1, a multiple of the round's median upload norm "
                "(or null: no bound)",
            )
        if self.discriminator_bound is not None:
            c.require(
                "discriminator_bound",
                math.isfinite(self.discriminator_bound) and self.discriminator_bound >= 1,
                "must be a finite number >= 1, a multiple of the round's median logit scale of "
                "the discriminators (or null: no bound)",
            )
        if self.teacher_array_bound is not None:
            c.require(
                "teacher_array_bound",
                math.isfinite(self.teacher_array_bound) and self.teacher_array_bound >= 1,
                "must be a finite number >= 1, a multiple of the round's median norm of each "
                "array's updates (or null: no bound)",
            )
        if self.update_bound is not None:
            c.require(
                "update_bound",
                math.isfinite(self.update_bound) and self.update_bound > 0,
                "must be a finite number > 0, a multiple of the norm of the model the server "
                "sent (or null: no bound)",
            )

    def trimmed(self, replies: int) -> int:
        """How many of ``replies`` ``trimmed_mean`` drops at each end of a coordinate."""
        return trim_count(replies, self.trim_fraction)


class RunningAverage:
    """``sum_k w_k a_k / sum_k w_k``, accumulated one array set at a time.

    Memory is one model's worth of accumulators, whatever the number of clients, so a server
    can fold each reply in as it arrives and let it go. Sums are kept in ``np.longdouble``
    (80-bit on x86-64 Linux; float64 elsewhere), so the result, cast back to each array's dtype,
    does not depend on the order the replies arrived in except in rare last-bit cases.
    """

    def __init__(self) -> None:
        self.sums: dict[str, np.ndarray] | None = None
        self.like: dict[str, np.ndarray] = {}
        self.total = 0.0
        self.count = 0

    def add(self, arrays: Arrays, weight: float, client: Any = None) -> None:
        """Fold ``arrays`` in with ``weight`` (``client``: unused here, as by the other
        accumulators that name the client)."""
        w = float(weight)
        if not np.isfinite(w) or w < 0:
            raise ValueError(f"weight must be finite and non-negative, got {weight}")
        if self.sums is None:
            self.like = {k: np.asarray(v) for k, v in arrays.items()}
            self.sums = {k: np.zeros(np.shape(v), dtype=np.longdouble) for k, v in arrays.items()}
        elif set(arrays) != set(self.sums):
            raise ValueError("array sets have different keys")
        for key, acc in self.sums.items():
            acc += np.longdouble(w) * np.asarray(arrays[key], dtype=np.longdouble)
        self.total += w
        self.count += 1

    def result(self) -> dict[str, np.ndarray]:
        if self.sums is None:
            raise ValueError("nothing to average: no arrays")
        if self.total <= 0:
            raise ValueError("weights must not all be zero")
        total = np.longdouble(self.total)
        return {k: _cast_like(acc / total, self.like[k]) for k, acc in self.sums.items()}


class ReplyStack(KeptReplies):
    """The round's client models kept whole, for the rules that cannot stream.

    The coordinate-wise median and trimmed mean need every reply of a coordinate at once, so
    memory grows with the number of replies (``K`` models), unlike :class:`RunningAverage`.
    Weights are checked and kept (:class:`~fedgo_flwr.learning.numerics.KeptReplies`) but not
    used here: both rules are unweighted (:func:`robust_average`); the weighted rules'
    :class:`~fedgo_flwr.learning.weighted_rules.WeightedReplyStack` takes them.
    """

    def __init__(self, rule: str, trim_fraction: float = 0.0) -> None:
        if rule not in ("median", "trimmed_mean"):
            raise ValueError(f"ReplyStack takes median or trimmed_mean, not {rule!r}")
        super().__init__()
        self.rule = rule
        self.trim_fraction = trim_fraction

    def result(self) -> dict[str, np.ndarray]:
        if self.rule == "median":
            return coordinate_median(self.replies)
        m = len(self.replies)
        if m and self.trim_fraction > 0 and trim_count(m, self.trim_fraction) == 0:
            log.warning(
                "trimmed_mean trims nothing: floor(%g * %d replies) = 0; this round is the "
                "unweighted mean",
                self.trim_fraction,
                m,
            )
        return trimmed_mean(self.replies, self.trim_fraction)


def new_average(
    config: AggregationConfig, reference: Arrays | None = None
) -> RunningAverage | ReplyStack | ConsensusStack:
    """An empty accumulator for ``config.rule`` (``add(arrays, weight)``, ``result()``),
    unweighted but for ``consensus``, which takes the weights and measures each upload against
    ``reference`` (``None``: the uploads are updates already) (``config.weighted`` is for the
    round's models: :func:`fedgo_flwr.learning.clipping.round_average`)."""
    if config.rule == "mean":
        return RunningAverage()
    if config.rule == "consensus":
        return ConsensusStack(reference, config.consensus_clip, config.radial_clip)
    return ReplyStack(config.rule, config.trim_fraction)


def trim_count(replies: int, trim_fraction: float) -> int:
    """``floor(trim_fraction * replies)`` (``1e-9`` guards ``0.3 * 10 = 2.9999...``), at
    most ``(replies - 1) // 2``: the guard must not round a ``trim_fraction`` just below 0.5
    up to half of an even number of replies, which would trim every value of a coordinate
    (``floor(beta * m)`` itself never exceeds it for ``beta < 0.5``)."""
    return min(int(math.floor(trim_fraction * replies + 1e-9)), max(replies - 1, 0) // 2)


def _stacked(arrays: Sequence[Arrays]) -> dict[str, np.ndarray]:
    """``key -> (m, ...)`` float64 stacks of ``m`` array sets with equal keys and shapes."""
    if not arrays:
        raise ValueError("nothing to aggregate: no arrays")
    keys = set(arrays[0])
    for a in arrays[1:]:
        if set(a) != keys:
            raise ValueError("array sets have different keys")
    return {k: np.stack([np.asarray(a[k], dtype=np.float64) for a in arrays]) for k in arrays[0]}


def coordinate_median(arrays: Sequence[Arrays]) -> dict[str, np.ndarray]:
    """The coordinate-wise median of ``m`` array sets, unweighted (Yin et al. 2018, Alg. 1,
    option I).

    Unweighted on purpose: the median's guarantee is in clients (it stays within the honest
    values while fewer than half of the ``m`` replies are bad, whatever they send); weighting
    by n_k would let one client holding more than half of the round's data be the median
    alone. An even ``m`` takes the mean of the two middle values. Each result is cast back to
    its array's dtype (integer buffers are rounded).
    """
    return {
        k: _cast_like(np.median(stack, axis=0), np.asarray(arrays[0][k]))
        for k, stack in _stacked(arrays).items()
    }


def trimmed_mean(arrays: Sequence[Arrays], trim_fraction: float) -> dict[str, np.ndarray]:
    """The coordinate-wise ``beta``-trimmed mean of ``m`` array sets, unweighted (Yin et al.
    2018, Alg. 1, option II).

    For every coordinate the ``b = floor(beta * m)`` largest and ``b`` smallest values are
    dropped and the other ``m - 2b`` averaged with equal weights (unweighted for the reason
    :func:`coordinate_median` gives). ``beta = trim_fraction`` in ``[0, 0.5)``; with ``b = 0``
    it is the plain unweighted mean.
    """
    if not 0 <= trim_fraction < 0.5:
        raise ValueError(f"trim_fraction must be in [0, 0.5), got {trim_fraction}")
    out = {}
    for key, stack in _stacked(arrays).items():
        m = stack.shape[0]
        b = trim_count(m, trim_fraction)
        kept = np.sort(stack, axis=0)[b : m - b]
        out[key] = _cast_like(kept.mean(axis=0), np.asarray(arrays[0][key]))
    return out


def _deltas(arrays: Arrays, reference: Arrays) -> dict[str, np.ndarray]:
    """``arrays - reference`` in extended precision, for every floating array."""
    out = {}
    for key, ref in reference.items():
        value = np.asarray(arrays[key])
        if np.issubdtype(value.dtype, np.floating):
            out[key] = value.astype(np.longdouble) - np.asarray(ref, dtype=np.longdouble)
    return out


def _norm(deltas: Mapping[str, np.ndarray]) -> np.longdouble:
    """The L2 norm of all ``deltas`` together, scaled by their largest entry so that no
    square overflows (or underflows) whatever the values' range."""
    peak = max((np.abs(d).max(initial=0) for d in deltas.values()), default=np.longdouble(0))
    if peak == 0:
        return np.longdouble(0)
    total = sum(np.square(d / peak).sum() for d in deltas.values())
    return peak * np.sqrt(np.longdouble(total))


def update_norm(arrays: Arrays, reference: Arrays) -> float:
    """``||arrays - reference||_2`` over every floating array (integer buffers left out)."""
    return float(_norm(_deltas(arrays, reference)))


def update_problem(
    arrays: Arrays, reference: Arrays, factor: float | None, scale: float | None = None
) -> str | None:
    """Why a client model ``y`` cannot be an update of ``x = reference`` (``None`` if it can):
    its update is longer than ``factor`` times the model itself, ``||y - x|| > factor ||x||``
    (every floating array; :func:`update_norm`). ``scale``: ``||x||`` (:func:`upload_norm`
    of ``reference``) where the caller has it, since a round sends one model to many clients.

    One local run of SGD moves a model by a fraction of its own norm, or a few times it from a
    fresh initialisation; an update ``factor`` (:data:`DEFAULT_UPDATE_BOUND`) times longer is
    no training result but a scaled or corrupted upload, which the streaming mean would take
    at full weight (one such reply can make the next model's outputs overflow). Unlike
    ``upload_bound`` (relative to the round's median: it needs the round's uploads in
    memory) this needs only what the server sent, so the classifier's average keeps
    streaming; the reply is dropped, not scaled (nothing honest comes near it). A model of
    norm 0 gives no scale and is not checked. ``factor`` ``None``: no check.
    """
    if factor is None:
        return None
    if scale is None:
        scale = upload_norm(reference)
    if scale == 0:
        return None
    norm = _norm(_deltas(arrays, reference))
    if norm <= factor * scale:
        return None
    return (
        f"arrays: update norm {float(norm):.3g} is {float(norm / scale):.3g} x the norm "
        f"{float(scale):.3g} of the model the server sent, above "
        f"strategy.aggregation.update_bound = {factor:g}"
    )


def clip_update(
    arrays: Arrays, reference: Arrays, clip_norm: float
) -> tuple[dict[str, np.ndarray], bool]:
    """``x + (y - x) * min(1, clip_norm / ||y - x||)``, and whether it clipped.

    Norm clipping of a client's update ``y - x`` against the round's global model ``x``
    (Sun et al. 2019, Sec. 4): a client that scales its update up (model replacement,
    Bagdasaryan et al., AISTATS 2020) moves the average by at most ``clip_norm`` times its
    weight. The norm and the scaling cover every floating array (parameters and BatchNorm
    statistics alike) and a clipped array takes the global model's dtype; integer buffers are
    left as received. An update within the bound is returned unchanged (the same arrays).
    """
    if not (math.isfinite(clip_norm) and clip_norm > 0):
        raise ValueError(f"clip_norm must be a finite number > 0, got {clip_norm}")
    deltas = _deltas(arrays, reference)
    norm = _norm(deltas)
    if norm <= clip_norm:
        return dict(arrays), False
    scale = np.longdouble(clip_norm) / norm
    out = {}
    for key, value in arrays.items():
        value = np.asarray(value)
        if key in deltas:
            x = np.asarray(reference[key], dtype=np.longdouble)
            out[key] = _cast_like(x + deltas[key] * scale, np.asarray(reference[key]))
        else:
            out[key] = value
    return out, True


def upload_norm(arrays: Arrays, reference: Arrays | None = None) -> np.longdouble:
    """``||arrays - reference||_2`` over every floating array (``||arrays||_2`` without a
    reference), in extended precision and without overflow whatever the values."""
    if reference is not None:
        return _norm(_deltas(arrays, reference))
    return _norm(
        {
            k: np.asarray(v, dtype=np.longdouble)
            for k, v in arrays.items()
            if np.issubdtype(np.asarray(v).dtype, np.floating)
        }
    )


def round_median(norms: Sequence[float], groups: Sequence[Any] | None = None) -> float:
    """The round's median norm: the :func:`lower_median` of ``norms`` or, with ``groups``
    (one label per norm, e.g. the client of each of FedTGP's per-class prototypes), the lower
    median over the groups of each group's lower median: one vote per client, so that a
    client with more uploads than the others cannot set it."""
    if groups is None:
        return lower_median(norms)
    if len(groups) != len(norms):
        raise ValueError(f"{len(norms)} norms but {len(groups)} group labels")
    by_group: dict[Any, list[float]] = {}
    for g, n in zip(groups, norms, strict=True):
        by_group.setdefault(g, []).append(n)
    return lower_median([lower_median(v) for v in by_group.values()])


def norm_bound_scales(
    norms: Sequence[float], factor: float, median: float | None = None
) -> list[float]:
    """``min(1, factor * median / norm_k)`` of every norm, ``median`` by default the
    :func:`lower_median` of ``norms``.

    Exactly ``1.0`` where the bound does not bind (a norm of at most ``factor * median``); a
    norm above it gets the scale that brings it down to the bound.
    """
    if not (math.isfinite(factor) and factor >= 1):
        raise ValueError(f"the bound's factor must be a finite number >= 1, got {factor}")
    if not len(norms):
        return []
    median = lower_median(norms) if median is None else median
    bound = np.longdouble(factor) * np.longdouble(median)
    return [1.0 if n <= bound else float(bound / np.longdouble(n)) for n in norms]


def scale_upload(arrays: Arrays, reference: Arrays | None, scale: float) -> dict[str, np.ndarray]:
    """``x + (y - x) * scale`` for every floating array (``y * scale`` without a reference
    ``x``), in extended precision and cast back to the array's dtype; integer arrays as
    received."""
    out = {}
    s = np.longdouble(scale)
    for key, value in arrays.items():
        value = np.asarray(value)
        if not np.issubdtype(value.dtype, np.floating):
            out[key] = value
        elif reference is None:
            out[key] = _cast_like(value.astype(np.longdouble) * s, value)
        else:
            x = np.asarray(reference[key], dtype=np.longdouble)
            out[key] = _cast_like(x + (value.astype(np.longdouble) - x) * s, value)
    return out


@dataclass(frozen=True)
class BoundedUpload:
    """One upload that :func:`bound_uploads` scaled down: its position among the round's
    uploads (``index``), whose it is (``client``), its norm, the round's median norm, the
    factor of the bound it exceeded, and the scale it got."""

    index: int
    client: Any
    norm: float
    median: float
    factor: float
    scale: float  # what the upload (or its update) was multiplied by: bound / norm
    update: bool = True  # the norm is of an update against what the server sent

    @property
    def ratio(self) -> float:
        return self.norm / self.median if self.median > 0 else math.inf

    def message(self, what: str) -> str:
        norm = "update norm" if self.update else "L2 norm"
        return (
            f"{what} of client {self.client}: {norm} {self.norm:.3g} is {self.ratio:.3g} x the "
            f"round's median {self.median:.3g}, above strategy.aggregation.upload_bound = "
            f"{self.factor:g}; scaled down to {self.factor * self.median:.3g}"
        )


def bound_uploads(
    uploads: Sequence[Arrays],
    factor: float | None,
    *,
    reference: Arrays | None = None,
    clients: Sequence[Any] | None = None,
    groups: Sequence[Any] | None = None,
) -> tuple[list[dict[str, np.ndarray]], list[BoundedUpload]]:
    """The round's ``uploads`` with every norm above ``factor`` times the round's median
    brought down to it, and a :class:`BoundedUpload` for each one that was.

    The norm is of the update ``y_k - x`` against ``reference`` (what the server sent) or,
    without one, of the upload ``y_k`` itself; the median is the :func:`lower_median` of the
    round's norms (with ``groups``, one vote per group: :func:`round_median`). An upload
    above the bound is scaled towards the reference (towards 0 without one) until its norm
    is the bound (:func:`scale_upload`): it keeps its direction and still counts, as with
    ``clip_norm`` (Sun et al. 2019), but moves the combination by at most ``factor`` times
    what a typical upload of the round does. Uploads within the bound are returned as given
    (the same arrays), so a combination of them equals the unbounded one bit for bit.
    ``factor`` ``None``: no bound. ``clients`` name the uploads in the reports (default:
    their index).
    """
    uploads = [dict(u) for u in uploads]
    if factor is None or not uploads:
        return uploads, []
    names = list(range(len(uploads))) if clients is None else list(clients)
    if len(names) != len(uploads):
        raise ValueError(f"{len(uploads)} uploads but {len(names)} client names")
    norms = [upload_norm(u, reference) for u in uploads]
    median = round_median(norms, groups)
    out, bounded = [], []
    scales = norm_bound_scales(norms, factor, median)
    median = float(median)
    for i, (upload, norm, scale, name) in enumerate(
        zip(uploads, norms, scales, names, strict=True)
    ):
        if scale == 1.0:
            out.append(upload)
            continue
        out.append(scale_upload(upload, reference, scale))
        bounded.append(
            BoundedUpload(i, name, float(norm), median, factor, scale, reference is not None)
        )
    return out, bounded


def warn_bounded(bounded: Sequence[BoundedUpload], what: str) -> None:
    """One WARNING in the run's log per bounded upload, naming its client."""
    for b in bounded:
        run_log.warning(b.message(what))


class BoundedAverage(KeptReplies):
    """A round's uploads of one kind, averaged under ``strategy.aggregation`` at :meth:`result`.

    Unlike :class:`RunningAverage` it keeps every upload of the round (the bound needs the
    round's median before anything is summed; these uploads, generators and critics, are
    small beside a client's model). :meth:`result` applies :func:`bound_uploads` against
    ``reference`` with ``config.upload_bound`` (a WARNING per bounded upload names its
    client), then the rule of :func:`new_average`, adding the uploads in the order they came
    with the weights given. When the bound does not bind, that is exactly what a
    :class:`RunningAverage` (or :class:`ReplyStack`) fed the same calls gives.
    ``clip_norm`` does not apply (it is in the classifier's units).
    """

    def __init__(
        self, config: AggregationConfig, what: str = "upload", reference: Arrays | None = None
    ) -> None:
        super().__init__()
        self.config = config
        self.what = what
        self.reference = reference
        self.bounded: list[BoundedUpload] = []

    def result(self) -> dict[str, np.ndarray]:
        arrays, self.bounded = bound_uploads(
            self.replies, self.config.upload_bound, reference=self.reference, clients=self.clients
        )
        warn_bounded(self.bounded, self.what)
        average = new_average(self.config, self.reference)
        for a, w in zip(arrays, self.weights, strict=True):
            average.add(a, w)
        return average.result()


def weighted_average(arrays: Sequence[Arrays], weights: Sequence[float]) -> dict[str, np.ndarray]:
    """``sum_k w_k a_k / sum_k w_k`` key by key (FedAvg, McMahan et al. 2017, Alg. 1)."""
    if not arrays:
        raise ValueError("nothing to average: no arrays")
    if len(arrays) != len(weights):
        raise ValueError(f"{len(arrays)} array sets but {len(weights)} weights")
    w = np.asarray(weights, dtype=np.float64)
    if np.any(w < 0) or not np.isfinite(w).all() or w.sum() <= 0:
        raise ValueError(f"weights must be finite, non-negative and not all zero: {weights}")
    avg = RunningAverage()
    for a, wk in zip(arrays, w, strict=True):
        avg.add(a, wk)
    return avg.result()


def check_arrays(
    received: Arrays, reference: Arrays, what: str = "arrays", of: str = "the global model"
) -> str | None:
    """Why ``received`` cannot be used in place of ``reference`` (``None`` if it can).

    ``what`` names the received arrays and ``of`` the reference in the message.

    Rejects missing or extra keys, wrong shapes, dtypes other than the reference's, and
    non-finite values. The dtype must match exactly: :class:`RunningAverage` casts the average
    back to the first reply's dtype, so one int8 or float64 reply would otherwise set the
    global model's dtype. Only real numbers (floating, signed or unsigned integer) are
    accepted: complex, boolean or object arrays are refused whatever the reference holds, so
    the finiteness check always sees every value.
    """
    missing = sorted(set(reference) - set(received))
    extra = sorted(set(received) - set(reference))
    if missing or extra:
        return f"{what}: keys differ from {of} (missing {missing[:3]}, extra {extra[:3]})"
    for key, ref in reference.items():
        value, ref = np.asarray(received[key]), np.asarray(ref)
        if value.shape != ref.shape:
            return f"{what}: '{key}' has shape {value.shape}, expected {ref.shape}"
        if value.dtype.kind not in _REAL_KINDS:
            return f"{what}: '{key}' has dtype {value.dtype.name}, not real numbers"
        if value.dtype != ref.dtype:
            return f"{what}: '{key}' has dtype {value.dtype.name}, expected {ref.dtype.name}"
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            return f"{what}: '{key}' holds non-finite values"
    return None


_REAL_KINDS = frozenset("fiu")  # NumPy dtype kinds: floating, signed and unsigned integer
