"""CPFL: cohort-parallel federated learning, unified by distillation.

Dhasade, Kermarrec, Nguyen, Pires, de Vos, "Harnessing Increased Client Participation with
Cohort-Parallel Federated Learning", EuroMLSys 2025 (paper 003, Alg. 1; the authors' code is
github.com/sacs-epfl/cpfl). The K clients are split into ``cohorts`` (n) disjoint cohorts
(Sec. 3, step 1). **Stage 1:** every cohort runs its own federated training (FedAvg by default,
``local_algorithm`` names another averaging client algorithm) on its own model, until its own
stopping rule fires (moving average of its clients' validation losses, patience on the minimum;
:class:`fedgo_flwr.learning.cohorts.PlateauStopper`). One round of this strategy sends every
running cohort's model to that cohort's sampled clients, so the cohorts train concurrently.
**Stage 2:** the global server distils the cohorts' models (each cohort's best checkpoint, or
``teacher: last``) into a fresh student on unlabeled public data (``data.server_fraction`` or
``data.public_path``), towards ``z~_c = sum_i p_ic z_ic`` with per-class label weights, L1 loss on
logits, Adam (Sec. 3 eqs. 2-3, Sec. 4.1; :func:`fedgo_flwr.learning.cohorts.distill_l1`).
``cohorts: 1`` is FedAvg with early stopping; ``cohorts: K`` is one-shot FedKD.

Each client has a device profile (``profiles``), and the run reports simulated time, CPU-hours
and bytes (Sec. 4.1/4.2, App. B.4; :mod:`fedgo_flwr.learning.systems`). Beyond the paper:
``distill_when`` / ``distill_at_hours`` start stage 2 early (its Sec. 5 suggestion), a cohort's
stopping signal is robust to a lying member (``loss_reduce``, ``loss_bound``), and
``distill.weights: fedgo`` weights the teachers by FedGO's odds. A cohort without a usable reply
keeps its model, and one that never got one is left out of stage 2. ``docs/architecture.md``
("CPFL") has the clock, the options and the rows in full; ``summary.json`` adds
:meth:`CPFL.report`.

**Where the parts are.** A CPFL round reads in :class:`CPFL`'s hooks and the two parts it owns:
the cohorts and their stage 1, ``self.cohorts`` (:class:`strategies._cpfl_rounds.CohortRounds`),
and stage 2, ``self.distillation`` (:class:`strategies._cpfl_distill.CohortDistillation`); the
math and bookkeeping are :mod:`fedgo_flwr.learning.cohorts`'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.config.schema import Checker, build_section
from fedgo_flwr.gan.settings import DiscriminatorConfig, GeneratorConfig
from fedgo_flwr.learning.cohorts import (
    GROUPINGS,
    LOSS_BOUND,
    LOSS_REDUCES,
    MAX_ROUNDS,
    TEACHERS,
    CohortDistillConfig,
    mean_sd,
)
from fedgo_flwr.learning.systems import ProfileError, load_profiles
from fedgo_flwr.learning.task import load_bundle
from fedgo_flwr.protocol import ReplySpec
from fedgo_flwr.protocol.cpfl import CohortClientConfig, local_declaration, member_reply
from fedgo_flwr.runtime import messages as msgs
from fedgo_flwr.runtime.fileio import atomic_write_text, strict_json
from fedgo_flwr.runtime.messages import stream_replies, to_numpy, to_record
from fedgo_flwr.runtime.shutdown import raise_if_stopping
from strategies._cpfl_distill import CohortDistillation
from strategies._cpfl_rounds import CohortRounds
from strategies._prefl import DiscriminatorStage, check_generator
from strategies.base import BaseConfig, Row, Strategy, client_metrics


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


class CPFL(Strategy):
    """Cohorts trained in parallel to convergence, then distilled into one model (Alg. 1).

    Its parts, built in ``__init__`` (a resumed run's checkpoint restores the cohorts before
    :meth:`setup`, and ``benchmarks/cpfl_replay.py`` runs stage 2 without a grid):
    ``self.cohorts`` (:class:`~strategies._cpfl_rounds.CohortRounds`) and ``self.distillation``
    (:class:`~strategies._cpfl_distill.CohortDistillation`), which :meth:`setup` gives the
    clients' discriminators when ``distill.weights`` is ``fedgo``."""

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
        if resources is None:
            raise ValueError("CPFL needs the server's resources (data, partition)")
        self.cohorts = CohortRounds(
            cfg, self.params, resources.partition, resources.bundle.train, self.aggregation
        )
        # n_k is each client's training split: a reply's num-examples must be it.
        self.client_sizes = self.intake.client_sizes = self.cohorts.client_sizes
        self.distillation = CohortDistillation(
            cfg,
            self.params,
            resources,
            model_factory=self.model_factory,
            public=self.server_unlabeled,
            discriminator_bound=self.aggregation.discriminator_bound,
            client_sizes=self.client_sizes,
            discriminators={},  # distill.weights: fedgo, from setup()
        )
        self.finished = False
        self.final: dict[str, Any] = {}  # stage 2's report

    @classmethod
    def ensemble_teachers(cls, cfg: ExperimentConfig) -> int | None:
        """With ``distill.weights: fedgo`` every client's discriminator weighs stage 2's
        ensemble (the members' odds are share-capped); otherwise no share cap applies."""
        return cfg.data.num_clients if cfg.strategy.params.distill.weights == "fedgo" else None

    def summary(self) -> None:
        sizes = [len(g) for g in self.cohorts.groups]
        log(INFO, "\t├──> CPFL, params %s", self.params)
        log(
            INFO,
            "\t└──> %d cohorts (%s) of %s clients; %.0f%% participation per cohort round",
            len(sizes),
            self.params.grouping,
            f"{min(sizes)}-{max(sizes)}" if min(sizes) != max(sizes) else sizes[0],
            100 * self.cfg.fraction,
        )

    def setup(self, grid: Grid) -> None:
        """With ``distill.weights: fedgo`` and more than one cohort, FedGO's pre-FL stage
        (``self.prefl``, :class:`strategies._prefl.DiscriminatorStage`): a generator (trained on
        the public set, or loaded) and every client's discriminator, trained once, for stage 2
        (``self.distillation``); ``prefl.json`` reports it."""
        if self.params.distill.weights != "fedgo" or len(self.cohorts.groups) == 1:
            return  # one cohort is not distilled
        self.prefl = DiscriminatorStage(
            self.cfg,
            self.resources,
            self.outbox,
            run_token=self.run_token,
            data=self.server_unlabeled,  # the public set: FedGO's odds compare clients to it
            needs_generator=self.params.discriminator.uses_generator,
            resuming=self.resuming,
            aggregation=self.aggregation,
            stage_times=self.stage_times,
        )
        generator, disc_path, report = self.prefl.obtain_generator(grid)
        discriminators, disc_report = self.prefl.discriminators(grid, generator, disc_path)
        self.distillation.discriminators = discriminators
        report.update(disc_report)
        name = "prefl-resume.json" if self.resuming else "prefl.json"
        text = strict_json(report, name=name, indent=2, default=float)
        atomic_write_text(self.resources.out_dir / name, text)  # a link there is replaced

    # -- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {**self.cohorts.state_dict(), "finished": self.finished, "final": self.final}

    def state_problem(self, state: Mapping[str, Any], server_round: int) -> str | None:
        """One saved cohort per cohort of the configuration, each model (the cohort's, its best,
        those of its history) a model of ``model.name``."""
        return self.cohorts.state_problem(state, self.model_problem)

    def load_state_dict(self, state) -> None:
        self.cohorts.load_state_dict(state)
        self.finished = bool(state["finished"])
        self.final = dict(state["final"])

    # -- the round loop (Strategy.start) -----------------------------------------------------
    def plan(self, first_round: int, num_rounds: int) -> str:
        return f"rounds {first_round}..{num_rounds} at most"

    def begin_run(self, initial_arrays: ArrayRecord) -> bool:
        """The cohorts of a fresh run (a resumed one loaded its own); nothing to do if the run
        was resumed after stage 2 (its student is the checkpoint's model)."""
        if not self.cohorts.all:
            self.cohorts.new(to_numpy(initial_arrays))
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
        cohorts = self.cohorts.all
        if row == self.num_rounds:
            for c in cohorts:
                if c.running:
                    c.status = MAX_ROUNDS
                    c.finish_seconds = c.clock.seconds
        if not any(c.running for c in cohorts):
            student, self.final = self.distillation.run(self.cohorts)
            self.finished = True
            return Row(arrays=to_record(student), finished=True)
        if len(cohorts) == 1:
            model = to_record(cohorts[0].arrays)
            return Row(evaluated=model, checkpoint=model)
        return Row(evaluated=ArrayRecord())

    def configure_cohorts(self, server_round: int, config: ConfigRecord) -> list[Message]:
        """Stage 1's messages of the round: each running cohort's model to its participants
        (:meth:`CohortRounds.plan <strategies._cpfl_rounds.CohortRounds.plan>`); opens the
        round's intake for them."""
        config = self.message_config(server_round, config)
        plan = self.cohorts.plan(server_round)
        messages: list[Message] = []
        for i, pids in plan.items():
            arrays = self.cohorts.all[i].arrays
            record = RecordDict({msgs.ARRAYS: to_record(arrays), msgs.CONFIG: config})
            messages += self.messages_to(record, pids, MessageType.TRAIN)
        self.open_round(sorted(pid for pids in plan.values() for pid in pids))
        if self.cohorts.all:
            self.global_arrays = self.cohorts.all[0].arrays  # keys, shapes, dtypes of every reply
        log(INFO, "configure_train: %d cohorts, clients %s", len(plan), self.sampled)
        return messages

    def reply_spec(self) -> ReplySpec:
        """A cohort member's reply: its local algorithm's, with the validation report."""
        return member_reply(self.params.local_algorithm)

    def sent_arrays(self, pid: int) -> dict[str, np.ndarray]:
        """A member is sent its cohort's model: its update is bounded against that."""
        return self.cohorts.model_of(pid)

    def aggregate_cohorts(self, server_round: int, replies: Iterable[Message]) -> None:
        """Stage 1's replies: each member's, as it arrives, through the round's intake and into
        its cohort (:meth:`CohortRounds.absorb <strategies._cpfl_rounds.CohortRounds.absorb>`);
        then every cohort's round ends (:meth:`~strategies._cpfl_rounds.CohortRounds.close`),
        its model is evaluated every ``cohort_eval_every`` rounds, and the round's metrics
        (``last_round``) list every cohort."""
        self.cohorts.begin_round(server_round)
        accepted, _ = self.intake.collect(server_round, replies, self.accept, self.cohorts.absorb)
        rows = self.cohorts.close(server_round, accepted)
        accuracy = self.cohorts.evaluate(server_round, rows, self.distillation.accuracy)
        total = self.cohorts.totals()
        self.last_round = {
            "clients_sampled": len(self.sampled),
            "clients_replied": len(accepted),
            "clients_failed": self.intake.round.failed,
            "cohorts_running": sum(c.running for c in self.cohorts.all),
            "sim_hours": total.hours,
            "cpu_hours": total.cpu_hours,
            "bytes_total": total.bytes_total,
            "cohorts": rows,
        }
        if accuracy is not None:
            self.last_round["cohort_accuracy_mean"] = accuracy
        if accepted:
            self.last_round.update(client_metrics(accepted))

    def report(self) -> dict[str, Any]:
        """CPFL's part of ``summary.json``: simulated time, CPU-hours, bytes, per-cohort
        finish times and rounds, teacher and student accuracy."""
        cohorts = self.cohorts.all
        total = self.cohorts.totals()
        accs = self.final.get("teacher_accuracies", [])
        mean, sd = mean_sd(accs)
        return {
            "cohorts": len(cohorts),
            "sim_time_to_convergence_h": self.cohorts.distill_time() / 3600.0,
            "cpu_hours": total.cpu_hours,
            "bytes_total": total.bytes_total,
            "bytes_down": total.bytes_down,
            "bytes_up": total.bytes_up,
            "model_bytes": self.cohorts.model_bytes,
            "cohort_sizes": [len(c.members) for c in cohorts],
            "cohort_finish_h": [
                None if c.finish_seconds is None else c.finish_seconds / 3600.0 for c in cohorts
            ],
            "cohort_rounds": [c.rounds for c in cohorts],
            "cohort_status": [c.status for c in cohorts],
            "cohort_best_round": [c.best_round for c in cohorts],
            "teacher_accuracy_mean": mean,
            "teacher_accuracy_sd": sd,
            **self.final,
        }
