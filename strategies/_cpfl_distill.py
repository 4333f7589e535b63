"""CPFL's stage 2, a part :class:`strategies.cpfl.CPFL` owns as ``self.distillation``.

Dhasade et al., EuroMLSys 2025 (Alg. 1 lines 9-15, Sec. 3 eqs. 2-3; :mod:`strategies.cpfl`).
:class:`CohortDistillation` ends a run (:meth:`~CohortDistillation.run`): at the distillation time
(:func:`fedgo_flwr.learning.cohorts.distill_start`) each cohort that got a usable reply takes part
with its teacher as of then (:func:`fedgo_flwr.learning.cohorts.teacher_at`); the teachers and
their ensemble are evaluated, and a fresh student learns the ensemble's outputs on the unlabeled
public set with the L1 loss (:func:`fedgo_flwr.learning.cohorts.distill_l1`). The ensemble weights
a teacher per class by its cohort's label counts, or, with ``distill.weights: fedgo`` (beyond the
paper), per sample by FedGO's odds (Jeong et al., ICML 2025): a cohort's weight is the sum of its
members' (:func:`fedgo_flwr.learning.cohorts.cohort_odds_weights`), from the discriminators
FedGO's pre-FL stage trained before round 1 (CPFL's ``setup`` hands them over). It also
evaluates models on the test split (:meth:`~CohortDistillation.accuracy`: the cohorts' in stage 1).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from logging import INFO, WARNING
from typing import Any

import numpy as np
import torch
from flwr.supercore import log

from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.data import ArrayDataset, stratified_subset
from fedgo_flwr.gan import discriminator_logits, screen_discriminators
from fedgo_flwr.learning.cohorts import (
    Cohort,
    CohortDistillConfig,
    cohort_odds_weights,
    combine_per_sample,
    combine_teachers,
    distill_l1,
    live_cohorts,
    public_subset,
    teacher_at,
    teacher_outputs,
    teacher_weights,
)
from fedgo_flwr.learning.training import predict_logits
from fedgo_flwr.runtime.fileio import atomic_torch_save
from fedgo_flwr.runtime.messages import to_record
from fedgo_flwr.runtime.rng import make_rng
from fedgo_flwr.weighting import WeightingInputs, cap_mean_shares_named, compute_weights
from strategies._cpfl_rounds import CohortRounds
from strategies._prefl import discriminator_stats

TEACHERS_FILE = "cpfl_teachers.pt"
"""Where a run keeps the teachers stage 2 distilled (:meth:`CohortDistillation.keep_teachers`)."""


class CohortDistillation:
    """Stage 2 of CPFL, with FedGO's odds as the ensemble's weights (``distill.weights:
    fedgo``).

    ``cfg``: the experiment; ``params``: CPFL's ``Config``; ``resources``: the server's data,
    device and run folder; ``model_factory()``: a fresh model with the common initial weights;
    ``public()``: the unlabeled public set; ``discriminator_bound``: ``strategy.aggregation``'s
    (the discriminators' screen); ``client_sizes``: each client's training-split size (n_k of
    FedGO's weights); ``discriminators``: client -> its discriminator (empty unless
    ``distill.weights: fedgo``).
    """

    def __init__(
        self,
        cfg: ExperimentConfig,
        params: Any,
        resources: Any,
        *,
        model_factory: Callable[[], torch.nn.Module],
        public: Callable[[], ArrayDataset],
        discriminator_bound: float | None,
        client_sizes: list[int],
        discriminators: dict[int, torch.nn.Module],
    ) -> None:
        self.cfg, self.params, self.resources = cfg, params, resources
        self.model_factory = model_factory
        self.public = public
        self.discriminator_bound = discriminator_bound
        self.client_sizes = client_sizes
        self.discriminators = discriminators
        self.disc_report: dict[str, Any] = {}  # the discriminators' logits on the last data

    # -- evaluation on the test split ------------------------------------------------------
    def test_logits(
        self, arrays: dict[str, np.ndarray], data: ArrayDataset | None = None
    ) -> torch.Tensor:
        """The logits of the model ``arrays`` on ``data`` (the test split if ``None``)."""
        model = self.model_factory()
        model.load_state_dict(to_record(arrays).to_torch_state_dict())
        data = self.resources.bundle.test if data is None else data
        return predict_logits(model, data, self.cfg.eval.batch_size, self.resources.device)

    def accuracy(self, arrays: dict[str, np.ndarray]) -> float:
        """The test accuracy of the model ``arrays`` (on the whole test split)."""
        logits = self.test_logits(arrays)
        labels = torch.as_tensor(self.resources.bundle.test.y)
        return float((logits.argmax(1) == labels).float().mean())

    def teacher_test_set(self) -> ArrayDataset:
        """Where the teachers and their ensemble are evaluated: the test split, or a
        stratified ``teacher_test_size`` of it (200 teachers x 10,000 images is most of
        stage 2 on a CPU; the student is always evaluated on the whole split)."""
        test = self.resources.bundle.test
        size = self.params.teacher_test_size
        if size is None or size >= len(test):
            return test
        return test.subset(stratified_subset(test.y, size))

    # -- the ensemble's weights ------------------------------------------------------------
    def odds_weights(self, included: list[Cohort], data: ArrayDataset, where: str) -> torch.Tensor:
        """``(n, N)`` FedGO weights of the included cohorts on ``data`` (named ``where`` in
        WARNINGs; :func:`fedgo_flwr.learning.cohorts.cohort_odds_weights`). A client without a
        discriminator has the neutral logits (on each sample the lower median of the members'
        that passed the screen); so has one whose logits are not finite or whose logit scale
        on ``data`` exceeds ``strategy.aggregation.discriminator_bound`` times the members' median
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
        screen_discriminators(logits, members, present, self.discriminator_bound, "CPFL", where)
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

    # -- stage 2 ---------------------------------------------------------------------------
    def run(self, cohorts: CohortRounds) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Distil the teachers of ``cohorts`` into a fresh student (Alg. 1 lines 9-15): the
        student's arrays and stage 2's report (``summary.json``). One cohort is not distilled
        (FedAvg with early stopping: its teacher is the result); with no cohort trained the
        result is the initial model."""
        p = self.params
        at = cohorts.distill_time()
        live = live_cohorts(cohorts.all)
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
        teachers = [teacher_at(c, at, p.distill_when, p.teacher) for c in included]
        t0 = time.perf_counter()
        report: dict[str, Any] = {
            "distill_at_h": at / 3600.0,
            "cohorts_distilled": [c.index for c in included],
            "cohorts_left_out": [c.index for c in cohorts.all if c not in included],
        }
        if not included:
            log(WARNING, "CPFL: no cohort has a trained model; the result is the initial model")
            return self.initial_arrays(), {**report, "distill_time_s": 0.0}
        report.update(self.evaluate_teachers(teachers, included, p.distill))
        if len(cohorts.all) == 1:  # FedAvg with early stopping: no distillation
            return teachers[0], {**report, "distill_time_s": 0.0}
        # Each cohort's model and label counts go to the global server once (step 3).
        cohorts.upload_clock.add_bytes(
            up=len(included) * (cohorts.model_bytes + 8 * cohorts.num_classes)
        )
        self.keep_teachers(included, teachers, at)
        student, distilled = self.distill(teachers, included, p.distill)
        final = {**report, **distilled, "distill_time_s": time.perf_counter() - t0}
        log(
            INFO,
            "CPFL: distilled %d teachers on %d public samples in %.1fs (L1 %.4f)",
            len(teachers),
            distilled["public_size"],
            final["distill_time_s"],
            distilled["distill_loss"],
        )
        return student, final

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
        test_logits = torch.stack([self.test_logits(t, test) for t in teachers])
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
        public = self.public()
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

    def initial_arrays(self) -> dict[str, np.ndarray]:
        """The initial model's arrays (a fresh copy of the common initial weights)."""
        return {k: v.detach().numpy() for k, v in self.model_factory().state_dict().items()}
