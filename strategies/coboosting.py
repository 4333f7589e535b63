"""Co-Boosting: one-shot FL where synthetic data and the ensemble boost each other.

Dai, Zhang, Li, Liu, Tian, Yu, Huang and Wang, "Enhancing One-Shot Federated Learning Through
Data and Ensemble Co-Boosting", ICLR 2024 (paper 004), Alg. 1. After the one round of
:class:`~strategies.oneshot.OneShot` the server, with no data, runs ``epochs`` epochs of:

1. synthesis of ``synthesis.batch_size`` hard samples against the weighted ensemble and the
   previous epoch's student (eqs. 5-8; ``synthesis.*``);
2. the pool grows by them (all history kept);
3. the ensemble weights take one signed-gradient step per pool batch (eqs. 11-12;
   ``boost.reweight``, ``boost.mu``, ``boost.order``), and then no client's share
   ``w_k / sum_i w_i`` exceeds ``max(2/n, 3 n_k / sum n)``, and with 3 or more clients
   ``max(1/2, n_k / sum n)`` (:func:`~fedgo_flwr.weighting.mean_share_caps`;
   :func:`~fedgo_flwr.weighting.cap_scalar_shares`, a WARNING naming the client; not in the
   paper: ``share_cap: false`` leaves eq. 12 as published);
4. the student distils the weighted ensemble on the diversified pool (eqs. 4 and 10;
   ``boost.diversify``, ``boost.epsilon``, ``boost.variant``).

The math is :mod:`fedgo_flwr.datafree`. The three switches of the paper's ablation (Table 7) are
``synthesis.hardness: 0`` (GHS), ``boost.diversify: false`` (DHS) and ``boost.reweight: false``
(EE). The student starts fresh (``student_init: fresh``, the paper) or from the clients'
parameter average (``average``, one architecture only); client models may have their own
architectures (``model.client_models``). DENSE and F-ADI are this loop with other defaults
(:func:`baseline_config`). Per epoch it records the pool's size, the synthesis, weight and
distillation losses and times, the weights and the ensemble's test accuracy under them;
``docs/architecture.md`` ("Co-Boosting") has the share cap's reasoning and the rows in full.
"""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from logging import WARNING
from typing import Any

import numpy as np
import torch
from flwr.supercore import log

from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.config.schema import Checker
from fedgo_flwr.datafree import BoostSettings, DataFreeDistillation, PlainBoost, SynthesisSettings
from fedgo_flwr.learning.task import heterogeneous_models, load_bundle
from fedgo_flwr.runtime.rng import make_rng
from fedgo_flwr.weighting import SHARE_CAP_RULE, mean_share_caps
from strategies.oneshot import OneShot, OneShotConfig

__all__ = ["CoBoosting", "CoBoostingConfig", "baseline_config"]

STUDENT_INITS = ("fresh", "average")


@dataclass
class CoBoostingConfig(OneShotConfig):
    """Co-Boosting's server parameters (``strategy.<key>``); paper values as defaults, except
    ``epochs`` (paper 500; the authors' script 200)."""

    epochs: int = 200
    student_init: str = "fresh"
    """The student starts from the server's seeded initialisation (``fresh``, the paper) or the
    clients' average (``average``, one architecture only)."""
    nz: int = 256
    """Latent size of the DENSE / Co-Boosting generator."""
    ngf: int = 64
    """Width of that generator (images with H and W multiples of 4)."""
    synthesis: SynthesisSettings = field(default_factory=SynthesisSettings)
    boost: BoostSettings = field(default_factory=BoostSettings)
    share_cap: bool = True
    """No client's share ``w_k / sum_i w_i`` of the learned weights above its mean-share cap
    (:func:`~fedgo_flwr.weighting.mean_share_caps`; not in the paper, whose eq. 12 bounds each
    ``w_k`` to ``[0, 1]`` and no more). ``false``: eq. 12 as published, for reproducing the
    paper; one client's weight may then take the whole ensemble (a WARNING says so)."""

    def check(self, c: Checker) -> None:
        c.require("epochs", self.epochs >= 1, "must be >= 1")
        c.choice("student_init", STUDENT_INITS)
        c.require("nz", self.nz >= 1, "must be >= 1")
        c.require("ngf", self.ngf >= 1, "must be >= 1")


def baseline_config(
    name: str, synthesis: type[SynthesisSettings], baseline: str, module: str
) -> type[CoBoostingConfig]:
    """The ``Config`` of a data-free baseline of Co-Boosting's Table 1 (DENSE, F-ADI), one
    declaration for all of them: Co-Boosting's parameters with the baseline's ``synthesis``
    defaults (its subclass of :class:`~fedgo_flwr.datafree.SynthesisSettings`) and the boost
    off (:class:`~fedgo_flwr.datafree.PlainBoost`: the ensemble keeps ``w_k = 1/n`` and the
    student distils on the pool as generated).

    ``name`` and ``module`` are where the class is found (the module that assigns it to
    ``name``: the configuration page and pickles look it up there); ``baseline`` names the
    method in its docstring."""
    return make_dataclass(
        name,
        [
            ("synthesis", synthesis, field(default_factory=synthesis)),
            ("boost", PlainBoost, field(default_factory=PlainBoost)),
        ],
        bases=(CoBoostingConfig,),
        namespace={
            "__module__": module,
            "__doc__": f"Co-Boosting's parameters with {baseline}'s synthesis and boost defaults.",
        },
    )


class CoBoosting(OneShot):
    """Alg. 1 of Co-Boosting on the uploaded models."""

    name = "coboosting"
    Config = CoBoostingConfig
    supports_heterogeneous_models = True  # only logits meet (eq. 2); the student is model.name

    @classmethod
    def check_config(
        cls, config: CoBoostingConfig, c: Checker, cfg: ExperimentConfig | None = None
    ) -> None:
        super().check_config(config, c, cfg)
        if cfg is not None and config.student_init == "average" and heterogeneous_models(cfg):
            c.fail(
                "student_init",
                "'average' needs one architecture for every client (model.client_models "
                "names others); use 'fresh'",
            )

    def needs_average(self) -> bool:
        return self.params.student_init == "average"

    @classmethod
    def ensemble_teachers(cls, cfg: ExperimentConfig) -> int | None:
        """Every client (one-shot FL: all of them upload once)."""
        return cfg.data.num_clients

    @classmethod
    def preflight(cls, cfg: ExperimentConfig, c: Checker) -> None:
        super().preflight(cfg, c)
        params = cfg.strategy.params
        if params.synthesis.source == "generator":
            shape = load_bundle(cfg.data).train.input_shape
            ok = len(shape) == 3 and shape[1] % 4 == 0 and shape[2] % 4 == 0
            c.at("data.", cfg.data).require(
                "dataset",
                ok,
                f"{cls.name}'s generator makes images (C, H, W) with H and W multiples of 4; "
                f"this data set's inputs are {shape}",
            )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.engine: DataFreeDistillation | None = None
        self._engine_state: dict[str, Any] | None = None
        self._capped_named: set[int] = set()

    def boost_settings(self) -> BoostSettings:
        """The engine's re-weighting, diversification and distillation settings."""
        return self.params.boost

    def build_engine(self, initial: dict[str, np.ndarray]) -> DataFreeDistillation:
        p: CoBoostingConfig = self.params
        if not p.share_cap and p.boost.reweight:
            log(
                WARNING,
                "%s: share_cap: false: the learned ensemble weights take eq. 12's steps "
                "uncapped (the paper); one client's weight may take the whole ensemble",
                self.name,
            )
        student = self.model_factory()
        start = self.average if p.student_init == "average" and self.average else initial
        student.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in start.items()})
        train = self.resources.bundle.train
        return DataFreeDistillation(
            self.teacher_modules(),
            student,
            p.synthesis,
            self.boost_settings(),
            num_classes=train.num_classes,
            image_shape=train.input_shape,
            flip=train.flip,
            rng=make_rng(self.cfg.seed, self.name, "server"),
            device=self.resources.device,
            epochs=p.epochs,
            nz=p.nz,
            ngf=p.ngf,
            teacher_norm=p.teacher_norm,
            share_caps=mean_share_caps(self.data_size_weights()) if p.share_cap else None,
        )

    def after_clients(self, initial: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.engine = self.build_engine(initial)
        return self.student_arrays()

    def student_arrays(self) -> dict[str, np.ndarray]:
        assert self.engine is not None
        return to_numpy_state(self.engine.student.state_dict())

    def server_epoch(self, epoch: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        if self.engine is None:  # resumed after a checkpoint: rebuild, then restore
            self.engine = self.build_engine(self.global_arrays or self._initial_arrays())
            if self._engine_state is not None:
                self.engine.load_state_dict(self._engine_state)
                self._engine_state = None
        stats = self.engine.run_epoch()
        self.warn_capped(epoch)
        stats.pop("epoch", None)
        stats.update(self.ensemble_metrics())
        stats["ensemble_weights"] = [round(float(w), 6) for w in self.engine.weights]
        return self.student_arrays(), stats

    def warn_capped(self, epoch: int) -> None:
        """A WARNING naming each client whose learned weight share the engine capped this
        epoch, the first epoch it happens."""
        assert self.engine is not None
        caps = self.engine.share_caps
        for i in self.engine.capped:
            pid = self.pids[i]
            if pid in self._capped_named or caps is None:
                continue
            self._capped_named.add(pid)
            log(
                WARNING,
                "%s: the learned ensemble weight of client %d: share above its cap %.3g (%s); "
                "lowered to it (epoch %d; WARNING only the first time)",
                self.name,
                pid,
                float(caps[i]),
                SHARE_CAP_RULE,
                epoch,
            )

    def _initial_arrays(self) -> dict[str, np.ndarray]:
        return to_numpy_state(self.model_factory().state_dict())

    def ensemble_metrics(self) -> dict[str, float]:
        out = super().ensemble_metrics()
        if self.engine is not None:
            out["ensemble_accuracy_learned"] = self.ensemble_accuracy(self.engine.weights)
        return out

    def report(self) -> dict[str, Any]:
        out = super().report()
        if self.engine is not None:
            out["ensemble_weights"] = [float(w) for w in self.engine.weights]
        return out

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.engine is not None:
            state["engine"] = self.engine.state_dict()
        return state

    def load_state_dict(self, state: Any) -> None:
        super().load_state_dict(state)
        self.engine = None
        self._engine_state = state.get("engine")


def to_numpy_state(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in state.items()}
