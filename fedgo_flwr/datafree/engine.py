"""The server's epoch loop of data-free distillation (Co-Boosting Alg. 1) and its settings.

:class:`DataFreeDistillation` runs one epoch per call: synthesise a batch
(:mod:`fedgo_flwr.datafree.synthesis`), grow the pool, re-weight the ensemble, distil the
student on the (diversified) pool; :class:`BoostSettings` holds everything of an epoch after
synthesis. Its state dict captures all of it, so a resumed run continues exactly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from fedgo_flwr.config.schema import Checker
from fedgo_flwr.data import IndexedBatch
from fedgo_flwr.datafree.ensemble import (
    DIVERSIFY_VARIANTS,
    diversify,
    member_logits,
    weight_step,
    weighted_logits,
)
from fedgo_flwr.datafree.generator import Generator, reset_generator
from fedgo_flwr.datafree.losses import kd_loss
from fedgo_flwr.datafree.pool import PoolLogits, SyntheticPool
from fedgo_flwr.datafree.synthesis import SynthesisSettings, synthesize
from fedgo_flwr.learning.distill import normalise_teachers
from fedgo_flwr.runtime.kernels import place
from fedgo_flwr.weighting import cap_scalar_shares

__all__ = [
    "ORDERS",
    "BoostSettings",
    "DataFreeDistillation",
    "PlainBoost",
]

ORDERS = ("paper", "code")
"""When the ensemble weights are updated: after the epoch's batch joined the pool, on
diversified batches (Alg. 1 lines 10-13), or before, on the old pool as it is, from the second
epoch on (the authors' ``synthesize``)."""


@dataclass
class BoostSettings:
    """Everything of an epoch after synthesis (Alg. 1 lines 10-18).

    ``reweight`` (EE), ``mu`` (``None``: 0.1 / n, paper Sec. 4.1), ``mu_decay`` (0.99 per epoch,
    the code's ``wdc``), ``order`` (:data:`ORDERS`). ``diversify`` (DHS), ``variant``,
    ``epsilon`` (8/255), ``diversify_temperature`` (the code variant's softmax temperature 4).
    Distillation (eq. 4): ``temperature`` 4, SGD ``lr`` 0.01, ``momentum`` 0.9,
    ``weight_decay`` 1e-4, cosine-annealed over the run's epochs (the code), ``grad_clip`` 10,
    ``batch_size`` 128, one shuffled pass over the pool per epoch; ``augment``: random
    horizontal flips of pool images where the data set allows them. ``cache_logits``: the
    client models' logits on each pool image are computed once, when it joins the pool, and
    read back by the passes that take the pool as stored
    (:class:`~fedgo_flwr.datafree.pool.PoolLogits`: DENSE's and F-ADI's distillation, any
    without diversification, the ``code`` order's re-weighting); ``false`` recomputes them
    every pass (the authors' code; the same values up to float rounding).
    """

    reweight: bool = True
    mu: float | None = None
    mu_decay: float = 0.99
    order: str = "paper"
    diversify: bool = True
    variant: str = "paper"
    epsilon: float = 8 / 255
    diversify_temperature: float = 4.0
    temperature: float = 4.0
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 1e-4
    grad_clip: float = 10.0
    batch_size: int = 128
    augment: bool = True
    cache_logits: bool = True

    def check(self, c: Checker) -> None:
        if self.mu is not None:
            c.require("mu", self.mu > 0, "must be > 0 (or null: 0.1 / number of clients)")
        c.require("mu_decay", 0 < self.mu_decay <= 1, "must be in (0, 1]")
        c.choice("order", ORDERS)
        c.choice("variant", DIVERSIFY_VARIANTS)
        c.require("epsilon", self.epsilon >= 0, "must be >= 0")
        c.require("diversify_temperature", self.diversify_temperature > 0, "must be > 0")
        c.require("temperature", self.temperature > 0, "must be > 0")
        c.require("lr", self.lr > 0, "must be > 0")
        c.require("momentum", 0 <= self.momentum < 1, "must be in [0, 1)")
        c.require("weight_decay", self.weight_decay >= 0, "must be >= 0")
        c.require("grad_clip", self.grad_clip >= 0, "must be >= 0 (0: no clipping)")
        c.require("batch_size", self.batch_size >= 1, "must be >= 1")


@dataclass
class PlainBoost(BoostSettings):
    """The epoch without Co-Boosting's two boosting steps: the ensemble keeps ``w_k = 1/n`` (no
    EE) and the student distils on the pool as generated (no DHS). The data-free baselines'
    (DENSE, F-ADI) distillation in Co-Boosting's Table 1 (paper 004, Sec. 4.1)."""

    reweight: bool = False
    diversify: bool = False


class DataFreeDistillation:
    """The server's loop of Co-Boosting (Alg. 1) and its data-free peers, one epoch per call.

    Holds the frozen client models, their weights ``w`` (``1/n`` to start), the generator, the
    pool, the student and its optimiser, and one seeded ``torch.Generator`` for everything
    random. :meth:`state_dict` / :meth:`load_state_dict` capture all of it, so a run resumed
    after any epoch continues exactly as an uninterrupted one. The models and the generator are
    put on ``device`` by :func:`fedgo_flwr.runtime.kernels.place` (channels-last with
    ``resources.channels_last``).
    """

    def __init__(
        self,
        models: Sequence[nn.Module],
        student: nn.Module,
        synthesis: SynthesisSettings,
        boost: BoostSettings,
        *,
        num_classes: int,
        image_shape: Sequence[int],
        flip: bool,
        rng: torch.Generator,
        device: torch.device,
        epochs: int,
        nz: int = 256,
        ngf: int = 64,
        sample_weights: Callable[[Tensor], Tensor] | None = None,
        teacher_norm: str = "none",
        share_caps: Tensor | None = None,
    ) -> None:
        if not models:
            raise ValueError("data-free distillation needs at least one client model")
        if boost.order not in ORDERS:
            raise ValueError(f"unknown order {boost.order!r}; choose one of {ORDERS}")
        self.models = [place(m, device).eval().requires_grad_(False) for m in models]
        self.student = place(student, device)
        self.synthesis = synthesis
        self.boost = boost
        self.num_classes = int(num_classes)
        self.image_shape = tuple(int(s) for s in image_shape)
        self.device = device
        self.rng = rng
        self.nz = int(nz)
        n = len(self.models)
        self.weights = torch.full((n,), 1.0 / n)
        self.mu = boost.mu if boost.mu is not None else 0.1 / n
        self.generator: Generator | None = None
        if synthesis.source == "generator":
            self.generator = place(Generator(self.image_shape, nz=nz, ngf=ngf), device)
            reset_generator(self.generator, rng)
        self.pool = SyntheticPool(self.image_shape, self.num_classes, flip)
        reads_stored = not boost.diversify or (boost.reweight and boost.order == "code")
        self.pool_logits: PoolLogits | None = None
        if boost.cache_logits and reads_stored:
            self.pool_logits = PoolLogits(self.models, flip and boost.augment, device)
        self.optimizer = torch.optim.SGD(
            self.student.parameters(),
            lr=boost.lr,
            momentum=boost.momentum,
            weight_decay=boost.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
            self.optimizer, T_max=max(int(epochs), 1)
        )
        self.epoch = 0
        self.sample_weights = sample_weights
        self.teacher_norm = teacher_norm
        if share_caps is not None and tuple(share_caps.shape) != (n,):
            raise ValueError(f"share_caps must have shape ({n},), got {tuple(share_caps.shape)}")
        self.share_caps = share_caps
        self.capped: list[int] = []  # members whose weight share was capped this epoch

    # -- pieces ----------------------------------------------------------------------------
    def ensemble(
        self, x: Tensor, weights: Tensor | None = None, raw: Tensor | None = None
    ) -> Tensor:
        """``A_w(x)`` under the current (or given) weights, times the per-sample multipliers
        ``m_k(x)`` when the engine has them (FedGO's odds: member ``k`` weighs ``w_k m_k(x)``).
        ``raw``: the members' logits on ``x`` before ``teacher_norm``, when already known (the
        pool's cache)."""
        w = (self.weights if weights is None else weights).to(x.device)
        if self.sample_weights is not None:
            w = w[:, None] * self.sample_weights(x)
        return weighted_logits(self._members(x, raw), w)

    def _members(self, x: Tensor, raw: Tensor | None) -> Tensor:
        if raw is None:
            return member_logits(self.models, x, self.teacher_norm)
        return normalise_teachers(raw, self.teacher_norm)

    def _pool_batch(self, batch: IndexedBatch, diversified: bool) -> tuple[Tensor, Tensor | None]:
        """A pool batch's model input, diversified (eq. 10) when ``diversified`` and DHS is on,
        and the members' raw logits on it from :attr:`pool_logits` when it is the pool as
        stored and they are cached (else ``None``)."""
        if diversified and self.boost.diversify:
            return self._diversified(batch.x), None
        if self.pool_logits is None:
            return batch.x, None
        return batch.x, self.pool_logits.read(batch.index, batch.flipped)

    def step_size(self) -> float:
        """``mu * mu_decay ** epoch``: this epoch's weight step."""
        return self.mu * self.boost.mu_decay**self.epoch

    def _diversified(self, x: Tensor) -> Tensor:
        if not self.boost.diversify:
            return x
        return diversify(
            x,
            self.ensemble,
            self.boost.epsilon,
            self.rng,
            variant=self.boost.variant,
            temperature=self.boost.diversify_temperature,
        )

    def reweight_pass(self, diversified: bool) -> int:
        """One weight step (eq. 12) per pool batch; returns the number of steps. With
        ``share_caps`` each step is followed by
        :func:`~fedgo_flwr.weighting.cap_scalar_shares`: no member's share of the weights above
        its cap (the members it lowered are added to :attr:`capped`)."""
        steps, step = 0, self.step_size()
        for batch in self.pool.indexed_batches(
            self.boost.batch_size, self.rng, self.boost.augment, self.device
        ):
            x, raw = self._pool_batch(batch, diversified)
            with torch.no_grad():
                logits = self._members(x, raw)
                mult = None if self.sample_weights is None else self.sample_weights(x).cpu()
            self.weights = weight_step(self.weights, logits.cpu(), batch.y.cpu(), step, mult)
            if self.share_caps is not None:
                self.weights, capped = cap_scalar_shares(self.weights, self.share_caps)
                self.capped = sorted({*self.capped, *capped})
            steps += 1
        return steps

    def distill_pass(self) -> tuple[float, int]:
        """One pass of the student over the (diversified) pool; mean KD loss and steps."""
        self.student.train()
        total, count, steps = 0.0, 0, 0
        for batch in self.pool.indexed_batches(
            self.boost.batch_size, self.rng, self.boost.augment, self.device
        ):
            x, raw = self._pool_batch(batch, diversified=True)
            with torch.no_grad():
                t_out = self.ensemble(x, raw=raw)
            loss = kd_loss(self.student(x), t_out, self.boost.temperature)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if self.boost.grad_clip > 0:
                nn.utils.clip_grad_norm_(self.student.parameters(), self.boost.grad_clip)
            self.optimizer.step()
            total += float(loss.item()) * x.shape[0]
            count += x.shape[0]
            steps += 1
        return total / max(count, 1), steps

    # -- the epoch -------------------------------------------------------------------------
    def run_epoch(self) -> dict[str, float]:
        """Alg. 1, one epoch: synthesise, grow the pool, re-weight, distil. Returns its stats
        (``cache_time``: the client models' logits on the epoch's new pool images, when
        cached)."""
        start = time.perf_counter()
        self.capped = []
        result = synthesize(
            self.models,
            self.weights,
            self.student,
            self.synthesis,
            num_classes=self.num_classes,
            image_shape=self.image_shape,
            rng=self.rng,
            device=self.device,
            generator=self.generator,
            nz=self.nz,
            sample_weights=self.sample_weights,
            teacher_norm=self.teacher_norm,
            progress=f"data-free synthesis, epoch {self.epoch + 1}",
        )
        synth_time = time.perf_counter() - start
        start = time.perf_counter()
        weight_steps = 0
        if self.boost.reweight and self.boost.order == "code" and self.epoch > 0:
            weight_steps = self.reweight_pass(diversified=False)
        start_pool = len(self.pool)
        self.pool.add(result.images, result.labels)
        cache_start = time.perf_counter()
        self._cache_pool(start_pool)
        cache_time = time.perf_counter() - cache_start
        if self.boost.reweight and self.boost.order == "paper":
            weight_steps = self.reweight_pass(diversified=True)
        weight_time = time.perf_counter() - start - cache_time
        start = time.perf_counter()
        kd, kd_steps = self.distill_pass()
        self.scheduler.step()
        kd_time = time.perf_counter() - start
        self.epoch += 1
        stats = {
            "epoch": float(self.epoch),
            "pool_size": float(len(self.pool)),
            "synthesis_loss": result.best_loss,
            "synthesis_time": synth_time,
            "weight_steps": float(weight_steps),
            "weight_time": weight_time,
            "cache_time": cache_time,
            "distill_loss": kd,
            "distill_steps": float(kd_steps),
            "distill_time": kd_time,
        }
        stats.update({f"synthesis_{k}": v for k, v in result.terms.items()})
        return stats

    def _cache_pool(self, start: int) -> None:
        """The members' logits on the pool's samples from ``start`` on (in batches of
        ``boost.batch_size``), when the engine caches them."""
        if self.pool_logits is None:
            return
        for x in self.pool.inputs(start, self.boost.batch_size):
            self.pool_logits.add(x)

    # -- resume ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "weights": self.weights.clone(),
            "pool": self.pool.state_dict(),
            "student": {k: v.detach().cpu().clone() for k, v in self.student.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "generator": None
            if self.generator is None
            else {k: v.detach().cpu().clone() for k, v in self.generator.state_dict().items()},
            "rng": self.rng.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.weights = torch.as_tensor(state["weights"], dtype=torch.float32).clone()
        self.pool.load_state_dict(state["pool"])
        if self.pool_logits is not None:
            self.pool_logits.clear()
            self._cache_pool(0)
        self.student.load_state_dict(state["student"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.generator is not None and state.get("generator") is not None:
            self.generator.load_state_dict(state["generator"])
        self.rng.set_state(state["rng"])
