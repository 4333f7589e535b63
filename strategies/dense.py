"""DENSE: data-free one-shot FL by generator-based ensemble distillation (Co-Boosting's peer).

Zhang, Chen, Li, Lyu, Wu, Ding and Wu, "DENSE: Data-Free One-Shot Federated Learning", NeurIPS
2022, as Co-Boosting's Table 1 runs it (paper 004, Sec. 4.1; the authors' ``DENSESynthesizer``):
the loop of :class:`~strategies.coboosting.CoBoosting` with its three additions off. The
generator minimises the plain cross-entropy of the uniform ensemble on uniformly drawn labels
plus the adversarial term, counted only where student and ensemble disagree
(``synthesis.adv_mask``), at the code's temperature 3; the ensemble keeps ``w_k = 1/n``; the
student distils on the pool as generated. DENSE's own paper adds DeepInversion's batch-norm
statistics term: ``synthesis.bn_weight`` (0 here as in the Co-Boosting authors' DENSE run;
it needs client models with batch norm).
"""

from __future__ import annotations

from dataclasses import dataclass

from fedgo_flwr.datafree import SynthesisSettings
from strategies.coboosting import CoBoosting, baseline_config

__all__ = ["DENSE", "DENSEConfig"]


@dataclass
class DENSESynthesis(SynthesisSettings):
    """DENSE's generator loss: plain CE, masked adversarial KL at T = 3."""

    hardness: float = 0.0
    adv_mask: bool = True
    adv_temperature: float = 3.0


DENSEConfig = baseline_config("DENSEConfig", DENSESynthesis, "DENSE", __name__)


class DENSE(CoBoosting):
    """Co-Boosting's loop with DENSE's defaults."""

    name = "dense"
    Config = DENSEConfig
