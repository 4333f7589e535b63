"""CPFL: cohort-parallel federated learning, unified by distillation.

Dhasade, Kermarrec, Nguyen, Pires, de Vos, "Harnessing Increased Client Participation with
Cohort-Parallel Federated Learning", EuroMLSys 2025 (paper 003, Alg. 1; the authors' code is
github.com/sacs-epfl/cpfl). The K clients are split into ``cohorts`` (n) disjoint cohorts
(Sec. 3, step 1). **Stage 1:** every cohort runs its own federated training (FedAvg by default,
``local_algorithm`` names another averaging client algorithm) on its own model, until its own
stopping rule fires (moving average of its clients' validation losses, patience on the minimum;
:class:`fedgo_flwr.learning.cohorts.PlateauStopper`). All running cohorts advance together: one
round of this strategy sends every running cohort's model to that cohort's sampled clients
(``fraction`` of its members; the paper: all of them), so the simulation engine trains them
concurrently; a stopped cohort sends nothing. **Stage 2:** the global server distils the cohorts'
models (each cohort's best checkpoint, lowest smoothed validation loss; ``teacher: last`` for the
last) into a fresh student on unlabeled public data, towards ``z~_c = sum_i p_ic z_ic`` with
per-class label weights, L1 loss on logits, Adam (Sec. 3 eqs. 2-3, Sec. 4.1;
:func:`fedgo_flwr.learning.cohorts.distill_l1`). ``cohorts: 1`` is FedAvg with early stopping and no
distillation (the student is the cohort's teacher); ``cohorts: K`` is one-shot FedKD.

The public set is the server's unlabeled share of the training data (``data.server_fraction``)
or, with ``data.public_path``, a folder of images (the paper: STL-10's unlabeled split for
CIFAR-10). Label counts per cohort (step 3) are the server's count of its clients' training
splits (the partition is derived from the config on both sides, as for n_k everywhere).

**Simulated time, CPU-hours, bytes** (Sec. 4.1/4.2, App. B.4; :mod:`fedgo_flwr.learning.systems`):
each client has a device profile (``profiles``: a CSV, or a seeded synthetic population over the
FedScale ranges). A cohort round lasts its slowest participant's download + local training
(``local_epochs`` x its mini-batches x its seconds per batch) + upload; a cohort's time is the
sum of its rounds; time to convergence is the last cohort's finish (distillation excluded and
reported as measured wall time, ``distill_time_s``); CPU-hours sum every participant's
compute; bytes count the model both ways per participant and round, plus each cohort's model
and label counts uploaded to the global server once. A cohort of one client trains locally
without transfers (it is its own cohort server: "at n=200 the only traffic is uploading each
client's model to the global server", App. B.4). Clients that fail a round still count (they
were sent work).

**Beyond the paper** (its future-work suggestion, Sec. 5): ``distill_when: q`` starts stage 2
once a fraction q of the cohorts has converged, at simulated time T_q (the time the
ceil(q n)-th cohort finished), every other cohort taking part with its best model as of T_q;
``distill_at_hours: T`` distils whatever the cohorts hold at simulated time T (the paper's
fixed-time comparison, Sec. 4.2). A cohort never starts a round that would end after the
distillation time.

**Untrusted members** (beyond the paper). A member's ``val_loss`` must be a finite number
``>= 0`` (and be absent for a client without a validation split), else its reply is dropped
with a warning; the round's signal is the median of the members' losses (``loss_reduce``;
the paper's ``mean`` and ``trimmed_mean`` are options) after clipping any above
``loss_bound`` x the cohort's median of the round (a WARNING names the member;
:func:`fedgo_flwr.learning.cohorts.cohort_loss`), so that one member of a cohort of three or
more can stop it early with no loss it reports (it can delay the stop: the signal is then
the other members' median).

**Failures.** A cohort whose clients all fail in a round keeps its model (the round counts as
one without improvement); a cohort that never got a usable reply is reported and left out of
distillation, and the run finishes with the others.

Per round ``metrics.jsonl`` has, besides the usual counts, ``sim_hours`` (the furthest cohort
clock), ``cpu_hours``, ``bytes_total``, ``cohorts_running`` and ``cohorts``: per cohort that
trained, its clock, raw and smoothed validation loss, status and (every ``cohort_eval_every``
rounds, n > 1) test accuracy. The top-level ``test_accuracy`` is the model's for n = 1 and the
student's in the last round (stage 1 of n > 1 has no single model). ``summary.json`` adds
:meth:`CPFL.report`.

**Where the parts are.** This module holds :class:`CPFL` (the cohorts' set-up, state and the
rows of the run) and its ``Config``; stage 1 is :class:`strategies._cpfl_rounds.CohortRounds`,
stage 2 with FedGO's odds :class:`strategies._cpfl_distill.CohortDistillation`, and the pure
math and bookkeeping (cohort split, stopping rule, :class:`~fedgo_flwr.learning.cohorts.Cohort`,
deadlines, teacher weights, L1 distillation) :mod:`fedgo_flwr.learning.cohorts`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp import Grid
from flwr.supercore import log

from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.config.schema import Checker, build_section
from fedgo_flwr.gan.settings import DiscriminatorConfig, GeneratorConfig
from fedgo_flwr.learning.cohorts import (
    EMPTY,
    GROUPINGS,
    LOSS_BOUND,
    LOSS_REDUCES,
    MAX_ROUNDS,
    TEACHERS,
    Cohort,
    CohortDistillConfig,
    PlateauStopper,
    class_cohorts,
    holdout_size,
    holdout_split,
    mean_sd,
    random_cohorts,
)
from fedgo_flwr.learning.systems import (
    DeviceProfile,
    ProfileError,
    SimClock,
    load_profiles,
    synthetic_profiles,
)
from fedgo_flwr.learning.task import load_bundle
from fedgo_flwr.protocol.cpfl import CohortClientConfig, local_declaration
from fedgo_flwr.runtime.messages import stream_replies, to_numpy, to_record
from fedgo_flwr.runtime.rng import derive_seed
from fedgo_flwr.runtime.shutdown import raise_if_stopping
from strategies._cpfl_distill import CohortDistillation
from strategies._cpfl_rounds import CohortRounds
from strategies._prefl import check_generator
from strategies.base import BaseConfig, Row, Strategy


@dataclass
class CPFLConfig(BaseConfig, CohortClientConfig):
    """CPFL's parameters, ``strategy.<key>`` (defaults: the paper's CIFAR-10 setting, Sec. 4.1).

    ``fraction`` (core) is each cohort's participation rate per round (paper: 1.0) and
    ``rounds`` (core) the most rounds a cohort may run. ``loss_reduce`` and ``loss_bound``
    make a round's validation signal out of the members' losses (beyond the paper: their
    median by default, the paper's ``mean`` as an option; each loss above ``loss_bound`` x the
    cohort's median of the round clipped to it; null: no bound;
    :func:`fedgo_flwr.learning.cohorts.cohort_loss`).
    """

    cohorts: int = 4
    """Number of cohorts n (1: FedAvg with early stopping; ``data.num_clients``: one-shot FedKD,
    every client a cohort)."""
    grouping: str = "random"
    """``random`` (seeded, near-equal sizes) or ``class`` (one cohort per dominant class;
    ``cohorts`` must equal the number of classes)."""
    window: int = 20
    """Rounds of the moving average of a cohort's mean validation loss."""
    patience: int = 50
    """A cohort stops once its smoothed validation loss has not reached a new minimum for this many
    rounds."""
    loss_reduce: str = "median"
    loss_bound: float | None = LOSS_BOUND
    teacher: str = "best"
    """A cohort's teacher: the model with the lowest smoothed loss (``best``) or its ``last``."""
    distill_when: float = 1.0
    """Distil once this share of the cohorts has converged (the rest at their best as of then)."""
    distill_at_hours: float | None = None
    """Or distil at this simulated time (hours)."""
    cohort_eval_every: int = 1
    """Test accuracy of each cohort that trained, every N rounds (0: only the teachers at the
    end)."""
    teacher_test_size: int | None = None
    """Evaluate the teachers and their ensemble on a stratified subset of this many test images (the
    student always on all); ``null``: all."""
    profiles: str | None = None
    """Device profiles: a CSV ``client_id,seconds_per_batch,bytes_per_second``, one row per client;
    ``null``: a seeded synthetic population, log-uniform over 0.9-11.9 s per mini-batch and 130
    KB/s-26 MB/s."""
    distill: CohortDistillConfig = field(default_factory=CohortDistillConfig)
    # distill.weights: fedgo (beyond the paper): FedGO's generator and client discriminators
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    discriminator: DiscriminatorConfig = field(default_factory=DiscriminatorConfig)

    def check(self, c: Checker) -> None:
        CohortClientConfig.check(self, c)
        c.require("cohorts", self.cohorts >= 1, "must be >= 1")
        c.choice("grouping", GROUPINGS)
        c.require("window", self.window >= 1, "must be >= 1")
        c.require("patience", self.patience >= 1, "must be >= 1")
        c.choice("loss_reduce", LOSS_REDUCES)
        if self.loss_bound is not None:
            c.require("loss_bound", self.loss_bound > 1, "must be > 1 (or null: no bound)")
        c.choice("teacher", TEACHERS)
        c.require("distill_when", 0 < self.distill_when <= 1, "must be in (0, 1]")
        if self.distill_at_hours is not None:
            c.require("distill_at_hours", self.distill_at_hours > 0, "must be > 0 (or null)")
        c.require("cohort_eval_every", self.cohort_eval_every >= 0, "must be >= 0 (0: never)")
        if self.teacher_test_size is not None:
            c.require("teacher_test_size", self.teacher_test_size >= 1, "must be >= 1 (or null)")
        try:
            local = local_declaration(self.local_algorithm)
        except ValueError as exc:
            c.fail("local_algorithm", str(exc))
        self.local_params = dataclasses.asdict(
            build_section(
                local.Config,
                self.local_params,
                f"{c.prefix}local_params.",
                owner=local.name,
                checker=c,
            )
        )


class CPFL(CohortRounds, CohortDistillation, Strategy):
    """Cohorts trained in parallel to convergence, then distilled into one model (Alg. 1)."""

    name = "cpfl"
    rolls_back = False  # rows are cohort rounds and stage 2, not rounds of one global model
    client_algorithm = "cpfl"
    Config = CPFLConfig
    uses_public_data = True

    @classmethod
    def check_config(cls, config: Any, c: Checker, cfg: ExperimentConfig | None = None) -> None:
        super().check_config(config, c, cfg)
        if cfg is not None:
            k = cfg.data.num_clients
            c.require(
                "cohorts",
                config.cohorts <= k,
                f"more cohorts than clients (data.num_clients = {k})",
            )

    @classmethod
    def preflight(cls, cfg: ExperimentConfig, c: Checker) -> None:
        super().preflight(cfg, c)
        check_generator(cfg, c)  # strategy.generator.module
        p: CPFLConfig = cfg.strategy.params
        s = c.at("strategy.", p)
        if p.profiles is not None:
            try:
                load_profiles(p.profiles, cfg.data.num_clients)
            except ProfileError as exc:
                s.fail("profiles", str(exc))
        if p.grouping == "class":
            classes = load_bundle(cfg.data).train.num_classes
            s.require(
                "cohorts",
                p.cohorts == classes,
                f"grouping 'class' makes one cohort per class: set it to {classes}",
            )
        if p.cohorts > 1 and cfg.data.public_path is None:
            c.at("data.", cfg.data).require(
                "server_fraction",
                cfg.data.server_fraction > 0,
                "CPFL with more than one cohort distils on the server's unlabeled share: "
                "make it > 0, or set data.public_path",
            )

    def __init__(self, cfg: ExperimentConfig, node_ids, model, resources=None) -> None:
        super().__init__(cfg, node_ids, model, resources)
        p: CPFLConfig = self.params
        k = cfg.data.num_clients
        if resources is None:
            raise ValueError("CPFL needs the server's resources (data, partition)")
        part, train = resources.partition, resources.bundle.train
        # n_k and the clock use each client's training split (its data less the validation part).
        self.client_sizes = [
            size - holdout_size(size, p.val_fraction, p.min_val_samples)
            for size in part.client_sizes
        ]
        self.intake.client_sizes = self.client_sizes  # a reply's num-examples must be these
        hist = part.histogram(train.y, train.num_classes).astype(np.int64)
        self.num_classes = train.num_classes
        # Label counts of each client's training split (what its cohort reports, step 3).
        self.class_counts = np.zeros_like(hist)
        for pid, idx in enumerate(part.clients):
            kept, _ = holdout_split(len(idx), p.val_fraction, p.min_val_samples, cfg.seed, pid)
            self.class_counts[pid] = np.bincount(train.y[idx[kept]], minlength=self.num_classes)
        if p.grouping == "class":  # one cohort per class (preflight checked the count)
            groups = class_cohorts(hist)
        else:
            groups = random_cohorts(k, p.cohorts, cfg.seed)
        self.groups = groups
        self.cohort_of = {pid: i for i, g in enumerate(groups) for pid in g}
        self.profiles: list[DeviceProfile] = (
            load_profiles(p.profiles, k)
            if p.profiles is not None
            else synthetic_profiles(k, derive_seed(cfg.seed, "cpfl-profiles") % 2**32)
        )
        self.cohorts: list[Cohort] = []
        self.finished = False
        self.final: dict[str, Any] = {}
        self.model_bytes = 0
        self.upload_clock = SimClock()  # cohort models and label counts to the global server
        self.discriminators: dict[int, torch.nn.Module] = {}  # distill.weights: fedgo

    @classmethod
    def ensemble_teachers(cls, cfg: ExperimentConfig) -> int | None:
        """With ``distill.weights: fedgo`` every client's discriminator weighs stage 2's
        ensemble (the members' odds are share-capped); otherwise no share cap applies."""
        return cfg.data.num_clients if cfg.strategy.params.distill.weights == "fedgo" else None

    def summary(self) -> None:
        sizes = [len(g) for g in self.groups]
        log(INFO, "\t├──> CPFL, params %s", self.params)
        log(
            INFO,
            "\t└──> %d cohorts (%s) of %s clients; %.0f%% participation per cohort round",
            len(self.groups),
            self.params.grouping,
            f"{min(sizes)}-{max(sizes)}" if min(sizes) != max(sizes) else sizes[0],
            100 * self.cfg.fraction,
        )

    # -- state -----------------------------------------------------------------------------
    def _new_cohorts(self, arrays: dict[str, np.ndarray]) -> None:
        p: CPFLConfig = self.params
        self.model_bytes = int(sum(a.nbytes for a in arrays.values()))
        self.cohorts = []
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
            self.cohorts.append(c)

    def state_dict(self) -> dict[str, Any]:
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
                for c in self.cohorts
            ],
            "finished": self.finished,
            "final": self.final,
            "model_bytes": self.model_bytes,
            "upload_clock": self.upload_clock.state(),
        }

    def state_problem(self, state: Mapping[str, Any], server_round: int) -> str | None:
        """One saved cohort per cohort of the configuration, each model (the cohort's, its best,
        those of its history) a model of ``model.name``."""
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
                problem = self.model_problem(arrays, what)
                if problem:
                    return problem
        return None

    def load_state_dict(self, state) -> None:
        saved = state["cohorts"]
        if len(saved) != len(self.groups):
            raise ValueError(f"checkpoint has {len(saved)} cohorts, the config {len(self.groups)}")
        self._new_cohorts({})
        for c, s in zip(self.cohorts, saved, strict=True):
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
        self.finished = bool(state["finished"])
        self.final = dict(state["final"])
        self.model_bytes = int(state["model_bytes"])
        self.upload_clock = SimClock.from_state(state["upload_clock"])

    # -- the round loop (Strategy.start) -----------------------------------------------------
    def plan(self, first_round: int, num_rounds: int) -> str:
        return f"rounds {first_round}..{num_rounds} at most"

    def begin_run(self, initial_arrays: ArrayRecord) -> bool:
        """The cohorts of a fresh run (a resumed one loaded its own); nothing to do if the run
        was resumed after stage 2 (its student is the checkpoint's model)."""
        if not self.cohorts:
            self._new_cohorts(to_numpy(initial_arrays))
        return not self.finished

    def run_row(
        self, row: int, grid: Grid, arrays: ArrayRecord, config: ConfigRecord, timeout: float
    ) -> Row:
        """Stage 1: one round of every running cohort; stage 2 once every cohort has stopped
        (or in round ``rounds``). The row's model is the student after stage 2, the cohort's
        for one cohort, none before (the checkpoint keeps the initial model then)."""
        messages = self.configure_cohorts(row, config)
        if messages:
            self.aggregate_cohorts(row, stream_replies(grid, messages, timeout))
        else:
            self.last_round = {"clients_sampled": 0, "clients_replied": 0}
        raise_if_stopping(f"round {row}")
        if row == self.num_rounds:
            for c in self.cohorts:
                if c.running:
                    c.status = MAX_ROUNDS
                    c.finish_seconds = c.clock.seconds
        if not any(c.running for c in self.cohorts):
            return Row(arrays=to_record(self.stage_two(row)), finished=self.finished)
        if len(self.cohorts) == 1:
            model = to_record(self.cohorts[0].arrays)
            return Row(evaluated=model, checkpoint=model)
        return Row(evaluated=ArrayRecord())

    def report(self) -> dict[str, Any]:
        """CPFL's part of ``summary.json``: simulated time, CPU-hours, bytes, per-cohort
        finish times and rounds, teacher and student accuracy."""
        total = self.totals()
        accs = self.final.get("teacher_accuracies", [])
        mean, sd = mean_sd(accs)
        return {
            "cohorts": len(self.cohorts),
            "sim_time_to_convergence_h": self.distill_time() / 3600.0,
            "cpu_hours": total.cpu_hours,
            "bytes_total": total.bytes_total,
            "bytes_down": total.bytes_down,
            "bytes_up": total.bytes_up,
            "model_bytes": self.model_bytes,
            "cohort_sizes": [len(c.members) for c in self.cohorts],
            "cohort_finish_h": [
                None if c.finish_seconds is None else c.finish_seconds / 3600.0
                for c in self.cohorts
            ],
            "cohort_rounds": [c.rounds for c in self.cohorts],
            "cohort_status": [c.status for c in self.cohorts],
            "cohort_best_round": [c.best_round for c in self.cohorts],
            "teacher_accuracy_mean": mean,
            "teacher_accuracy_sd": sd,
            **self.final,
        }
