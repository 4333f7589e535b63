"""Per-sample ensemble weighting for federated ensemble distillation (plain PyTorch, no Flower).

Federated ensemble distillation pseudo-labels every unlabeled server sample ``x`` with a weighted
ensemble of the participating clients' models (FedGO paper, Jang, Park & Lee, ICML 2025,
Algorithm 1, line "ỹ(u) <- σ(Σ_{k∈A^t} w_k(u) · f(u; θ_k^t))")::

    pseudo_label(x) = softmax( Σ_k w_k(x) · f_k(x) )            (AVGLOGITS with weights)

The methods differ only in the weighting function ``w_k(x)``. Shapes: ``K`` teachers (the round's
participating clients, ``A^t``), ``N`` samples, ``C`` classes. This package holds, by what each
part owns:

* :mod:`fedgo_flwr.weighting.inputs` -- :class:`WeightingInputs`, everything a method may look
  at, validated on construction;
* :mod:`fedgo_flwr.weighting.discriminators` -- a discriminator's raw logit ``z`` as a
  probability ``D`` or odds ``Φ`` (:data:`DISC_MODES`, closed forms stable for any ``z``), and
  FedGO App. F.8's Byzantine discriminators;
* :mod:`fedgo_flwr.weighting.methods` -- the weighting methods the FedGO paper compares, their
  registry :data:`WEIGHTING_METHODS` and :func:`compute_weights`;
* :mod:`fedgo_flwr.weighting.ensemble` -- the weighted ensemble :func:`ensemble_logits`, its
  :func:`pseudo_labels`, and caps on any one client's share, per sample (:func:`cap_weights`)
  and averaged over the samples (:func:`cap_mean_shares`, :func:`mean_share_caps`).

Use :func:`compute_weights` with a name from :data:`WEIGHTING_NAMES` (e.g. read from YAML), then
:func:`ensemble_logits` / :func:`pseudo_labels`. The names below are re-exported here:
``from fedgo_flwr.weighting import compute_weights`` works.
"""

from fedgo_flwr.weighting.discriminators import (
    BYZANTINE_LOGIT,
    DISC_MODES,
    byzantine_clients,
    discriminator_odds,
    discriminator_probability,
    log_discriminator_odds,
    log_discriminator_probability,
    make_byzantine,
)
from fedgo_flwr.weighting.ensemble import (
    MAX_SHARE_FACTOR,
    SHARE_CAP_RULE,
    cap_mean_shares,
    cap_mean_shares_named,
    cap_scalar_shares,
    cap_weights,
    check_weight_cap,
    ensemble_logits,
    mean_share_caps,
    pseudo_labels,
    share_cap_warning,
)
from fedgo_flwr.weighting.inputs import WeightingInputs
from fedgo_flwr.weighting.methods import (
    WEIGHTING_METHODS,
    WEIGHTING_NAMES,
    WeightingMethod,
    compute_weights,
    get_weighting,
)

__all__ = [
    "BYZANTINE_LOGIT",
    "DISC_MODES",
    "MAX_SHARE_FACTOR",
    "SHARE_CAP_RULE",
    "WEIGHTING_METHODS",
    "WEIGHTING_NAMES",
    "WeightingInputs",
    "WeightingMethod",
    "cap_mean_shares",
    "cap_mean_shares_named",
    "cap_scalar_shares",
    "cap_weights",
    "check_weight_cap",
    "compute_weights",
    "discriminator_odds",
    "discriminator_probability",
    "byzantine_clients",
    "ensemble_logits",
    "get_weighting",
    "log_discriminator_odds",
    "log_discriminator_probability",
    "make_byzantine",
    "mean_share_caps",
    "pseudo_labels",
    "share_cap_warning",
]
