"""A client discriminator's raw logit ``z`` as a probability ``D`` or odds ``Φ = D / (1 - D)``.

FedGO (Jang, Park & Lee, ICML 2025) weights client ``k`` by the odds ``Φ_k(x)`` of its
discriminator (Def. 3.5, Thm 3.6); DaFKD by ``D_k(x)`` itself. The discriminators output raw
logits (:mod:`fedgo_flwr.gan.discriminators`); the squashing (:data:`DISC_MODES`) is applied
here through closed forms that are stable for any finite ``z`` (never ``D / (1 - D)`` on a
saturated ``D``). Also here: FedGO App. F.8's Byzantine discriminators, which output their
maximum on every sample.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from fedgo_flwr.runtime.rng import make_rng

__all__ = [
    "BYZANTINE_LOGIT",
    "DISC_MODES",
    "byzantine_clients",
    "discriminator_odds",
    "discriminator_probability",
    "log_discriminator_odds",
    "log_discriminator_probability",
    "make_byzantine",
]

DISC_MODES: tuple[str, ...] = ("double_sigmoid", "sigmoid")
"""How a discriminator's raw output ``z`` becomes a probability ``D``.

* ``"double_sigmoid"``: ``D = sigmoid(sigmoid(z))`` (FedGO App. E.2, "Model Implementation": "we
  employed a composition of two sigmoid activations for the discriminator output. This ensures that
  the odds value Φ_k ... is constrained between 1 and e"). Then ``Φ = exp(sigmoid(z))``.
* ``"sigmoid"``: ``D = sigmoid(z)``, the textbook GAN discriminator of Thm 2.1 / Thm 3.6. Then
  ``Φ = exp(z)``: the exact density ratio ``p_k / p_g`` for an optimal discriminator.
"""


# ------------------------------------------------------------------------------------------
# Discriminator transforms (closed forms, stable for any finite z)
# ------------------------------------------------------------------------------------------


def _check_disc_mode(mode: str) -> None:
    """Raise ``ValueError`` unless ``mode`` is one of :data:`DISC_MODES`."""
    if mode not in DISC_MODES:
        raise ValueError(f"unknown disc_mode {mode!r}; expected one of {list(DISC_MODES)}")


def log_discriminator_odds(disc_logits: Tensor, mode: str = "double_sigmoid") -> Tensor:
    """Return ``log Φ = log(D / (1 - D))`` from the raw discriminator output ``z``.

    Uses ``sigmoid(u) / (1 - sigmoid(u)) = exp(u)``, so no division is ever formed:

    * ``"double_sigmoid"``: ``D = sigmoid(sigmoid(z))`` → ``log Φ = sigmoid(z) ∈ (0, 1)``
      (FedGO App. E.2, "Model Implementation").
    * ``"sigmoid"``: ``D = sigmoid(z)`` → ``log Φ = z`` (FedGO Def. 3.5 + Thm 2.1: ``Φ = p_k/p_g``).

    The result has the dtype and device of ``disc_logits``.
    """
    _check_disc_mode(mode)
    if mode == "double_sigmoid":
        return torch.sigmoid(disc_logits)
    return disc_logits.clone()


def discriminator_odds(disc_logits: Tensor, mode: str = "double_sigmoid") -> Tensor:
    """Return the odds ``Φ = D / (1 - D)`` of the discriminator probability (FedGO Def. 3.5).

    ``"double_sigmoid"`` (default, FedGO App. E.2) gives ``Φ = exp(sigmoid(z))``, which lies in
    ``(1, e)`` mathematically; in floating point it saturates to exactly ``1`` or ``exp(1)`` once
    ``|z|`` is large (about 17 in float32), and is never outside ``[1, e]``. ``"sigmoid"`` gives
    ``Φ = exp(z)``, which overflows to ``inf`` for ``z`` above ~88 (float32) / ~709 (float64); the
    weighting itself therefore works with :func:`log_discriminator_odds`.
    """
    return torch.exp(log_discriminator_odds(disc_logits, mode))


def log_discriminator_probability(disc_logits: Tensor, mode: str = "sigmoid") -> Tensor:
    """Return ``log D`` for the raw discriminator output ``z`` (``logsigmoid``, never ``log 0``)."""
    _check_disc_mode(mode)
    inner = torch.sigmoid(disc_logits) if mode == "double_sigmoid" else disc_logits
    return F.logsigmoid(inner)


def discriminator_probability(disc_logits: Tensor, mode: str = "sigmoid") -> Tensor:
    """Return ``D``: ``sigmoid(z)`` (``"sigmoid"``) or ``sigmoid(sigmoid(z))`` (double sigmoid)."""
    _check_disc_mode(mode)
    inner = torch.sigmoid(disc_logits) if mode == "double_sigmoid" else disc_logits
    return torch.sigmoid(inner)


# ------------------------------------------------------------------------------------------
# Byzantine discriminators (FedGO App. F.8)
# ------------------------------------------------------------------------------------------

BYZANTINE_LOGIT = 1e4
"""The raw output of a Byzantine discriminator everywhere: its maximum for every squashing in
use. ``sigmoid(1e4)`` is exactly 1 in float32 and float64, so the double sigmoid's odds are
``e`` (their supremum), the exact odds ``exp(1e4)`` (handled in log space) and ``D = 1``."""


def byzantine_clients(seed: int, num_clients: int, m: int) -> list[int]:
    """The ``m`` partition ids (sorted) whose discriminators are Byzantine, drawn once per run
    from ``seed`` alone (the same clients in every round and on resume)."""
    if not 0 <= m <= num_clients:
        raise ValueError(f"byzantine: m must be in [0, {num_clients}], got {m}")
    order = torch.randperm(num_clients, generator=make_rng(seed, "byzantine"))
    return sorted(int(i) for i in order[:m])


def make_byzantine(disc_logits: Tensor, clients: list[int]) -> Tensor:
    """``disc_logits`` (``(K, ...)``, row ``k`` = client ``k``) with the rows of ``clients``
    replaced by :data:`BYZANTINE_LOGIT`: a discriminator that claims every sample (FedGO App.
    F.8, "Byzantine clients ... output the maximum value"). A copy; the input is unchanged."""
    out = disc_logits.clone()
    if clients:
        out[clients] = BYZANTINE_LOGIT
    return out
