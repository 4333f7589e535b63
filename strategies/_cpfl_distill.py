"""CPFL's stage 2 on the strategy side: the cohorts' teachers distilled into one student.

Dhasade et al., EuroMLSys 2025 (Alg. 1 lines 9-15, Sec. 3 eqs. 2-3; :mod:`strategies.cpfl`).
:class:`CohortDistillation` is the part of :class:`strategies.cpfl.CPFL` that ends a run: at the
distillation time (:func:`fedgo_flwr.learning.cohorts.distill_start`) each cohort that got a usable
reply takes part with its teacher as of then (:func:`fedgo_flwr.learning.cohorts.teacher_at`); the
teachers and their ensemble are evaluated, and a fresh student learns the ensemble's outputs on the
unlabeled public set with the L1 loss (:func:`fedgo_flwr.learning.cohorts.distill_l1`). The ensemble
weights a teacher per class by its cohort's label counts, or, with ``distill.weights: fedgo``
(beyond the paper), per sample by FedGO's odds (Jeong et al., ICML 2025): a cohort's weight
is the sum of its members' (:func:`fedgo_flwr.learning.cohorts.cohort_odds_weights`), from
discriminators trained once before round 1 (:meth:`~CohortDistillation.setup`).
"""

from __future__ import annotations

import time
from logging import INFO, WARNING
from typing import Any

import numpy as np
import torch
from flwr.serverapp import Grid
from flwr.supercore import log

from fedgo_flwr.data import ArrayDataset, stratified_subset
from fedgo_flwr.gan import discriminator_logits, screen_discriminators
from fedgo_flwr.learning.cohorts import (
    Cohort,
    CohortDistillConfig,
    cohort_odds_weights,
    combine_per_sample,
    combine_teachers,
    distill_l1,
    distill_start,
    live_cohorts,
    public_subset,
    teacher_at,
    teacher_outputs,
    teacher_weights,
)
from fedgo_flwr.learning.training import predict_logits
from fedgo_flwr.runtime.fileio import atomic_torch_save, atomic_write_text, strict_json
from fedgo_flwr.runtime.messages import to_record
from fedgo_flwr.runtime.rng import make_rng
from fedgo_flwr.weighting import WeightingInputs, cap_mean_shares_named, compute_weights
from strategies._prefl import DiscriminatorStage, discriminator_stats

TEACHERS_FILE = "cpfl_teachers.pt"
"""Where a run keeps the teachers stage 2 distilled (:meth:`CohortDistillation.keep_teachers`)."""


class CohortDistillation:
    """Stage 2 of :class:`strategies.cpfl.CPFL` (a mixin), with FedGO's odds as the ensemble's
    weights (``distill.weights: fedgo``): the clients' ``discriminators``; ``final`` holds
    stage 2's report."""

    def setup(self, grid: Grid) -> None:
        """With ``distill.weights: fedgo``, FedGO's pre-FL stage before round 1: a generator
        (trained on the public set, or loaded) and every client's discriminator, trained once
        (:class:`strategies._prefl.DiscriminatorStage`); ``prefl.json`` reports it."""
        if self.params.distill.weights != "fedgo" or len(self.groups) == 1:
            return  # one cohort is not distilled
        self.prefl = DiscriminatorStage(
            self.cfg,
            self.resources,
            self.outbox,
            run_token=self.run_token,
            data=self.public_set,  # the generator learns it: FedGO's odds compare clients to it
            needs_generator=self.params.discriminator.uses_generator,
            resuming=self.resuming,
            aggregation=self.aggregation,
            stage_times=self.stage_times,
        )
        generator, disc_path, report = self.prefl.obtain_generator(grid)
        self.discriminators, disc_report = self.prefl.discriminators(grid, generator, disc_path)
        report.update(disc_report)
        name = "prefl-resume.json" if self.resuming else "prefl.json"
        text = strict_json(report, name=name, indent=2, default=float)
        atomic_write_text(self.resources.out_dir / name, text)  # a link there is replaced

    def odds_weights(self, included: list[Cohort], data: ArrayDataset, where: str) -> torch.Tensor:
        """``(n, N)`` FedGO weights of the included cohorts on ``data`` (named ``where`` in
        WARNINGs; :func:`fedgo_flwr.learning.cohorts.cohort_odds_weights`). A client without a
        discriminator has the neutral logits (on each sample the lower median of the members'
        that passed the screen); so has one whose logits are not finite or whose logit scale
        on ``data`` exceeds ``strategy.aggregation.upload_bound`` times the members' median
        (:func:`~fedgo_flwr.gan.screen_discriminators`, before any weight is computed); and no
        member's weight averaged over ``data`` exceeds ``max(2/K, 3 n_k / sum n)`` over the
        ``K`` members, and with 3 or more at most
        ``max(1/2, n_k / sum n)`` (:func:`~fedgo_flwr.weighting.cap_mean_shares_named`), so
        no cohort's exceeds the sum of its members' caps."""
        members = [k for c in included for k in c.members]
        logits = discriminator_logits(
            {k: d for k, d in self.discriminators.items() if k in members},
            data,
            num_clients=self.cfg.data.num_clients,
            device=self.resources.device,
        )[members, 0]
        present = [i for i, k in enumerate(members) if k in self.discriminators]
        screen_discriminators(
            logits, members, present, self.aggregation.upload_bound, "CPFL", where
        )
        inputs = WeightingInputs(
            logits=torch.zeros(len(members), len(data), 1),
            num_examples=torch.tensor([float(self.client_sizes[k]) for k in members]),
            disc_logits=logits,
        )
        weights = compute_weights("fedgo", inputs, disc_mode=self.params.distill.disc_mode)
        weights = cap_mean_shares_named(weights, inputs.num_examples, members, "CPFL", where)
        self.disc_report = discriminator_stats(logits)
        position = {k: i for i, k in enumerate(members)}
        return cohort_odds_weights(weights, [[position[k] for k in c.members] for c in included])

    def teacher_test_set(self) -> ArrayDataset:
        """Where the teachers and their ensemble are evaluated: the test split, or a
        stratified ``teacher_test_size`` of it (200 teachers x 10,000 images is most of
        stage 2 on a CPU; the student is always evaluated on the whole split)."""
        test = self.resources.bundle.test
        size = self.params.teacher_test_size
        if size is None or size >= len(test):
            return test
        return test.subset(stratified_subset(test.y, size))

    def distill_time(self) -> float:
        """The simulated time stage 2 starts: the deadline if one applied, else the last
        cohort's finish."""
        return distill_start(self.cohorts, self.deadline())

    def teacher_of(self, c: Cohort, at: float) -> dict[str, np.ndarray]:
        """Cohort ``c``'s teacher at simulated time ``at``."""
        return teacher_at(c, at, self.params.distill_when, self.params.teacher)

    def public_set(self) -> ArrayDataset:
        """The unlabeled public data: ``data.public_path`` if set, else the server's share."""
        return self.server_unlabeled()

    def stage_two(self, server_round: int) -> dict[str, np.ndarray]:
        """Distil the cohorts' teachers into a fresh student (Alg. 1 lines 9-15)."""
        p = self.params  # CPFLConfig
        at = self.distill_time()
        live = live_cohorts(self.cohorts)
        included = [c for c in live if c.updates > 0]
        for c in live:
            if c.updates == 0:
                log(
                    WARNING,
                    "CPFL: cohort %d (clients %s) never got a usable reply; it is "
                    "left out of distillation",
                    c.index,
                    c.members,
                )
        teachers = [self.teacher_of(c, at) for c in included]
        t0 = time.perf_counter()
        self.finished = True
        report: dict[str, Any] = {
            "distill_at_h": at / 3600.0,
            "cohorts_distilled": [c.index for c in included],
            "cohorts_left_out": [c.index for c in self.cohorts if c not in included],
        }
        if not included:
            log(WARNING, "CPFL: no cohort has a trained model; the result is the initial model")
            student = self.model_arrays()
            self.final = {**report, "distill_time_s": 0.0}
            return student
        report.update(self.evaluate_teachers(teachers, included, p.distill))
        if len(self.cohorts) == 1:  # FedAvg with early stopping: no distillation
            self.final = {**report, "distill_time_s": 0.0}
            return teachers[0]
        # Each cohort's model and label counts go to the global server once (step 3).
        self.upload_clock.add_bytes(up=len(included) * (self.model_bytes + 8 * self.num_classes))
        self.keep_teachers(included, teachers, at)
        student, distilled = self.distill(teachers, included, p.distill)
        self.final = {**report, **distilled, "distill_time_s": time.perf_counter() - t0}
        log(
            INFO,
            "CPFL: distilled %d teachers on %d public samples in %.1fs (L1 %.4f)",
            len(teachers),
            distilled["public_size"],
            self.final["distill_time_s"],
            distilled["distill_loss"],
        )
        return student

    def evaluate_teachers(
        self,
        teachers: list[dict[str, np.ndarray]],
        included: list[Cohort],
        config: CohortDistillConfig,
    ) -> dict[str, Any]:
        """``teacher_accuracies`` and ``ensemble_accuracy`` (the teachers combined as the
        distillation target is, ``config.outputs`` and ``config.weights``) on
        :meth:`teacher_test_set`."""
        test = self.teacher_test_set()
        test_logits = torch.stack([self._test_logits(t, test) for t in teachers])
        labels = torch.as_tensor(test.y)
        teacher_accs = [float((lg.argmax(1) == labels).float().mean()) for lg in test_logits]
        outputs = teacher_outputs(test_logits, config.outputs)
        if config.weights == "fedgo":
            odds = self.odds_weights(included, test, "the test split")
            ensemble = combine_per_sample(outputs, odds)
        else:
            weights = teacher_weights(np.stack([c.counts for c in included]), config.weights)
            ensemble = combine_teachers(outputs, weights)
        return {
            "teacher_accuracies": teacher_accs,
            "ensemble_accuracy": float((ensemble.argmax(1) == labels).float().mean()),
        }

    def keep_teachers(
        self, included: list[Cohort], teachers: list[dict[str, np.ndarray]], at: float
    ) -> None:
        """Write the teachers stage 2 distils, with their cohorts' indices and label counts,
        to :data:`TEACHERS_FILE` in the run folder: ``benchmarks/cpfl_replay.py`` re-runs
        stage 2 on them with other budgets."""
        atomic_torch_save(  # a link planted at the name is replaced, not written through
            self.resources.out_dir / TEACHERS_FILE,
            {
                "cohorts": [c.index for c in included],
                "counts": torch.as_tensor(np.stack([c.counts for c in included])),
                "teachers": [{k: torch.as_tensor(v) for k, v in t.items()} for t in teachers],
                "distill_at_h": at / 3600.0,
            },
        )

    def distill(
        self,
        teachers: list[dict[str, np.ndarray]],
        included: list[Cohort],
        config: CohortDistillConfig,
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """A fresh student distilled from ``teachers`` (those of the ``included`` cohorts) on
        the public set (or ``config.public_size`` of it, :func:`public_subset`) with
        ``config``'s budget; its arrays and the report's distillation keys."""
        public = self.public_set()
        subset = public_subset(len(public), config.public_size, self.cfg.seed)
        if subset is not None:
            public = public.subset(subset)
        model = self.model_factory()
        logits = []
        for t in teachers:
            model.load_state_dict(to_record(t).to_torch_state_dict())
            out = predict_logits(model, public, config.teacher_batch_size, self.resources.device)
            logits.append(teacher_outputs(out, config.outputs))
        report: dict[str, Any] = {}
        if config.weights == "fedgo":
            odds = self.odds_weights(included, public, "the public set")
            targets = combine_per_sample(torch.stack(logits), odds)
            report["disc_stats_public"] = self.disc_report
        else:
            weights = teacher_weights(np.stack([c.counts for c in included]), config.weights)
            targets = combine_teachers(torch.stack(logits), weights)
        del logits
        student = self.model_factory()  # a fresh model (the common initial weights)
        result = distill_l1(
            student,
            public,
            targets,
            config,
            rng=make_rng(self.cfg.seed, "cpfl-distill"),
            device=self.resources.device,
            progress="CPFL stage 2 (distillation of the cohorts)",
        )
        student.cpu()
        report.update(
            public_size=len(public),
            distill_loss=result.loss,
            distill_epoch_losses=result.epoch_losses,
            distill_steps=result.steps,
        )
        return {k: v.detach().numpy() for k, v in student.state_dict().items()}, report

    def model_arrays(self) -> dict[str, np.ndarray]:
        return {k: v.detach().numpy() for k, v in self.model_factory().state_dict().items()}
