"""Server-side ensemble distillation (plain PyTorch, no Flower).

The server model of a round starts from the n_k-weighted parameter average of the round's client
models and is trained on an unlabeled set against the weighted-ensemble pseudo-labels
``softmax(sum_k w_k(x) f_k(x))`` with a KL loss (FedGO, Jang et al. ICML 2025, Alg. 1 lines
"θ^t <- Σ n_k θ_k / Σ n_k" and "ỹ(u) <- σ(Σ w_k(u) f(u; θ_k))"; FedDF, Lin et al. NeurIPS 2020,
Alg. 1, AVGLOGITS).

Teachers are frozen, so their logits on the distillation set are computed **once per round** by
:class:`TeacherBank`, one client model at a time, for every augmentation view (identity and the
horizontal flip, the only augmentation): a batch that flips sample ``i`` reads view 1's targets
for ``i``, exactly what recomputing the teachers on the augmented batch would give.

Two protocols (``DistillConfig.protocol``): ``"fedgo"`` (FedGO App. E.2: ``epochs`` full passes,
Adam, batch 64, the lr cosine-decayed across rounds up to ``decay_rounds``, no early stop) and
``"feddf"`` (FedDF Sec. 4 and its code: at most ``max_steps`` batches, a cosine schedule over the
steps, gradient clipping, early stopping on a labelled server validation split, the best student
seen returned).

BatchNorm statistics (``DistillConfig.bn_stats``): ``update`` (plain train mode, the authors'
code of FedGO and DaFKD), ``batch`` (train mode, then every BatchNorm layer's running statistics
put back as they were: the model keeps those of the clients' data) or ``eval`` (the averaged
model's statistics normalise the distillation batches too); ``auto``, the default, is ``batch`` on
generated data and ``update`` on real data. Why, with what was measured:
``docs/architecture.md`` ("Server-side distillation").
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedgo_flwr.config.schema import Checker
from fedgo_flwr.data import ArrayDataset, ends_in_batch_of_one
from fedgo_flwr.learning.aggregation import lower_median
from fedgo_flwr.runtime import profiling
from fedgo_flwr.runtime.kernels import autocast, inference_batch, place
from fedgo_flwr.runtime.progress import Progress

PROTOCOLS = ("fedgo", "feddf")
BN_STATS = ("auto", "update", "batch", "eval")
TEACHER_NORMS = ("none", "std")
"""``teacher_norm`` of the ensemble strategies: the teachers' logits as they are, or each
teacher's rescaled to the median teacher's scale (:func:`normalise_teachers`)."""
MAX_TEACHER_LOGIT = 1e6
"""Largest ``|logit|`` a client model may produce as a teacher. A trained classifier's logits
are O(1-100) (float32's softmax saturates near 100); a finite model whose logits approach
float32's range (3.4e38) would overflow to inf or NaN in the ensemble (divided by the
temperature) and in the pseudo-labels, so its reply is dropped like one with non-finite logits
(:func:`teacher_logits_problem`)."""


def teacher_logits_problem(logits: Tensor, where: str = "the server's data") -> str | None:
    """Why a client model whose logits on ``where`` are ``logits`` cannot be a teacher (not
    finite numbers of at most :data:`MAX_TEACHER_LOGIT` in magnitude), or ``None``.

    The one check of every ensemble of client models: FedDF and its family on the
    distillation set (and the test split), the one-shot strategies on the test split.
    """
    if not bool(torch.isfinite(logits).all()):
        return f"teacher logits on {where} are not finite"
    peak = float(logits.abs().max()) if logits.numel() else 0.0
    if peak > MAX_TEACHER_LOGIT:
        return (
            f"teacher logits on {where} exceed {MAX_TEACHER_LOGIT:g} in magnitude "
            f"(max |logit| {peak:.3g})"
        )
    return None


def teacher_scales(logits: Tensor) -> Tensor:
    """Each teacher's logit scale ``(K,)`` for ``logits`` ``(K, ..., C)``: the root mean square
    of its logits centred per sample over the classes (a per-sample constant does not change
    a softmax, so it does not count), over every sample (and view) it was given."""
    centred = logits - logits.mean(dim=-1, keepdim=True)
    return centred.pow(2).flatten(1).mean(dim=1).sqrt()


def teacher_scale_outliers(logits: Tensor, factor: float | None) -> list[tuple[int, float, float]]:
    """``(index, scale, median)`` of every teacher of ``logits`` ``(K, ..., C)`` whose
    :func:`teacher_scales` exceeds ``factor`` times the round's median teacher scale (the
    :func:`~fedgo_flwr.learning.aggregation.lower_median`); ``factor`` ``None``: none.

    The relative half of the teacher check (:func:`teacher_logits_problem` is the absolute
    half): a client that multiplies its last layer by ``c`` multiplies its logits by ``c``
    and steers an unnormalised ensemble while its logits stay far below
    :data:`MAX_TEACHER_LOGIT` (a trained digits CNN's are below 10, so ``c = 1e5`` passes
    it). The factor is ``strategy.aggregation.upload_bound``, the bound of every other
    upload relative to its round.
    """
    if factor is None or logits.shape[0] == 0:
        return []
    scales = [float(s) for s in teacher_scales(logits.detach().double())]
    median = lower_median(scales)
    return [(k, s, median) for k, s in enumerate(scales) if s > factor * median]


def bound_teachers(
    logits: Tensor, factor: float | None
) -> tuple[Tensor, list[tuple[int, float, float]]]:
    """``logits`` ``(K, ..., C)`` with every :func:`teacher_scale_outliers` teacher rescaled to
    the round's median teacher scale, and those teachers (``logits`` itself when none is).

    To the median, not to ``factor`` times it: honest teachers stay well below the factor
    (``benchmarks/studies/trust.md``, "Honest ratios under the reply bounds"), so one above it has
    scaled its logits, and at ``factor`` times the median it would still outweigh several
    honest teachers in the logit average; at the median it counts as one teacher, by its
    ranking of the classes (as under ``teacher_norm: std``). Teachers within the factor are
    left as they are."""
    outliers = teacher_scale_outliers(logits, factor)
    if not outliers:
        return logits, []
    out = logits.clone()
    for k, scale, median in outliers:
        out[k] = out[k] * (median / scale)
    return out, outliers


def normalise_teachers(logits: Tensor, mode: str = "none") -> Tensor:
    """The teachers' logits ``(K, ..., C)`` as the ensemble takes them (``teacher_norm``).

    ``none``: as they are (the input itself). ``std``: teacher ``k``'s logits times
    ``median_i s_i / s_k``, ``s`` the :func:`teacher_scales` over the same samples (the
    distillation set, the test split, a synthetic batch), the scales detached (no gradient
    flows through them). Why: a client that multiplies its last layer by ``c`` multiplies its
    logits by ``c``, and in an unnormalised ensemble ``sum_k w_k z_k`` it then steers every
    arg-max and pseudo-label (at ``c = 1e5`` the ensemble agrees with it on every sample)
    while its logits stay below :data:`MAX_TEACHER_LOGIT`. Rescaled, every teacher speaks
    at the median teacher's scale, so the ensemble's sharpness (and the meaning of the
    distillation temperature) stays what it was, and one teacher counts by its ranking of
    the classes, not by its magnitude. A teacher whose logits are constant (scale 0) is left
    as it is. The default ``none`` keeps the papers' ensembles.
    """
    if mode == "none":
        return logits
    if mode != "std":
        raise ValueError(f"unknown teacher_norm {mode!r}; choose one of {TEACHER_NORMS}")
    scales = teacher_scales(logits.detach())
    target = scales.median()
    factor = torch.where(scales > 0, target / scales.clamp_min(1e-30), torch.ones_like(scales))
    return logits * factor.view(-1, *([1] * (logits.ndim - 1))).to(logits.dtype)


@dataclass
class DistillConfig:
    """Server distillation, ``strategy.distill.<key>`` (defaults: FedGO App. E.2 / FedDF Sec. 4)."""

    protocol: str = "fedgo"
    """``fedgo``: ``epochs`` passes with Adam at ``lr``, cosine decay across ``decay_rounds`` rounds
    (``lr_decay``); ``feddf``: at most ``max_steps`` steps, validation every ``eval_every``, stop
    after ``patience`` steps without improvement, ``grad_clip``, the best student kept."""
    epochs: int = 10
    """Passes over the distillation set per round (``fedgo`` protocol)."""
    batch_size: int = 64
    """Distillation batch size."""
    lr: float = 1e-3
    """Adam's learning rate."""
    lr_decay: bool = True
    """Cosine decay of ``lr`` across ``decay_rounds`` rounds (``fedgo``)."""
    decay_rounds: int = 100
    """The rounds the cosine decay spans (``fedgo``)."""
    temperature: float = 1.0
    """Softmax temperature of the teacher ensemble and the student."""
    augment: bool = True
    """Random flips of the distillation images, where the data allow."""
    max_steps: int = 10_000
    """Most steps per round (``feddf`` protocol)."""
    eval_every: int = 100
    """Steps between validations (``feddf`` protocol)."""
    patience: int = 1_000
    """Steps without a better validation before stopping (``feddf``)."""
    grad_clip: float = 5.0
    """Gradient norm clip (``feddf`` protocol)."""
    bn_stats: str = "auto"
    """The student's BatchNorm statistics while it distils: ``update`` (train mode), ``batch``
    (train mode, then the averaged model's running statistics are put back), ``eval`` (BatchNorm in
    eval mode: the averaged model's statistics normalise every batch); ``auto``: ``batch`` on
    generated data (FedGO D2, DaFKD), ``update`` on real data. Generated images' statistics can ruin
    a server model under ``update`` (``fedgo_flwr/learning/distill.py`` explains)."""

    def check(self, c: Checker) -> None:
        c.choice("protocol", PROTOCOLS)
        c.choice("bn_stats", BN_STATS)
        c.require("epochs", self.epochs >= 1, "must be >= 1")
        c.require("batch_size", self.batch_size >= 1, "must be >= 1")
        c.require("decay_rounds", self.decay_rounds >= 1, "must be >= 1")
        c.require("max_steps", self.max_steps >= 1, "must be >= 1")
        c.require("eval_every", self.eval_every >= 1, "must be >= 1")
        c.require("lr", self.lr > 0, "must be > 0")
        c.require("temperature", self.temperature > 0, "must be > 0")
        c.require("grad_clip", self.grad_clip > 0, "must be > 0")
        # 0 would end the feddf loop before its first step: no distillation, loss 0.0.
        c.require("patience", self.patience >= 1, "must be >= 1")

    def round_lr(self, server_round: int) -> float:
        """The FedGO protocol's server lr in ``server_round`` (1-based)."""
        if not self.lr_decay:
            return self.lr
        t = min(max(server_round - 1, 0), self.decay_rounds)
        return self.lr * 0.5 * (1.0 + math.cos(math.pi * t / self.decay_rounds))

    def bn_mode(self, generated: bool) -> str:
        """``update``, ``batch`` or ``eval`` (see the module docstring) for a distillation set
        that is ``generated`` (else real images)."""
        if self.bn_stats != "auto":
            return self.bn_stats
        return "batch" if generated else "update"


def _batchnorms(model: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    return [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def train_mode(model: nn.Module, bn_mode: str = "update") -> nn.Module:
    """``model.train()``, with its BatchNorm layers back in eval mode for ``bn_mode`` ``eval``
    (they then normalise by, and leave unchanged, their running statistics)."""
    model.train()
    if bn_mode == "eval":
        for module in _batchnorms(model):
            module.eval()
    return model


def num_views(data: ArrayDataset, augment: bool) -> int:
    """2 (identity, horizontal flip) when flips apply to ``data``, else 1."""
    return 2 if augment and data.flip and data.is_image else 1


def iter_view_batches(
    data: ArrayDataset, views: int, batch_size: int, device: torch.device
) -> Iterator[tuple[int, Tensor]]:
    """(view, batch) pairs covering every sample once per view, in order, each made when it
    is needed (a pass over the set then stays in the CPU's caches, which building all the
    batches first does not). On a GPU the batch is at least
    :func:`~fedgo_flwr.runtime.kernels.inference_batch`'s (these passes are forward-only)."""
    batch_size = inference_batch(batch_size, device)
    for start in range(0, len(data), batch_size):
        idx = np.arange(start, min(start + batch_size, len(data)))
        x, _ = data.to_tensors(idx)
        for v in range(views):
            yield v, (x.flip(-1) if v == 1 else x).to(device)


def view_batches(
    data: ArrayDataset, views: int, batch_size: int, device: torch.device
) -> list[tuple[int, Tensor]]:
    """:func:`iter_view_batches` as a list, for several models to read the same batches."""
    return list(iter_view_batches(data, views, batch_size, device))


class TeacherBank:
    """Teacher logits on the distillation set: ``(K, V, N, C)``, built one model at a time.

    With ``key``s (e.g. partition ids) the teachers are stacked in key order, whatever order
    they were added in (replies arrive in any order; the result must not depend on it).
    """

    def __init__(
        self,
        data: ArrayDataset,
        *,
        augment: bool,
        batch_size: int = 128,
        teacher_norm: str = "none",
    ) -> None:
        self.data = data
        self.views = num_views(data, augment)
        self.batch_size = batch_size
        self.teacher_norm = teacher_norm
        self._logits: list[tuple[int, Tensor]] = []

    @torch.no_grad()
    def add(self, model: nn.Module, device: torch.device, key: int | None = None) -> None:
        """Add ``model``'s logits on every view (eval mode); the model can be dropped after."""
        self.add_logits(predict_views(model, self.data, self.views, self.batch_size, device), key)

    def add_logits(self, logits: Tensor, key: int | None = None) -> None:
        """Add a teacher's ``(V, N, C)`` logits computed by the caller (who may check them
        first: FedDF drops a client whose logits are not finite)."""
        self._logits.append((len(self._logits) if key is None else key, logits))

    def remove_logits(self, key: int) -> None:
        """Drop the logits added under ``key`` (a teacher left out after its pass)."""
        kept = [(k, t) for k, t in self._logits if k != key]
        if len(kept) == len(self._logits):
            raise KeyError(f"no teacher logits under key {key}")
        self._logits = kept

    @property
    def logits(self) -> Tensor:
        """``(K, V, N, C)`` in key order, each teacher under ``teacher_norm``
        (:func:`normalise_teachers`)."""
        stacked = torch.stack([t for _, t in sorted(self._logits, key=lambda kt: kt[0])])
        return normalise_teachers(stacked, self.teacher_norm)

    def __len__(self) -> int:
        return len(self._logits)


@torch.no_grad()
def predict_views(
    model: nn.Module, data: ArrayDataset, views: int, batch_size: int, device: torch.device
) -> Tensor:
    """``(V, N, C)`` logits of ``model`` (eval mode) on each view of ``data``."""
    place(model, device).eval()
    parts: list[list[Tensor]] = [[] for _ in range(views)]
    with autocast(device):
        for v, x in iter_view_batches(data, views, batch_size, device):
            parts[v].append(model(x).float().cpu())
    return torch.stack([torch.cat(p) for p in parts])


@dataclass
class DistillResult:
    """What a distillation run did."""

    loss: float  # mean KL over the last epoch (fedgo) or the last eval window (feddf)
    steps: int
    seconds: float
    best_val_accuracy: float | None = None
    best_step: int | None = None


def _kl(student_logits: Tensor, targets: Tensor, temperature: float) -> Tensor:
    log_p = F.log_softmax(student_logits / temperature, dim=-1)
    return F.kl_div(log_p, targets, reduction="batchmean")


def _batch(
    data: ArrayDataset,
    targets: Tensor,
    idx: Tensor,
    flip: Tensor | None,
    device: torch.device,
) -> tuple[Tensor, Tensor]:
    x, _ = data.to_tensors(idx.numpy())
    view = torch.zeros_like(idx)
    if flip is not None:
        x = torch.where(flip.view(-1, *([1] * (x.ndim - 1))), x.flip(-1), x)
        view = flip.long()
    return x.to(device), targets[view, idx].to(device)


def distill(
    student: nn.Module,
    data: ArrayDataset,
    targets: Tensor,
    config: DistillConfig,
    *,
    server_round: int,
    rng: torch.Generator,
    device: torch.device,
    validate: Callable[[nn.Module], float] | None = None,
    generated: bool = False,
    progress: str | None = None,
) -> DistillResult:
    """Train ``student`` in place on ``data`` against ``targets`` (``(V, N, C)`` probabilities).

    ``generated``: ``data`` is made by a generator (``config.bn_stats: auto`` then keeps the
    student's BatchNorm running statistics: mode ``batch``).

    ``validate(model) -> accuracy`` is required by the ``feddf`` protocol (its early stopping).
    ``progress`` names the stage in progress lines (:class:`~fedgo_flwr.runtime.progress.Progress`,
    steps done of at most ``epochs`` passes, or ``max_steps``); ``None``: none.
    """
    with profiling.phase("distillation") as tally:
        mode = config.bn_mode(generated)
        saved = (
            [
                {k: b.clone() for k, b in m.named_buffers(recurse=False)}
                for m in _batchnorms(student)
            ]
            if mode == "batch"
            else []
        )
        with Progress(progress, _planned_steps(config, len(data)), "steps") as said:
            result = _distill(
                student,
                data,
                targets,
                config,
                server_round,
                rng,
                device,
                validate,
                mode,
                tally,
                said,
            )
        if mode == "batch":  # the running statistics (not the affine weights) as they were
            with torch.no_grad():
                for module, state in zip(_batchnorms(student), saved, strict=True):
                    for name, buffer in module.named_buffers(recurse=False):
                        buffer.copy_(state[name])
        return result


def _planned_steps(config: DistillConfig, n: int) -> int:
    """The steps :func:`_distill` takes at most: ``epochs`` passes of ``batch_size`` (the
    ``fedgo`` protocol) or ``max_steps`` (``feddf``, which may stop early)."""
    if config.protocol != "fedgo":
        return config.max_steps
    end = n - 1 if ends_in_batch_of_one(n, config.batch_size) else n
    return config.epochs * len(range(0, max(end, 0), config.batch_size))


def _distill(
    student: nn.Module,
    data: ArrayDataset,
    targets: Tensor,
    config: DistillConfig,
    server_round: int,
    rng: torch.Generator,
    device: torch.device,
    validate: Callable[[nn.Module], float] | None,
    bn_mode: str,
    tally: profiling.Tally,
    said: Progress,
) -> DistillResult:
    if targets.ndim != 3 or targets.shape[1] != len(data):
        raise ValueError(f"targets must be (V, {len(data)}, C), got {tuple(targets.shape)}")
    views = targets.shape[0]
    start = time.perf_counter()
    train_mode(place(student, device), bn_mode)
    n = len(data)

    def draw(size: int) -> tuple[Tensor, Tensor | None]:
        idx = torch.randperm(n, generator=rng)[:size]
        flip = torch.rand(len(idx), generator=rng) < 0.5 if views == 2 else None
        return idx, flip

    if config.protocol == "fedgo":
        opt = torch.optim.Adam(student.parameters(), lr=config.round_lr(server_round))
        steps, last = 0, 0.0
        for _ in range(config.epochs):
            order, flips = draw(n)
            total, count = 0.0, 0
            end = n - 1 if ends_in_batch_of_one(n, config.batch_size) else n
            for s in range(0, end, config.batch_size):
                idx = order[s : s + config.batch_size]
                flip = flips[s : s + config.batch_size] if flips is not None else None
                x, t = _batch(data, targets, idx, flip, device)
                with autocast(device):
                    loss = _kl(student(x), t, config.temperature)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                total += loss.item() * len(idx)
                count += len(idx)
                steps += 1
                tally.add(len(idx))
                said.advance()
            last = total / max(count, 1)
        return DistillResult(loss=last, steps=steps, seconds=time.perf_counter() - start)

    if validate is None:
        raise ValueError("the feddf protocol needs a labelled validation split (validate=...)")
    opt = torch.optim.Adam(student.parameters(), lr=config.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=config.max_steps)
    best_acc = validate(student)
    best_state, best_step = copy.deepcopy(student.state_dict()), 0
    train_mode(student, bn_mode)
    window, count, step = 0.0, 0, 0
    last = 0.0
    while step < config.max_steps and step - best_step < config.patience:
        idx, flip = draw(min(config.batch_size, n))
        x, t = _batch(data, targets, idx, flip, device)
        with autocast(device):
            loss = _kl(student(x), t, config.temperature)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(student.parameters(), config.grad_clip)
        opt.step()
        sched.step()
        step += 1
        tally.add(len(idx))
        said.advance()
        window += loss.item()
        count += 1
        if step % config.eval_every == 0 or step == config.max_steps:
            acc = validate(student)
            train_mode(student, bn_mode)
            last, window, count = window / count, 0.0, 0
            if acc > best_acc:
                best_acc, best_step = acc, step
                best_state = copy.deepcopy(student.state_dict())
    student.load_state_dict(best_state)
    return DistillResult(
        loss=last if count == 0 else window / count,
        steps=step,
        seconds=time.perf_counter() - start,
        best_val_accuracy=best_acc,
        best_step=best_step,
    )
