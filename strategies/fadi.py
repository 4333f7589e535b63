"""F-ADI: one-shot FL distilled on DeepInversion images (a Co-Boosting Table 1 baseline).

Adaptive DeepInversion (Yin et al., "Dreaming to Distill", CVPR 2020) turned into a one-shot
FL baseline (DENSE, Zhang et al. 2022; Co-Boosting, paper 004, Table 1 "F-ADI"): no
generator; every epoch a batch of images is optimised directly (``synthesis.source:
pixels``) so that the uniform ensemble classifies them as uniformly drawn labels while the
statistics of their features match the running statistics of every batch-norm layer of the
client models (``synthesis.bn_weight``), under DeepInversion's image priors (total variation
``tv_weight``, L2 ``l2_weight``) and ADI's competition term (the adversarial KL between student
and ensemble, ``adv_weight``). The pool and the student's distillation are
:class:`~strategies.coboosting.CoBoosting`'s, without learned weights or diversification.

It needs client models with batch norm (``cnn_bn``, ``resnet8`` ...): without it the image
statistics term is 0 and the method is plain inversion; the run is refused before it starts,
naming the model key. The pixel learning rate (0.05) and prior weights are our choice for the
normalised ``[-1, 1]`` inputs here; the papers tune them per data set.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.config.schema import Checker
from fedgo_flwr.datafree import SynthesisSettings
from fedgo_flwr.learning.task import client_model_name, load_bundle
from fedgo_flwr.models.classifiers import build_model
from strategies.coboosting import CoBoosting, baseline_config

__all__ = ["FADI", "FADIConfig"]


@dataclass
class FADISynthesis(SynthesisSettings):
    """F-ADI optimises pixels under DeepInversion's batch-norm and image-prior terms."""

    source: str = "pixels"
    lr: float = 0.05
    beta1: float = 0.9
    hardness: float = 0.0
    bn_weight: float = 1.0
    tv_weight: float = 1e-3
    l2_weight: float = 1e-5
    adv_temperature: float = 3.0


FADIConfig = baseline_config("FADIConfig", FADISynthesis, "F-ADI", __name__)


class FADI(CoBoosting):
    """Co-Boosting's loop on DeepInversion's optimised pixels."""

    name = "fadi"
    Config = FADIConfig

    @classmethod
    def preflight(cls, cfg: ExperimentConfig, c: Checker) -> None:
        super().preflight(cfg, c)
        if cfg.strategy.params.synthesis.bn_weight == 0:
            return
        bundle = load_bundle(cfg.data)
        names = {client_model_name(cfg, pid) for pid in range(cfg.data.num_clients)}
        for name in sorted(names):
            model = build_model(name, bundle.train.input_shape, bundle.train.num_classes)
            has_bn = any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
            key = "client_models" if name != cfg.model.name or len(names) > 1 else "name"
            c.at("model.", cfg.model).require(
                key,
                has_bn,
                f"{cls.name} matches batch-norm statistics: client model {name!r} has no "
                "BatchNorm2d (use e.g. cnn_bn or resnet8, or strategy.synthesis.bn_weight: 0)",
            )
