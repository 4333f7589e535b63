"""CPFL's math: cohorts, the per-cohort stopping rule, label weights and L1 distillation.

Dhasade, Kermarrec, Nguyen, Pires, de Vos, "Harnessing Increased Client Participation with
Cohort-Parallel Federated Learning", EuroMLSys 2025 (paper 003; the authors' code is
github.com/sacs-epfl/cpfl). Plain NumPy/PyTorch, no Flower; the strategy is
``strategies/cpfl.py`` and the client side ``clients/cpfl.py``.

- **Cohorts** (Sec. 3, step 1): a seeded split into ``n`` disjoint cohorts of near-equal size
  (:func:`random_cohorts`, the authors' ``--method uniform``), or by dominant class
  (:func:`class_cohorts`, the code's ``--method class``).
- **Validation split** (Sec. 4.1): each client with at least 10 samples keeps 10% of them
  apart and reports the loss of the model it receives on them (:func:`holdout_split`).
- **Stopping rule** (Sec. 4.1): the cohort's validation loss per round, smoothed over
  ``window`` rounds; the cohort stops once its minimum has not improved for ``patience`` rounds
  (:class:`PlateauStopper`). Beyond the paper, the members' losses are reduced robustly
  (:func:`cohort_loss`: the mean after clipping any loss above ``bound`` times the median, the
  median or a trimmed mean), in float64 without overflow.
- **A cohort's run** (Sec. 4.1/4.2 and its Sec. 5 suggestion): a :class:`Cohort` holds its
  members, model, stopping rule, simulated clock and teacher snapshots; stage 2 starts at
  :func:`distill_deadline` or when the last cohort stops (:func:`distill_start`), each cohort
  taking part with its teacher as of then (:func:`teacher_at`).
- **Distillation** (Sec. 3, Alg. 1, eqs. 2-3): teacher logits on unlabeled public data combined
  into ``z~_c = sum_i p_ic z_ic`` (:func:`combine_teachers`) with per-class label weights
  ``p_ic = N_ic / sum_j N_jc`` (:func:`teacher_weights`); a fresh student trained with the L1
  loss on logits, Adam lr 1e-3, batch 512 (:func:`distill_l1`).

Where the paper and the code differ (the teachers' weights and outputs; both are options here):
``docs/architecture.md`` ("CPFL's math").
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedgo_flwr.config.schema import Checker
from fedgo_flwr.data import ArrayDataset, ends_in_batch_of_one
from fedgo_flwr.learning.systems import SimClock
from fedgo_flwr.runtime.kernels import autocast, place
from fedgo_flwr.runtime.progress import Progress
from fedgo_flwr.runtime.rng import derive_seed

__all__ = [
    "CONVERGED",
    "EMPTY",
    "GROUPINGS",
    "LOSS_BOUND",
    "LOSS_REDUCES",
    "MAX_ROUNDS",
    "PAUSED",
    "RUNNING",
    "TEACHERS",
    "TEACHER_OUTPUTS",
    "TEACHER_WEIGHTS",
    "Cohort",
    "CohortDistillConfig",
    "PlateauStopper",
    "batches_per_epoch",
    "class_cohorts",
    "cohort_loss",
    "cohort_odds_weights",
    "cohort_totals",
    "cohorts_needed",
    "combine_per_sample",
    "combine_teachers",
    "distill_deadline",
    "distill_l1",
    "distill_start",
    "holdout_size",
    "holdout_split",
    "live_cohorts",
    "mean_sd",
    "prune_history",
    "random_cohorts",
    "teacher_at",
    "teacher_weights",
]

GROUPINGS = ("random", "class")
TEACHER_WEIGHTS = ("label", "size", "uniform", "fedgo")
DISC_MODES = ("double_sigmoid", "sigmoid")
TEACHER_OUTPUTS = ("logits", "log_probs")
LOSS_REDUCES = ("mean", "median", "trimmed_mean")
LOSS_BOUND = 10.0
"""The default ``loss_bound``: a member's loss above 10 x its cohort's median loss of the
round is clipped to that (:func:`cohort_loss`). Clipped, not left out: the clipped values
keep their order, and with a bound of 2 or more the limit is at or above the upper middle
value (``b <= 2 (a + b) / 2``), so the median (the default reduction) is bit for bit the
unbounded one in every round, however far an honest member's loss strays (honest
runs of ``conf/cpfl.yaml`` on digits, Dirichlet 0.1, 4 cohorts of 5, up to 200 rounds,
seeds 0-2, reached 39, 16 and 109 x the round's median late in training, beside members
whose loss went to ~0.01). Under ``mean`` the clip bounds a liar's pull on the signal to
``10 x median / n``; there it also clips such honest stragglers."""


# -- cohorts ---------------------------------------------------------------------------------


def random_cohorts(num_clients: int, n: int, seed: int) -> list[list[int]]:
    """Client ids ``0..num_clients-1`` split at random into ``n`` cohorts of near-equal size.

    A seeded shuffle, then ``floor(K/n)`` clients per cohort and one more for each of the first
    ``K mod n`` cohorts. Each cohort's ids are sorted.
    """
    if not 1 <= n <= num_clients:
        raise ValueError(f"cohorts must be in 1..{num_clients} (the number of clients), got {n}")
    order = np.random.default_rng(derive_seed(seed, "cpfl-cohorts")).permutation(num_clients)
    base, extra = divmod(num_clients, n)
    out, start = [], 0
    for i in range(n):
        size = base + (1 if i < extra else 0)
        out.append(sorted(int(c) for c in order[start : start + size]))
        start += size
    return out


def class_cohorts(histogram: np.ndarray) -> list[list[int]]:
    """Clients grouped by their dominant class: cohort ``c`` holds the clients whose most
    frequent label is ``c`` (ties: the lowest class). ``histogram`` is ``(K, C)`` label counts;
    the result has ``C`` cohorts, some possibly empty."""
    hist = np.asarray(histogram)
    if hist.ndim != 2:
        raise ValueError(f"histogram must be (clients, classes), got shape {hist.shape}")
    dominant = hist.argmax(axis=1)
    return [sorted(int(k) for k in np.flatnonzero(dominant == c)) for c in range(hist.shape[1])]


# -- the validation split --------------------------------------------------------------------


def holdout_size(size: int, fraction: float, min_samples: int) -> int:
    """Validation samples of a client with ``size`` samples: ``floor(fraction * size)`` (at
    least 1) for a client with ``size >= min_samples``, else 0 (Sec. 4.1: 10%, clients with
    at least 10 samples). Always leaves at least one training sample."""
    if fraction <= 0 or size < max(min_samples, 2):
        return 0
    return min(max(1, int(math.floor(fraction * size + 1e-9))), size - 1)


def holdout_split(
    size: int, fraction: float, min_samples: int, seed: int, client: int
) -> tuple[np.ndarray, np.ndarray]:
    """Positions ``(train, validation)`` within a client's ``size`` samples: a seeded random
    :func:`holdout_size` of them for validation, the same in every round; both sorted."""
    k = holdout_size(size, fraction, min_samples)
    order = np.random.default_rng(derive_seed(seed, "cpfl-holdout", client)).permutation(size)
    return np.sort(order[k:]), np.sort(order[:k])


def batches_per_epoch(size: int, batch_size: int) -> int:
    """Mini-batches of one local epoch over ``size`` samples, as
    :func:`fedgo_flwr.learning.training.train_local` runs them (a last batch of one sample is
    dropped)."""
    if size <= 0:
        return 0
    full = math.ceil(size / batch_size)
    return full - 1 if ends_in_batch_of_one(size, batch_size) else full


# -- the stopping rule ------------------------------------------------------------------------


@dataclass
class PlateauStopper:
    """Moving-average early stopping of one cohort (CPFL Sec. 4.1; code ``on_new_validation_loss``).

    :meth:`observe` takes the round's validation signal (:func:`cohort_loss`); the smoothed loss
    is the mean of the last ``window`` observations (all of them until there are ``window``;
    summed share by share where the plain sum would overflow). A smoothed loss below
    every earlier one is a new minimum and resets the counter; any other round (a round without
    an observation too: no client reported a loss) adds one. The cohort stops once the counter
    reaches ``patience``.
    """

    window: int = 20
    patience: int = 50
    history: list[float] = field(default_factory=list)
    smoothed: float | None = None
    best: float = math.inf
    counter: int = 0

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if self.patience < 1:
            raise ValueError(f"patience must be >= 1, got {self.patience}")

    def observe(self, loss: float | None) -> bool:
        """Take one round's loss (``None``: none reported); return whether it set a new minimum."""
        if loss is not None:
            if not math.isfinite(loss):
                raise ValueError(f"validation loss must be finite, got {loss}")
            self.history.append(float(loss))
            del self.history[: -self.window]  # only the window is needed
            self.smoothed = sum(self.history) / len(self.history)
            if not math.isfinite(self.smoothed):  # the sum overflowed: sum the shares instead
                self.smoothed = sum(v / len(self.history) for v in self.history)
            if self.smoothed < self.best:
                self.best = self.smoothed
                self.counter = 0
                return True
        self.counter += 1
        return False

    @property
    def stopped(self) -> bool:
        return self.counter >= self.patience

    def state(self) -> dict:
        return {
            "window": self.window,
            "patience": self.patience,
            "history": list(self.history),
            "smoothed": self.smoothed,
            "best": self.best,
            "counter": self.counter,
        }

    @classmethod
    def from_state(cls, state: dict) -> PlateauStopper:
        return cls(
            window=int(state["window"]),
            patience=int(state["patience"]),
            history=[float(v) for v in state["history"]],
            smoothed=None if state["smoothed"] is None else float(state["smoothed"]),
            best=float(state["best"]),
            counter=int(state["counter"]),
        )


# -- the cohort's signal: its members' losses, reduced ---------------------------------------


def _median(ordered: Sequence[float]) -> float:
    """The median of sorted values, as ``np.median`` but without overflow (``a + (b - a) / 2``
    for an even count)."""
    n = len(ordered)
    a, b = ordered[(n - 1) // 2], ordered[n // 2]
    return a + (b - a) / 2


def _mean(values: Sequence[float]) -> float:
    """``np.mean(values)`` (float64, the same operations), or, where that sum overflows, the
    mean of the values scaled by their largest: finite for finite values."""
    with np.errstate(over="ignore"):
        mean = float(np.mean(values))
    if math.isfinite(mean):
        return mean
    scale = max(values)
    return min(scale * float(np.mean(np.asarray(values, dtype=np.float64) / scale)), scale)


def cohort_loss(
    losses: Sequence[float], reduce: str = "median", bound: float | None = LOSS_BOUND
) -> tuple[float | None, list[int]]:
    """One round's validation signal of a cohort from its members' losses, and the positions of
    the losses clipped (``None`` and ``[]`` when there are none).

    The paper's cohort server averages the losses it receives (Sec. 4.1, "Validation set"; the
    signal of Alg. 1's stopping rule). Members are untrusted, so first, with ``bound`` (> 1),
    every loss above ``bound x median`` of the round's losses is **clipped** to it (see
    :data:`LOSS_BOUND`: with ``bound >= 2`` the median is then unchanged). Then ``reduce``:

    - ``median`` (the default): the losses' median (mean of the two middle ones for an even
      count). One member of a cohort of three or more cannot move it beyond its neighbours,
      whatever it reports, so it cannot stop its cohort early.
    - ``mean`` (the paper): ``np.mean`` of the (clipped) losses -- exactly the paper's float
      operations where nothing is clipped -- or, where that sum would overflow, a scaled mean.
      A liar moves it by up to ``bound x median / n``.
    - ``trimmed_mean``: the mean without the ``max(1, n // 10)`` lowest and highest of the
      ``n`` losses (``n >= 3``; fewer: their mean).

    With one or two reports the median is not an honest member's and the bound cannot tell
    a liar (with ``bound >= 2`` it never binds then). A loss of 0 (the other way) is not
    bounded: in the mean it scales the others' by ``(n-1)/n``, which the stopping rule
    (comparisons of moving averages) does not see.

    Every loss must be a finite float ``>= 0`` (the strategy drops other replies).
    """
    if reduce not in LOSS_REDUCES:
        raise ValueError(f"unknown loss reduction {reduce!r}; choose one of {LOSS_REDUCES}")
    if bound is not None and not bound > 1:
        raise ValueError(f"bound must be > 1 (or None), got {bound}")
    values = [float(v) for v in losses]
    bad = [v for v in values if not (math.isfinite(v) and v >= 0)]
    if bad:
        raise ValueError(f"losses must be finite and >= 0, got {bad[0]}")
    if not values:
        return None, []
    clipped: list[int] = []
    if bound is not None:
        limit = bound * _median(sorted(values))  # may be inf: then nothing is above it
        clipped = [i for i, v in enumerate(values) if v > limit]
        values = [min(v, limit) for v in values] if clipped else values
    if reduce == "median":
        return _median(sorted(values)), clipped
    if reduce == "trimmed_mean" and len(values) >= 3:
        k = max(1, len(values) // 10)
        values = sorted(values)[k:-k]
    return _mean(values), clipped


# -- stage 2: weights, targets, distillation --------------------------------------------------


def teacher_weights(counts: np.ndarray, mode: str = "label") -> np.ndarray:
    """``(n, C)`` weights of ``n`` teachers per class, each column summing to 1.

    ``counts`` is ``(n, C)``: cohort ``i``'s training samples of class ``c``.

    - ``label`` (the authors' code, the default): ``p_ic = N_ic / sum_j N_jc``; a class no
      cohort holds gets uniform weights ``1/n``.
    - ``size`` (the paper's text, eq. 2): one weight per cohort, ``p_i = N_i / N``.
    - ``uniform``: ``1/n``.

    (``fedgo`` weights are per sample, not per class: :func:`cohort_odds_weights`.)
    """
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 2 or counts.shape[0] < 1:
        raise ValueError(f"counts must be (teachers, classes), got shape {counts.shape}")
    if (counts < 0).any() or not np.isfinite(counts).all():
        raise ValueError("counts must be finite and non-negative")
    n, num_classes = counts.shape
    if mode == "uniform":
        return np.full((n, num_classes), 1.0 / n)
    if mode == "size":
        sizes = counts.sum(axis=1)
        total = sizes.sum()
        p = sizes / total if total > 0 else np.full(n, 1.0 / n)
        return np.repeat(p[:, None], num_classes, axis=1)
    if mode == "label":
        per_class = counts.sum(axis=0, keepdims=True)
        safe = np.where(per_class > 0, per_class, 1.0)
        return np.where(per_class > 0, counts / safe, 1.0 / n)
    raise ValueError(f"unknown teacher weighting {mode!r}; choose one of {TEACHER_WEIGHTS}")


def combine_teachers(logits: Tensor, weights: np.ndarray | Tensor) -> Tensor:
    """The distillation target ``z~[x, c] = sum_i p_ic z_i[x, c]`` (eq. 2 with per-class p).

    ``logits`` is ``(n, N, C)`` (teacher, sample, class), ``weights`` ``(n, C)``.
    """
    w = torch.as_tensor(np.asarray(weights), dtype=logits.dtype)
    if logits.ndim != 3 or w.shape != (logits.shape[0], logits.shape[2]):
        raise ValueError(
            f"logits (n, N, C) and weights (n, C) disagree: {tuple(logits.shape)} vs "
            f"{tuple(w.shape)}"
        )
    return torch.einsum("inc,ic->nc", logits, w)


def cohort_odds_weights(client_weights: Tensor, cohorts: Sequence[Sequence[int]]) -> Tensor:
    """FedGO's weights for cohorts (beyond the paper): ``(n, N)`` from the clients' ``(K, N)``.

    FedGO weights client k on sample x by ``n_k Phi_k(x) / sum_j n_j Phi_j(x)`` with the odds
    ``Phi_k = p_k / p_g`` of its discriminator (Jang et al., ICML 2025, Thm 3.6). A cohort's data
    is the mixture of its clients', so its odds are ``sum_{k in i} (n_k / N_i) Phi_k`` and its
    weight ``N_i Phi_i(x) / sum_j N_j Phi_j(x)`` is the sum of its clients' weights: the cohort's
    discriminator is its clients' together, without training one more. Row ``i`` sums the rows
    ``cohorts[i]`` of ``client_weights`` (which must sum to 1 over the clients of ``cohorts``).
    """
    return torch.stack([client_weights[list(members)].sum(0) for members in cohorts])


def combine_per_sample(logits: Tensor, weights: Tensor) -> Tensor:
    """``z~[x] = sum_i w_i(x) z_i[x]``: per-sample weights ``(n, N)``, logits ``(n, N, C)``."""
    if logits.ndim != 3 or tuple(weights.shape) != tuple(logits.shape[:2]):
        raise ValueError(
            f"logits (n, N, C) and weights (n, N) disagree: {tuple(logits.shape)} vs "
            f"{tuple(weights.shape)}"
        )
    return torch.einsum("inc,in->nc", logits, weights.to(logits.dtype))


@dataclass
class CohortDistillConfig:
    """CPFL's server distillation, ``strategy.distill.<key>`` (paper Sec. 4.1: Adam lr 1e-3,
    batch 512, 50 epochs, L1 on logits, per-class label weights).

    The paper's budget in steps: 50 epochs of STL-10's 100,000 unlabeled images at batch 512,
    ``50 x ceil(100000 / 512) = 50 x 196 = 9,800`` Adam steps. ``steps`` (null: ``epochs``
    passes) trains for exactly that many mini-batch steps instead, whatever the public set's
    size: a small public set reaches the paper's step count with many passes.
    ``public_size`` (null: all of it) distils on a seeded random subset of that many public
    images (:func:`public_subset`), to measure how the student depends on the set's size.
    """

    epochs: int = 50
    """Epochs of the student's distillation."""
    steps: int | None = None
    """Adam steps of the distillation instead of `epochs` passes (null: `epochs`); the paper's
    budget is 9,800 (50 epochs of 100,000 images at batch 512)."""
    public_size: int | None = None
    """Distil on a seeded random subset of this many public images (null: all of them)."""
    batch_size: int = 512
    """Distillation batch size."""
    lr: float = 1e-3
    """Adam's learning rate."""
    beta1: float = 0.9
    """Adam's beta1."""
    weights: str = "label"
    """The teachers' weights ``p_ic`` in the L1 target ``sum_i p_ic z_ic``: ``label`` (``N_ic /
    sum_j N_jc``, the authors' code), ``size`` (``N_i / N``, the paper's text), ``uniform`` (1/n),
    or ``fedgo`` (beyond the paper: FedGO's discriminator odds per sample, a cohort's weight the sum
    of its clients' ``n_k Phi_k(x)``; runs FedGO's pre-FL stage with ``strategy.generator`` and
    ``strategy.discriminator``, the generator trained on the public set)."""
    disc_mode: str = "double_sigmoid"
    """With ``weights: fedgo``: how discriminator logits become odds, as FedGO's ``disc_mode``."""
    outputs: str = "logits"
    """Distil ``logits`` or ``log_probs`` (log-softmax outputs, the authors' GN-LeNet)."""
    teacher_batch_size: int = 512
    """Batch of the teachers' inference."""

    def check(self, c: Checker) -> None:
        c.require("epochs", self.epochs >= 1, "must be >= 1")
        if self.steps is not None:
            c.require("steps", self.steps >= 1, "must be >= 1 (or null: epochs)")
        if self.public_size is not None:
            c.require("public_size", self.public_size >= 1, "must be >= 1 (or null: all)")
        c.require("batch_size", self.batch_size >= 1, "must be >= 1")
        c.require("lr", self.lr > 0, "must be > 0")
        c.require("beta1", 0 <= self.beta1 < 1, "must be in [0, 1)")
        c.choice("weights", TEACHER_WEIGHTS)
        c.choice("disc_mode", DISC_MODES)
        c.choice("outputs", TEACHER_OUTPUTS)
        c.require("teacher_batch_size", self.teacher_batch_size >= 1, "must be >= 1")


def public_subset(size: int, wanted: int | None, seed: int) -> np.ndarray | None:
    """Indices of ``wanted`` of ``size`` public images, a seeded draw kept in order (``None``:
    all of them, when ``wanted`` is null or not below ``size``)."""
    if wanted is None or wanted >= size:
        return None
    rng = np.random.default_rng(derive_seed(seed, "cpfl-public-subset"))
    return np.sort(rng.choice(size, size=wanted, replace=False))


def teacher_outputs(logits: Tensor, outputs: str) -> Tensor:
    """What is distilled of a model's raw ``logits``: themselves, or ``log_softmax`` (code)."""
    return F.log_softmax(logits, dim=-1) if outputs == "log_probs" else logits


@dataclass
class L1DistillResult:
    loss: float  # mean L1 over the last epoch
    epoch_losses: list[float]
    steps: int
    seconds: float


def distill_l1(
    student: nn.Module,
    data: ArrayDataset,
    targets: Tensor,
    config: CohortDistillConfig,
    *,
    rng: torch.Generator,
    device: torch.device,
    progress: str | None = None,
) -> L1DistillResult:
    """Train ``student`` in place on ``data`` towards ``targets`` (``(N, C)``) with the mean
    absolute error between its outputs and the targets (``torch.nn.L1Loss``, CPFL eq. 3):
    ``epochs`` shuffled passes, or exactly ``steps`` mini-batch steps if set (the last pass cut
    short where the count ends), Adam (``lr``, betas ``(beta1, 0.999)``), no augmentation.
    ``epoch_losses`` has one mean loss per pass (a cut-short pass: over its steps).
    ``progress`` names the stage in progress lines
    (:class:`~fedgo_flwr.runtime.progress.Progress`); ``None``: none."""
    n = len(data)
    if targets.ndim != 2 or targets.shape[0] != n:
        raise ValueError(f"targets must be ({n}, C), got {tuple(targets.shape)}")
    start = time.perf_counter()
    place(student, device).train()
    opt = torch.optim.Adam(student.parameters(), lr=config.lr, betas=(config.beta1, 0.999))
    end = n - 1 if ends_in_batch_of_one(n, config.batch_size) else n
    losses: list[float] = []
    steps = 0
    per_pass = len(range(0, end, config.batch_size))
    # No mini-batch at all (a public set of one image, whose batch of one is left out): no step.
    budget = config.epochs * per_pass if config.steps is None or not per_pass else config.steps
    said = Progress(progress, budget, "steps")
    while steps < budget:
        order = torch.randperm(n, generator=rng)
        total, count = 0.0, 0
        for s in range(0, end, config.batch_size):
            if steps == budget:
                break
            idx = order[s : s + config.batch_size]
            x, _ = data.to_tensors(idx.numpy())
            with autocast(device):
                out = teacher_outputs(student(x.to(device)), config.outputs)
                loss = F.l1_loss(out, targets[idx].to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
            count += len(idx)
            steps += 1
            said.advance()
        losses.append(total / max(count, 1))
    said.close()
    return L1DistillResult(
        loss=losses[-1] if losses else math.nan,
        epoch_losses=losses,
        steps=steps,
        seconds=time.perf_counter() - start,
    )


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value; NaN for none)."""
    vals = [float(v) for v in values]
    if not vals:
        return math.nan, math.nan
    mean = sum(vals) / len(vals)
    if len(vals) == 1:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))


# -- a cohort's run --------------------------------------------------------------------------

RUNNING, CONVERGED, PAUSED, MAX_ROUNDS, EMPTY = (
    "running",
    "converged",
    "paused",
    "max_rounds",
    "empty",
)
"""A cohort's status: training; stopped by its rule; paused at the distillation time (it
would have finished a round after it); stopped by the round limit; without clients."""
TEACHERS = ("best", "last")
"""Which of a cohort's models is its teacher: the lowest smoothed validation loss, or the last."""


@dataclass
class Cohort:
    """One cohort's federated training: its members, model, stopping rule and clock."""

    index: int
    members: list[int]
    counts: np.ndarray  # (C,) training samples per class over its members
    arrays: dict[str, np.ndarray]
    stopper: PlateauStopper
    clock: SimClock = field(default_factory=SimClock)
    best: dict[str, np.ndarray] | None = None  # the model with the lowest smoothed val loss
    best_round: int | None = None  # that model is the one sent in this round
    status: str = RUNNING
    rounds: int = 0
    updates: int = 0  # usable replies over the run
    finish_seconds: float | None = None
    # (clock, cpu seconds, bytes down, bytes up) after each round: the totals at a deadline
    trace: list[tuple[float, float, int, int]] = field(default_factory=list)
    # distill_when < 1: (simulated time it became known, model) of the teacher as it changed
    history: list[tuple[float, dict[str, np.ndarray]]] = field(default_factory=list)

    def teacher(self, which: str) -> dict[str, np.ndarray]:
        return self.best if which == "best" and self.best is not None else self.arrays

    @property
    def running(self) -> bool:
        return self.status == RUNNING


def live_cohorts(cohorts: Sequence[Cohort]) -> list[Cohort]:
    """The cohorts that have clients."""
    return [c for c in cohorts if c.status != EMPTY]


def cohorts_needed(distill_when: float, live: int) -> int:
    """How many of ``live`` cohorts must have converged before stage 2 starts:
    ``ceil(q n)``, at least one (``distill_when`` = q)."""
    return max(1, math.ceil(distill_when * live - 1e-9))


def distill_deadline(
    cohorts: Sequence[Cohort], distill_when: float, distill_at_hours: float | None
) -> float | None:
    """The simulated time stage 2 starts at, as far as known (``None``: not yet): the earlier
    of ``distill_at_hours`` and T_q, the finish of the ``ceil(q n)``-th converged cohort."""
    limits = []
    if distill_at_hours is not None:
        limits.append(distill_at_hours * 3600.0)
    if distill_when < 1:
        live = live_cohorts(cohorts)
        needed = cohorts_needed(distill_when, len(live))
        done = sorted(c.finish_seconds for c in live if c.status == CONVERGED)
        if len(done) >= needed:
            limits.append(done[needed - 1])
    return min(limits) if limits else None


def prune_history(cohorts: Sequence[Cohort], distill_when: float) -> None:
    """Drop teacher snapshots that can no longer be the one at the distillation time."""
    if distill_when >= 1:
        return
    live = live_cohorts(cohorts)
    needed = cohorts_needed(distill_when, len(live))
    # T_q is at least the needed-th smallest of (finish time, or clock if still running).
    bound = sorted(
        c.finish_seconds if c.finish_seconds is not None else c.clock.seconds for c in live
    )[needed - 1]
    for c in live:
        while len(c.history) > 1 and c.history[1][0] <= bound:
            c.history.pop(0)


def cohort_totals(cohorts: Sequence[Cohort], deadline: float | None, uploads: SimClock) -> SimClock:
    """The cohorts side by side (time: the furthest clock) plus ``uploads`` (to the global
    server). With a ``deadline`` each cohort counts as of it: rounds that ended after it (run
    before it was known) are not counted."""
    clocks = []
    for c in live_cohorts(cohorts):
        if deadline is None:
            clocks.append(c.clock)
            continue
        done = [t for t in c.trace if t[0] <= deadline + 1e-9]
        s, cpu, down, up = done[-1] if done else (0.0, 0.0, 0, 0)
        clocks.append(SimClock(s, cpu, down, up, len(done)))
    total = SimClock.parallel(clocks)
    total.add_bytes(uploads.bytes_down, uploads.bytes_up)
    return total


def distill_start(cohorts: Sequence[Cohort], deadline: float | None) -> float:
    """The simulated time stage 2 starts: ``deadline`` if one applied, else the last
    cohort's finish."""
    end = max((c.finish_seconds or c.clock.seconds for c in live_cohorts(cohorts)), default=0.0)
    return end if deadline is None else min(deadline, end)


def teacher_at(c: Cohort, at: float, distill_when: float, which: str) -> dict[str, np.ndarray]:
    """Cohort ``c``'s teacher at simulated time ``at``: with ``distill_when`` < 1 the last
    snapshot known by then (its history), else its ``which`` model (:data:`TEACHERS`)."""
    if distill_when < 1:
        known = [a for t, a in c.history if t <= at + 1e-9]
        return known[-1] if known else c.history[0][1]
    return c.teacher(which)
