"""CPFL's cohorts and their stage 1, a part :class:`strategies.cpfl.CPFL` owns as ``self.cohorts``.

Dhasade et al., EuroMLSys 2025 (Alg. 1 lines 2-8; :mod:`strategies.cpfl`). :class:`CohortRounds`
holds a run's cohorts: the split of the clients (Sec. 3, step 1), their device profiles and the
label counts of their training splits, and per cohort its model, clock, stopping rule and teacher
snapshots (:class:`~fedgo_flwr.learning.cohorts.Cohort`), with the uploads to the global server.
A round of stage 1 is three calls: :meth:`~CohortRounds.plan` picks each running cohort's
participants (``fraction`` of its members, a seeded draw per cohort and round), unless the round
would end after the distillation time; :meth:`~CohortRounds.absorb` checks a member's reply (its
validation report: :meth:`~CohortRounds.val_problem`), folds it into its cohort's average and
keeps its validation loss; :meth:`~CohortRounds.close` advances each cohort's clock by its slowest
participant (:mod:`fedgo_flwr.learning.systems`), shows its stopping rule the round's robust loss
(:func:`fedgo_flwr.learning.cohorts.cohort_loss`) and returns the round's row of every cohort.
The pure bookkeeping (deadline, totals, teacher snapshots) is :mod:`fedgo_flwr.learning.cohorts`'.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.supercore import log

from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.data.partition import Partition
from fedgo_flwr.learning.aggregation import AggregationConfig, clip_update
from fedgo_flwr.learning.clipping import round_average
from fedgo_flwr.learning.cohorts import (
    CONVERGED,
    EMPTY,
    PAUSED,
    Cohort,
    PlateauStopper,
    batches_per_epoch,
    class_cohorts,
    cohort_loss,
    cohort_totals,
    distill_deadline,
    distill_start,
    holdout_size,
    holdout_split,
    prune_history,
    random_cohorts,
)
from fedgo_flwr.learning.systems import (
    DeviceProfile,
    SimClock,
    load_profiles,
    round_seconds,
    synthetic_profiles,
)
from fedgo_flwr.learning.task import sample_clients
from fedgo_flwr.runtime.rng import derive_seed
from strategies.base import Reply, ReplyRejected


class CohortRounds:
    """The cohorts of a CPFL run (``all``, in cohort order) and their stage 1.

    ``cfg``: the experiment; ``params``: CPFL's ``Config``; ``partition`` and ``train``: the
    server's partition and training set; ``aggregation``: ``strategy.aggregation`` (each
    cohort's average: its rule and the clipping of a member's update). The split (``groups``,
    ``cohort_of``), the device ``profiles``, each client's training-split size
    (``client_sizes``, the n_k of the average and the clock) and label counts come from the
    configuration alone; the cohorts' models and clocks are made by :meth:`new` (a fresh run)
    or :meth:`load_state_dict` (a resumed one).
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        params: Any,
        partition: Partition,
        train: ArrayDataset,
        aggregation: AggregationConfig,
    ) -> None:
        self.cfg, self.params, self.aggregation = cfg, params, aggregation
        p, k = params, cfg.data.num_clients
        self.partition_sizes = list(partition.client_sizes)
        # n_k and the clock use each client's training split (its data less the validation part).
        self.client_sizes = [
            size - holdout_size(size, p.val_fraction, p.min_val_samples)
            for size in partition.client_sizes
        ]
        hist = partition.histogram(train.y, train.num_classes).astype(np.int64)
        self.num_classes = train.num_classes
        # Label counts of each client's training split (what its cohort reports, step 3).
        self.class_counts = np.zeros_like(hist)
        for pid, idx in enumerate(partition.clients):
            kept, _ = holdout_split(len(idx), p.val_fraction, p.min_val_samples, cfg.seed, pid)
            self.class_counts[pid] = np.bincount(train.y[idx[kept]], minlength=self.num_classes)
        if p.grouping == "class":  # one cohort per class (preflight checked the count)
            self.groups = class_cohorts(hist)
        else:
            self.groups = random_cohorts(k, p.cohorts, cfg.seed)
        self.cohort_of = {pid: i for i, g in enumerate(self.groups) for pid in g}
        self.profiles: list[DeviceProfile] = (
            load_profiles(p.profiles, k)
            if p.profiles is not None
            else synthetic_profiles(k, derive_seed(cfg.seed, "cpfl-profiles") % 2**32)
        )
        self.all: list[Cohort] = []
        self.model_bytes = 0
        self.upload_clock = SimClock()  # cohort models and label counts to the global server
        self.round_plan: dict[int, list[int]] = {}  # cohort index -> this round's participants
        self.averages: dict[int, Any] = {}  # cohort index -> this round's average
        self.losses: dict[int, list[tuple[int, float]]] = {}  # ... -> (member, val_loss)

    # -- state -----------------------------------------------------------------------------
    def new(self, arrays: dict[str, np.ndarray]) -> None:
        """The cohorts of a fresh run, each starting from ``arrays`` (the initial model); a
        cohort without clients is ``empty`` and left out (a WARNING says so)."""
        p = self.params
        self.model_bytes = int(sum(a.nbytes for a in arrays.values()))
        self.all = []
        for i, members in enumerate(self.groups):
            counts = (
                self.class_counts[members].sum(axis=0)
                if members
                else np.zeros(self.num_classes, dtype=np.int64)
            )
            c = Cohort(
                index=i,
                members=list(members),
                counts=counts,
                arrays=arrays,
                stopper=PlateauStopper(p.window, p.patience),
            )
            if not members:
                c.status = EMPTY
                log(WARNING, "CPFL: cohort %d has no clients; it is left out", i)
            if p.distill_when < 1:
                c.history.append((0.0, arrays))
            self.all.append(c)

    def state_dict(self) -> dict[str, Any]:
        """The cohorts (models, best models, clocks, stopping rules, snapshots), the model's
        size in bytes and the uploads' clock, for a checkpoint."""
        return {
            "cohorts": [
                {
                    "arrays": c.arrays,
                    "best": c.best,
                    "best_round": c.best_round,
                    "status": c.status,
                    "rounds": c.rounds,
                    "updates": c.updates,
                    "finish_seconds": c.finish_seconds,
                    "stopper": c.stopper.state(),
                    "clock": c.clock.state(),
                    "history": [[t, a] for t, a in c.history],
                    "trace": [list(t) for t in c.trace],
                }
                for c in self.all
            ],
            "model_bytes": self.model_bytes,
            "upload_clock": self.upload_clock.state(),
        }

    def state_problem(
        self, state: Mapping[str, Any], model_problem: Callable[[Any, str], str | None]
    ) -> str | None:
        """Why ``state`` cannot hold these cohorts: one saved cohort per cohort of the
        configuration, each model (the cohort's, its best, those of its history) one that
        ``model_problem(arrays, what)`` accepts; ``None`` if it can."""
        saved = state.get("cohorts")
        if not isinstance(saved, list) or len(saved) != len(self.groups):
            found = len(saved) if isinstance(saved, list) else type(saved).__name__
            return f"'strategy_state.cohorts': {found} cohorts, the config has {len(self.groups)}"
        for i, s in enumerate(saved):
            where = f"'strategy_state.cohorts[{i}]"
            if not isinstance(s, Mapping):
                return f"{where}': not a dict"
            models = [(f"{where}.arrays'", s.get("arrays"))]
            if s.get("best") is not None:
                models.append((f"{where}.best'", s["best"]))
            history = s.get("history") or []
            if not isinstance(history, list):
                return f"{where}.history': not a list"
            for j, entry in enumerate(history):
                arrays = entry[1] if isinstance(entry, list | tuple) and len(entry) == 2 else None
                models.append((f"{where}.history[{j}]'", arrays))
            for what, arrays in models:
                problem = model_problem(arrays, what)
                if problem:
                    return problem
        return None

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        saved = state["cohorts"]
        if len(saved) != len(self.groups):
            raise ValueError(f"checkpoint has {len(saved)} cohorts, the config {len(self.groups)}")
        self.new({})
        for c, s in zip(self.all, saved, strict=True):
            c.arrays = dict(s["arrays"])
            c.best = None if s["best"] is None else dict(s["best"])
            c.best_round = s["best_round"]
            c.status = str(s["status"])
            c.rounds = int(s["rounds"])
            c.updates = int(s["updates"])
            c.finish_seconds = s["finish_seconds"]
            c.stopper = PlateauStopper.from_state(s["stopper"])
            c.clock = SimClock.from_state(s["clock"])
            c.history = [(float(t), dict(a)) for t, a in s["history"]]
            c.trace = [(float(a), float(b), int(d), int(u)) for a, b, d, u in s["trace"]]
        self.model_bytes = int(state["model_bytes"])
        self.upload_clock = SimClock.from_state(state["upload_clock"])

    # -- time ------------------------------------------------------------------------------
    def deadline(self) -> float | None:
        """The simulated time stage 2 starts at, as far as known (``None``: not yet;
        :func:`fedgo_flwr.learning.cohorts.distill_deadline`)."""
        p = self.params
        return distill_deadline(self.all, p.distill_when, p.distill_at_hours)

    def distill_time(self) -> float:
        """The simulated time stage 2 starts: the deadline if one applied, else the last
        cohort's finish."""
        return distill_start(self.all, self.deadline())

    def totals(self) -> SimClock:
        """The cohorts side by side (time: the furthest clock) plus the uploads to the server.

        Once a deadline applies (``distill_when`` < 1, ``distill_at_hours``), each cohort counts
        as of it: rounds that ended after it (run before it was known) are not counted.
        """
        return cohort_totals(self.all, self.deadline(), self.upload_clock)

    # -- a round ---------------------------------------------------------------------------
    def participants(self, server_round: int, cohort: Cohort) -> list[int]:
        """The cohort's clients trained in ``server_round``: ``fraction`` of its members
        (at least ``min_clients``), a seeded draw per (seed, cohort, round)."""
        members = cohort.members
        m = max(self.cfg.min_clients, int(self.cfg.fraction * len(members) + 1e-9))
        if m >= len(members):
            return list(members)
        seed = derive_seed(self.cfg.seed, "cpfl-cohort", cohort.index)
        picks = sample_clients(seed, server_round, len(members), m)
        return [members[i] for i in picks]

    def round_cost(
        self, cohort: Cohort, pids: list[int]
    ) -> tuple[list[DeviceProfile], list[int], int]:
        """Profiles, mini-batches and bytes each way of each participant of a cohort round."""
        t = self.cfg.train
        batches = [
            t.local_epochs * batches_per_epoch(self.client_sizes[p], t.batch_size) for p in pids
        ]
        transfer = 0 if len(cohort.members) == 1 else self.model_bytes
        return [self.profiles[p] for p in pids], batches, transfer

    def plan(self, server_round: int) -> dict[int, list[int]]:
        """The round's participants of each running cohort (cohort index -> partition ids, in
        cohort order). A cohort whose round would end after the distillation time is paused
        instead (its clock stops there) and runs no more."""
        deadline = self.deadline()
        self.round_plan = {}
        for c in self.all:
            if not c.running:
                continue
            pids = self.participants(server_round, c)
            profiles, batches, transfer = self.round_cost(c, pids)
            duration = round_seconds(profiles, batches, transfer, transfer)
            if deadline is not None and c.clock.seconds + duration > deadline + 1e-9:
                c.status, c.finish_seconds = PAUSED, c.clock.seconds
                log(
                    INFO,
                    "CPFL: cohort %d paused at %.2f h (distillation time)",
                    c.index,
                    c.clock.hours,
                )
                continue
            self.round_plan[c.index] = pids
        return self.round_plan

    def model_of(self, pid: int) -> dict[str, np.ndarray]:
        """The model client ``pid`` was sent: its cohort's (its update is bounded against it)."""
        return self.all[self.cohort_of[pid]].arrays

    def val_problem(self, reply: Reply) -> str | None:
        """Why a reply's validation report is unusable: a client with a validation split must
        report a finite ``val_loss >= 0`` (a number, not a bool) and its split's size; a client
        without one must send no ``val_loss``.

        A client without a split that sends a ``val_loss`` has its whole reply dropped, not the
        loss ignored: an honest client derives its split from the same config and seed as the
        server (``clients/cpfl.py`` reports a loss only with a split), so the reply is off the
        protocol, as one with a wrong ``val_examples`` is (dropped too), and its model update
        comes from a client known to misreport.
        """
        p = self.params
        size = self.partition_sizes[reply.partition_id]
        expected = holdout_size(size, p.val_fraction, p.min_val_samples)
        if not expected:
            if "val_loss" in reply.metrics:
                return "metric 'val_loss' sent, but the client has no validation split"
            return None
        loss, count = reply.metrics.get("val_loss"), reply.metrics.get("val_examples")
        if (
            isinstance(loss, bool)
            or not isinstance(loss, (int, float))
            or not math.isfinite(loss)
            or loss < 0
        ):
            return f"metric 'val_loss' is {loss!r}, not a finite number >= 0"
        if count != expected:
            return f"val_examples {count!r}, but the client's validation split has {expected}"
        return None

    def begin_round(self, server_round: int) -> None:
        """Reset what :meth:`absorb` accumulates: per cohort of the round's :meth:`plan`, its
        average (each member's update clipped relative to its cohort's round, ``clip_factor``,
        :class:`~fedgo_flwr.learning.clipping.ClippedMean`) and its members' validation
        losses."""
        self.averages = {
            i: round_average(
                self.aggregation, self.all[i].arrays, f"Round {server_round}, cohort {i}"
            )
            for i in self.round_plan
        }
        self.losses = {i: [] for i in self.round_plan}

    def absorb(self, server_round: int, reply: Reply) -> None:
        """Fold a member's accepted reply into its cohort's average (its update clipped to
        ``aggregation.clip_norm`` against the cohort's model) and keep its validation loss; a
        reply whose validation report is unusable (:meth:`val_problem`) is dropped
        (:class:`~strategies.base.ReplyRejected`, before anything changes)."""
        problem = self.val_problem(reply)
        if problem is not None:
            raise ReplyRejected(problem)
        c = self.all[self.cohort_of[reply.partition_id]]
        arrays = reply.arrays
        if self.aggregation.clip_norm is not None:
            arrays, _ = clip_update(arrays, c.arrays, self.aggregation.clip_norm)
        self.averages[c.index].add(arrays, reply.num_examples, reply.partition_id)
        if "val_loss" in reply.metrics:
            self.losses[c.index].append((reply.partition_id, float(reply.metrics["val_loss"])))

    def close(self, server_round: int, accepted: list[Reply]) -> list[dict[str, Any]]:
        """End the round of every cohort of the :meth:`plan`, given the round's ``accepted``
        replies: its clock advances by the round, its model becomes its members' average (kept
        if none of them is usable), its stopping rule sees the round's loss (converged: its
        finish time is now) and its teacher snapshots are kept as ``distill_when`` needs them.
        Returns each cohort's row of the round's ``cohorts`` metric."""
        p = self.params
        active = [self.all[i] for i in self.round_plan]
        got_of: dict[int, list[Reply]] = {c.index: [] for c in active}
        for reply in accepted:
            got_of[self.cohort_of[reply.partition_id]].append(reply)
        rows = []
        for c in active:
            pids = self.round_plan[c.index]
            profiles, batches, transfer = self.round_cost(c, pids)
            seconds = c.clock.add_round(profiles, batches, transfer, transfer)
            k = c.clock
            c.trace.append((k.seconds, k.cpu_seconds, k.bytes_down, k.bytes_up))
            c.rounds += 1
            got = got_of[c.index]
            sent = c.arrays
            if len(got) >= min(self.cfg.min_clients, len(pids)) and got:
                c.arrays = self.averages[c.index].result()
                c.updates += len(got)
            else:
                log(
                    WARNING,
                    "Round %d: cohort %d has no usable reply; it keeps its model",
                    server_round,
                    c.index,
                )
            reported = self.losses[c.index]
            val, clipped = cohort_loss([v for _, v in reported], p.loss_reduce, p.loss_bound)
            if clipped:
                log(
                    WARNING,
                    "Round %d: cohort %d clips the validation loss of client(s) %s to "
                    "strategy.loss_bound (%g) x the cohort's median of the round",
                    server_round,
                    c.index,
                    ", ".join(str(reported[i][0]) for i in clipped),
                    p.loss_bound,
                )
            if c.stopper.observe(val):
                c.best, c.best_round = sent, server_round
                if p.teacher == "best" and p.distill_when < 1:
                    c.history.append((c.clock.seconds, sent))
            if p.teacher == "last" and p.distill_when < 1:
                c.history.append((c.clock.seconds, c.arrays))
            if c.stopper.stopped:
                c.status, c.finish_seconds = CONVERGED, c.clock.seconds
                log(
                    INFO,
                    "CPFL: cohort %d converged in round %d at %.2f simulated hours",
                    c.index,
                    server_round,
                    c.clock.hours,
                )
            rows.append(
                {
                    "cohort": c.index,
                    "clients_sampled": len(pids),
                    "clients_replied": len(got),
                    "val_loss": val,
                    "val_loss_smoothed": c.stopper.smoothed,
                    "round_seconds": seconds,
                    "sim_hours": c.clock.hours,
                    "status": c.status,
                }
            )
        # Drop teacher snapshots that can no longer be the one at the distillation time.
        prune_history(self.all, p.distill_when)
        return rows

    def evaluate(
        self,
        server_round: int,
        rows: list[dict[str, Any]],
        accuracy: Callable[[dict[str, np.ndarray]], float],
    ) -> float | None:
        """The test ``accuracy`` of the models of the cohorts in ``rows``, written into each
        row (every ``cohort_eval_every`` rounds, n > 1); their mean, or ``None``."""
        every = self.params.cohort_eval_every
        if len(self.all) == 1 or not every or server_round % every or not rows:
            return None
        for row in rows:
            row["test_accuracy"] = accuracy(self.all[row["cohort"]].arrays)
        return float(np.mean([row["test_accuracy"] for row in rows]))
