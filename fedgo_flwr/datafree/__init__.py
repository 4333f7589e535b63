"""Data-free ensemble distillation: synthesis, ensemble re-weighting, diversification, pool KD.

The server of a one-shot federation holds the clients' models and no data. It distils their
ensemble into its own model on images it synthesises from that ensemble. This package holds the
math of the methods of Co-Boosting's Table 1 (Dai et al., "Enhancing One-Shot Federated
Learning Through Data and Ensemble Co-Boosting", ICLR 2024; paper 004), as plain PyTorch that
knows nothing of Flower:

- **Weighted ensemble** (eq. 2): ``A_w(x) = sum_k w_k f_k(x) / sum_k w_k`` over the clients'
  logits (:func:`weighted_logits`). Eq. 2 as printed has no division; the authors' ``WEnsemble``
  divides by ``sum_k w_k``, and so do we (the issue's contract): without it the size of ``w``
  would act as an inverse temperature on the ensemble.
- **Synthesis** (Alg. 1 lines 5-9, :func:`synthesize`): a generator (:class:`Generator`, the
  DENSE / Co-Boosting network) takes ``steps`` (``T_G``) Adam steps on
  ``L = ce_weight * L_H + adv_weight * L_A (+ bn_weight * L_BN + priors)``; the iterate with the
  lowest loss is the epoch's batch. ``L_H`` is the hardness-weighted cross-entropy of eqs. 5-6
  (:func:`hard_cross_entropy`; plain CE of eq. 3 when ``hard_weighting`` is off), ``L_A`` minus
  the KL between ensemble and student (eq. 7, :func:`adversarial_kl`). DENSE (Zhang et al.,
  NeurIPS 2022) is the same loop with plain CE, the adversarial term masked to samples where
  student and ensemble disagree (``adv_mask``), no re-weighting and no diversification. F-ADI
  (DeepInversion, Yin et al., CVPR 2020, as a one-shot FL baseline) optimises the pixels
  themselves (``source: pixels``) with the batch-norm statistics loss (:class:`BNStatistics`)
  and image priors (:func:`image_prior_losses`).
- **Ensemble weights** (eqs. 11-12, :func:`weight_step`): one signed-gradient step of the
  cross-entropy of ``A_w`` on a labelled synthetic batch, then each ``w_k`` clipped to
  ``[0, 1]`` ("Normalize").
- **Diversification** (eq. 10, :func:`diversify`): ``x + eps * g / ||g||_2`` with
  ``g = grad_x u^T A_w(x)``, ``u ~ U[-1, 1]^C`` drawn per sample (paper). The authors' code
  takes ``x + eps * sign(grad_x u^T softmax(A_w(x) / 4))`` instead (``variant="code"``).
  ``eps`` is in the units of the models' inputs (images normalised to ``[-1, 1]``), where the
  code applies it too.
- **Pool** (:class:`SyntheticPool`): every epoch's batch is kept (all history), as ``uint8``
  images in ``[0, 255]``: the authors save PNGs and read them back, so pool images are
  quantised exactly as theirs are, and the pool reads through :func:`fedgo_flwr.data.batches`
  (normalisation to ``[-1, 1]``, random horizontal flips when the data set allows them; the
  authors' CIFAR transform also random-crops, which this project's augmentation has not).
- **Distillation** (eq. 4, :func:`kd_loss`): ``T^2 KL(softmax(A_w/T) || softmax(f_S/T))``,
  batch mean, ``T = 4``.

All randomness (latent codes, labels, the generator's re-initialisation, ``u``, batch order,
flips) comes from explicit ``torch.Generator`` objects, so a run repeats exactly on CPU.

Its modules, by what each part owns:

* :mod:`fedgo_flwr.datafree.generator` -- the DENSE / Co-Boosting generator, its per-epoch
  re-initialisation, and the map of its images to the models' inputs;
* :mod:`fedgo_flwr.datafree.ensemble` -- the clients' logits, the weighted ensemble ``A_w``,
  the step of its weights, FedGO's per-sample multipliers, and the diversification step;
* :mod:`fedgo_flwr.datafree.losses` -- the synthesis and distillation losses (``L_H``, ``L_A``,
  KD, DeepInversion's batch-norm statistics and image priors);
* :mod:`fedgo_flwr.datafree.pool` -- the synthetic pool ``D_S``;
* :mod:`fedgo_flwr.datafree.synthesis` -- one epoch's synthesis of a labelled batch;
* :mod:`fedgo_flwr.datafree.engine` -- the epoch loop (:class:`DataFreeDistillation`) and its
  settings after synthesis.

The names below are re-exported here: ``from fedgo_flwr.datafree import synthesize`` works.
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
from fedgo_flwr.datafree.pool import SyntheticPool
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
