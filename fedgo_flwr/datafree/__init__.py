"""Data-free ensemble distillation: synthesis, ensemble re-weighting, diversification, pool KD.

The server of a one-shot federation holds the clients' models and no data. It distils their
ensemble into its own model on images it synthesises from that ensemble. This package holds the
math of the methods of Co-Boosting's Table 1 (Dai et al., "Enhancing One-Shot Federated
Learning Through Data and Ensemble Co-Boosting", ICLR 2024; paper 004), as plain PyTorch that
knows nothing of Flower:

- **Weighted ensemble** (eq. 2, :func:`weighted_logits`): ``A_w(x) = sum_k w_k f_k(x) / sum_k w_k``.
- **Synthesis** (Alg. 1 lines 5-9, :func:`synthesize`): a generator (:class:`Generator`) takes
  ``steps`` Adam steps on ``L = ce_weight * L_H + adv_weight * L_A (+ bn_weight * L_BN +
  priors)`` (eqs. 3, 5-7); DENSE, and F-ADI with ``source: pixels``, are settings of this loop.
- **Ensemble weights** (eqs. 11-12, :func:`weight_step`), **diversification** (eq. 10,
  :func:`diversify`), the **pool** of every epoch's batch (:class:`SyntheticPool`; the
  client models' logits on it cached by :class:`PoolLogits`) and the **distillation** (eq. 4,
  :func:`kd_loss`, ``T = 4``).

All randomness comes from explicit ``torch.Generator`` objects, so a run repeats exactly on CPU.
Where the paper and the authors' code differ, and which one each default follows:
``docs/architecture.md`` ("Data-free distillation").

Its modules: :mod:`~fedgo_flwr.datafree.generator` (the generator, its re-initialisation, its
images' scale), :mod:`~fedgo_flwr.datafree.ensemble` (logits, ``A_w``, the weight step, FedGO's
multipliers, diversification), :mod:`~fedgo_flwr.datafree.losses`, :mod:`~fedgo_flwr.datafree.pool`,
:mod:`~fedgo_flwr.datafree.synthesis` (one epoch's batch) and :mod:`~fedgo_flwr.datafree.engine`
(the epoch loop, :class:`DataFreeDistillation`). The names below are re-exported here.
"""

from fedgo_flwr.datafree.engine import ORDERS, BoostSettings, DataFreeDistillation, PlainBoost
from fedgo_flwr.datafree.ensemble import (
    DIVERSIFY_VARIANTS,
    diversify,
    fedgo_multipliers,
    member_logits,
    weight_step,
    weighted_logits,
)
from fedgo_flwr.datafree.generator import Generator, reset_generator, to_model_input
from fedgo_flwr.datafree.losses import (
    BNStatistics,
    adversarial_kl,
    hard_cross_entropy,
    image_prior_losses,
    kd_loss,
)
from fedgo_flwr.datafree.pool import PoolLogits, SyntheticPool
from fedgo_flwr.datafree.synthesis import (
    SOURCES,
    SynthesisResult,
    SynthesisSettings,
    frozen,
    synthesize,
)

__all__ = [
    "DIVERSIFY_VARIANTS",
    "SOURCES",
    "ORDERS",
    "BNStatistics",
    "BoostSettings",
    "DataFreeDistillation",
    "Generator",
    "PlainBoost",
    "PoolLogits",
    "SynthesisResult",
    "SynthesisSettings",
    "SyntheticPool",
    "adversarial_kl",
    "diversify",
    "fedgo_multipliers",
    "frozen",
    "hard_cross_entropy",
    "image_prior_losses",
    "kd_loss",
    "member_logits",
    "reset_generator",
    "synthesize",
    "to_model_input",
    "weight_step",
    "weighted_logits",
]
