"""The weighting methods the FedGO paper compares, their registry and :func:`compute_weights`.

The methods differ only in the weighting function ``w_k(x)`` (FedGO, Jang, Park & Lee, ICML
2025, Sec. 2, paragraph "For the weighting function, ..."; Fig. 1/2; App. E.1-E.2):

==============  ======================================================  ==========================
name            w_k(x) ∝ (normalised over the K teachers of the round)  source
==============  ======================================================  ==========================
``uniform``     1                                                       FedDF (Lin et al., 2020)
``data_size``   n_k                                                     ablation: FedGO, no D_k
``variance``    Var_c[f_k(x)_c]                                         Fed-ET (Cho et al., 2022)
``entropy``     exp(-H(σ(f_k(x))) / τ)                                  FedHKT / FedDS
``domain``      D_k(x) = sigmoid(z_k(x))                                DaFKD (Wang et al., 2023a)
``fedgo``       n_k · Φ_k(x),  Φ = D / (1 - D)                          FedGO Thm 3.6, Eq. (9)
``oracle``      n_{k, y(x)}  (true label y, per-client class counts)    FedGO Thm 3.4, label skew
==============  ======================================================  ==========================

All inputs travel in one :class:`~fedgo_flwr.weighting.inputs.WeightingInputs`; every method
returns a ``(K, N)`` float32 tensor that is non-negative and sums to one over ``K`` for every
sample. Internally everything is computed in float64, and the discriminator-based methods work
from the raw discriminator logit ``z_k(x)`` through the closed forms of
:mod:`fedgo_flwr.weighting.discriminators`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from fedgo_flwr.weighting.discriminators import (
    DISC_MODES,
    log_discriminator_odds,
    log_discriminator_probability,
)
from fedgo_flwr.weighting.inputs import WeightingInputs

__all__ = [
    "WEIGHTING_METHODS",
    "WEIGHTING_NAMES",
    "WeightingMethod",
    "compute_weights",
    "get_weighting",
]


# ------------------------------------------------------------------------------------------
# Parameter checks
# ------------------------------------------------------------------------------------------


def _positive_float(method: str, name: str, value: Any) -> float:
    """Return ``value`` as a finite float ``> 0`` or raise ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{method}: {name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{method}: {name} must be a finite number > 0, got {value!r}")
    return value


def _clip_param(method: str, value: Any) -> float | None:
    """``None`` (no clip) or ``value`` as a finite float ``> 0``, else ``ValueError``."""
    return None if value is None else _positive_float(method, "clip", value)


def _disc_mode_param(method: str, value: Any) -> str:
    """Return ``value`` if it is a valid ``disc_mode`` string, else raise ``ValueError``."""
    if not isinstance(value, str) or value not in DISC_MODES:
        raise ValueError(
            f"{method}: unknown disc_mode {value!r}; expected one of {list(DISC_MODES)}"
        )
    return value


def _positive_total(method: str, num_examples: Tensor) -> Tensor:
    """Return ``num_examples`` as float64, raising if ``sum_k n_k`` is not positive."""
    n = num_examples.to(torch.float64)
    if not bool(n.sum() > 0):
        raise ValueError(
            f"{method} weighting needs sum_k num_examples > 0, got {num_examples.tolist()}"
        )
    return n


# ------------------------------------------------------------------------------------------
# The weighting methods (each returns float64 (K, N); compute_weights casts to float32)
# ------------------------------------------------------------------------------------------


def _uniform_weights(inputs: WeightingInputs) -> Tensor:
    """FedDF: ``w_k(x) = 1 / |A^t|`` (FedGO Sec. 2; Lin et al. 2020, Alg. 1 AVGLOGITS)."""
    k, n = inputs.num_teachers, inputs.num_samples
    return torch.full((k, n), 1.0 / k, dtype=torch.float64, device=inputs.logits.device)


def _data_size_weights(inputs: WeightingInputs) -> Tensor:
    """``w_k(x) = n_k / Σ_i n_i``: FedGO's Eq. (9) with every ``Φ_k ≡ 1`` (no discriminators).

    This is also what :func:`_fedgo_weights` returns whenever all discriminators agree at ``x``.
    """
    n = _positive_total("data_size", inputs.num_examples)
    w = n / n.sum()
    return w[:, None].expand(inputs.num_teachers, inputs.num_samples).clone()


def _variance_weights(inputs: WeightingInputs) -> Tensor:
    """Fed-ET: ``w_k(x) = Var(f_k(x)) / Σ_i Var(f_i(x))`` (FedGO Sec. 2, Cho et al. 2022).

    ``Var`` is the variance of teacher ``k``'s logit vector across the ``C`` classes at ``x``.
    The population variance (divide by ``C``) is used; the ``C`` vs ``C - 1`` factor cancels in the
    normalisation, and it keeps ``C = 1`` defined. Because the variance is shift-invariant this is
    identical to using ``log_softmax`` outputs (the form a public Fed-ET re-implementation uses:
    ``Var_c[log_softmax f_k(x)]``). A teacher with constant logits gets weight 0; if every teacher
    is constant at ``x`` the weights fall back to uniform there.
    """
    logits = inputs.logits.to(torch.float64)
    var = (logits - logits.mean(dim=2, keepdim=True)).square().mean(dim=2)  # (K, N)
    total = var.sum(dim=0, keepdim=True)  # (1, N)
    uniform = torch.full_like(var, 1.0 / inputs.num_teachers)
    safe_total = torch.where(total > 0, total, torch.ones_like(total))
    return torch.where(total > 0, var / safe_total, uniform)


def _entropy_weights(inputs: WeightingInputs, temperature: Any = 1.0) -> Tensor:
    """FedHKT / FedDS: ``w_k(x) = softmax_k(-H(σ(f_k(x))) / τ)``, default ``τ = 1``.

    FedGO Sec. 2 prints ``exp(-Entropy(σ(f)))/τ`` with the ``/τ`` outside the ``exp``; read
    literally ``τ`` would cancel in the normalisation, which contradicts App. E.2 ("a temperature
    parameter τ > 0, which allows client weights to approach uniform weighting as τ increases"),
    so ``τ`` divides the entropy inside the exponent. ``τ = 1`` as in App. E.2 (after Deng et al.).
    """
    tau = _positive_float("entropy", "temperature", temperature)
    log_p = torch.log_softmax(inputs.logits.to(torch.float64), dim=2)
    entropy = -(log_p.exp() * log_p).sum(dim=2)  # (K, N), in [0, log C]
    return torch.softmax(-entropy / tau, dim=0)


def _domain_weights(inputs: WeightingInputs, disc_mode: Any = "sigmoid") -> Tensor:
    """DaFKD: ``w_k(x) = D_k(x) / Σ_i D_i(x)`` (FedGO Sec. 2; Wang et al. 2023a).

    Raw discriminator probabilities: no odds, no ``n_k``. The default ``D = sigmoid(z)`` is DaFKD's
    own discriminator head (``Linear -> Sigmoid`` in ``model/model_multitask.py`` of the authors'
    code, github.com/haozhaowang/DaFKD2023). FedGO's Fig. 2
    "domain-aware" curve swaps only the weighting step into FedGO's pipeline (App. E.2), i.e. it
    likely used FedGO's double-sigmoid discriminators; pass ``disc_mode="double_sigmoid"`` for that
    reading (then ``D ∈ (0.5, 0.731)`` and the weights stay close to uniform). Computed as
    ``softmax_k(log D_k)`` with ``log D = logsigmoid(.)``, which is exact and never divides by 0.
    """
    mode = _disc_mode_param("domain", disc_mode)
    assert inputs.disc_logits is not None  # checked by compute_weights
    log_d = log_discriminator_probability(inputs.disc_logits.to(torch.float64), mode)
    return torch.softmax(log_d, dim=0)


def _fedgo_weights(
    inputs: WeightingInputs,
    disc_mode: Any = "double_sigmoid",
    clip: Any = None,
    temperature: Any = 1.0,
    sizes: Any = True,
) -> Tensor:
    """FedGO: ``w_k(x) = n_k Φ_k(x) / Σ_i n_i Φ_i(x)``, ``Φ = D / (1 - D)`` (Thm 3.6, Eq. (9)).

    Alg. 2 writes the same weights inside the pseudo-labelling step. With optimal discriminators
    ``Φ_k = p_k / p_g`` (Thm 2.1), so Eq. (9) equals the optimal weights ``w_k^*`` of Thm 3.4,
    Eq. (8). The default ``disc_mode="double_sigmoid"`` is the paper's implementation (App. E.2),
    ``Φ_k = exp(sigmoid(z_k)) ∈ (1, e)``; ``"sigmoid"`` uses the exact odds ``Φ_k = exp(z_k)``.

    Stable evaluation: ``log Φ_k`` is shifted by its maximum over the clients with ``n_k > 0``, so
    every exponential is ``<= 1`` and the client attaining the maximum contributes ``n_k · 1`` to
    the denominator; then ``w_k = n_k r_k / Σ_i n_i r_i`` in float64. When all discriminators
    agree at ``x`` every ``r_k`` is exactly 1 and the result is bit-identical to ``data_size``.

    ``clip`` (default ``None``: none): a defence against discriminators that overfit or lie
    (FedGO App. F.8's Byzantine clients). ``log Φ_k`` is clamped to ``[-clip, clip]``, so no
    client's odds exceed ``e^clip`` times another's: with the exact odds (``disc_mode:
    sigmoid``) one discriminator that outputs huge logits otherwise takes the whole weight of
    every sample. Not in the paper (whose double sigmoid bounds ``log Φ`` to ``(0, 1)``
    already); a clip below 1 narrows that range too.

    ``temperature`` ``T`` (default 1): ``log Φ_k / T`` (before the clip), i.e. ``Φ_k^{1/T}``;
    ``T > 1`` flattens over-confident odds towards ``data_size``, ``T < 1`` sharpens them. Not
    in the paper: a calibration knob for discriminators trained on a few hundred images.

    ``sizes`` (default ``True``: Eq. (9)): ``False`` drops the ``n_k`` factor, ``w_k(x) =
    Φ_k(x) / Σ_i Φ_i(x)`` over the clients with data. Not in the paper: an ablation that tells
    how much of FedGO's weighting is its odds and how much Eq. (9)'s data-size prior (with the
    double sigmoid's odds in ``(1, e)``, Eq. (9) stays within a factor ``e`` of ``data_size``).
    """
    mode = _disc_mode_param("fedgo", disc_mode)
    use_sizes = _bool_param("fedgo", "sizes", sizes)
    tau = _positive_float("fedgo", "temperature", temperature)
    assert inputs.disc_logits is not None  # checked by compute_weights
    n = _positive_total("fedgo", inputs.num_examples)  # (K,)
    log_phi = log_discriminator_odds(inputs.disc_logits.to(torch.float64), mode)  # (K, N)
    if tau != 1.0:
        log_phi = log_phi / tau
    bound = _clip_param("fedgo", clip)
    if bound is not None:
        log_phi = log_phi.clamp(-bound, bound)
    active = (n > 0)[:, None]  # (K, 1)
    neg_inf = torch.tensor(float("-inf"), dtype=torch.float64, device=log_phi.device)
    shift = torch.where(active, log_phi, neg_inf).amax(dim=0, keepdim=True)  # (1, N), finite
    ratio = torch.exp(torch.where(active, log_phi - shift, neg_inf))  # in [0, 1]
    numer = (n[:, None] if use_sizes else active.to(n.dtype)) * ratio
    return numer / numer.sum(dim=0, keepdim=True)


def _bool_param(method: str, name: str, value: Any) -> bool:
    """Return ``value`` if it is a bool (YAML ``true`` / ``false``), else raise ``ValueError``."""
    if not isinstance(value, bool):
        raise ValueError(f"{method}: {name} must be true or false, got {value!r}")
    return value


def _oracle_weights(inputs: WeightingInputs) -> Tensor:
    """Label oracle: ``w_k(x) = n_{k,y(x)} / Σ_i n_{i,y(x)}`` (simulation diagnostics only).

    Under pure label skew ``p_k(x) = Σ_c (n_{k,c} / n_k) p(x | c)``; if the class-conditionals do
    not overlap, ``n_k p_k(x) ∝ n_{k,y(x)}`` and this is exactly the optimal weight ``w_k^*`` of
    FedGO Thm 3.4, Eq. (8). Needs the true labels, hence diagnostics only. Samples whose class has
    zero count at every teacher get uniform weights.
    """
    assert inputs.class_counts is not None and inputs.labels is not None  # checked upstream
    counts = inputs.class_counts.to(torch.float64)  # (K, C)
    per_sample = counts[:, inputs.labels]  # (K, N)
    total = per_sample.sum(dim=0, keepdim=True)
    uniform = torch.full_like(per_sample, 1.0 / inputs.num_teachers)
    safe_total = torch.where(total > 0, total, torch.ones_like(total))
    return torch.where(total > 0, per_sample / safe_total, uniform)


# ------------------------------------------------------------------------------------------
# Registry
# ------------------------------------------------------------------------------------------


_PARAM_CHECKS: Mapping[str, Callable[[str, Any], Any]] = MappingProxyType(
    {
        "temperature": lambda method, value: _positive_float(method, "temperature", value),
        "disc_mode": _disc_mode_param,
        "clip": _clip_param,
        "sizes": lambda method, value: _bool_param(method, "sizes", value),
    }
)
"""How each weighting parameter is checked: ``check(method, value) -> value`` or ``ValueError``."""


@dataclass(frozen=True, eq=False)
class WeightingMethod:
    """One entry of the registry: everything the framework knows about a weighting.

    Attributes:
        name: registry key (one of :data:`WEIGHTING_NAMES`).
        fn: ``fn(inputs, **params) -> (K, N)`` float64 weights (un-cast).
        requires: optional :class:`WeightingInputs` fields that must not be ``None``
            (``disc_logits``: client discriminators; ``labels``/``class_counts``: true labels,
            simulation only). Strategies and config validation read this.
        defaults: accepted keyword parameters and their defaults (YAML:
            ``strategy.weighting_params``); each is checked by :data:`_PARAM_CHECKS`.
        variants: extra parameter sets diagnosed beside the configured one, by suffix
            (``pl_acc_<name>_<suffix>``).
        reference: where the formula comes from.
    """

    name: str
    fn: Callable[..., Tensor]
    requires: tuple[str, ...]
    defaults: Mapping[str, Any]
    variants: Mapping[str, Mapping[str, Any]]
    reference: str

    def check_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` checked and completed with the defaults (``ValueError`` names the problem)."""
        unknown = sorted(set(params) - set(self.defaults))
        if unknown:
            accepted = list(self.defaults) or "none"
            raise ValueError(
                f"weighting method {self.name!r} got unknown parameter(s) {unknown}; "
                f"accepted: {accepted}"
            )
        full = {**self.defaults, **params}
        return {key: _PARAM_CHECKS[key](self.name, value) for key, value in full.items()}


def _method(
    name: str,
    fn: Callable[..., Tensor],
    requires: tuple[str, ...] = (),
    defaults: Mapping[str, Any] | None = None,
    reference: str = "",
    variants: Mapping[str, Mapping[str, Any]] | None = None,
) -> WeightingMethod:
    """Build a :class:`WeightingMethod` with immutable mappings."""
    frozen_variants = {k: MappingProxyType(dict(v)) for k, v in (variants or {}).items()}
    return WeightingMethod(
        name,
        fn,
        requires,
        MappingProxyType(dict(defaults or {})),
        MappingProxyType(frozen_variants),
        reference,
    )


WEIGHTING_METHODS: Mapping[str, WeightingMethod] = MappingProxyType(
    {
        m.name: m
        for m in (
            _method("uniform", _uniform_weights, reference="FedDF (Lin et al. 2020); FedGO Sec. 2"),
            _method("data_size", _data_size_weights, reference="FedGO Eq. (9) with Phi_k = 1"),
            _method(
                "variance", _variance_weights, reference="Fed-ET (Cho et al. 2022); FedGO Sec. 2"
            ),
            _method(
                "entropy",
                _entropy_weights,
                defaults={"temperature": 1.0},
                reference="FedHKT/FedDS (Deng et al. 2023; Park et al. 2024); FedGO Sec. 2, E.2",
            ),
            _method(
                "domain",
                _domain_weights,
                requires=("disc_logits",),
                defaults={"disc_mode": "sigmoid"},
                reference="DaFKD (Wang et al. 2023a); FedGO Sec. 2, E.2",
            ),
            _method(
                "fedgo",
                _fedgo_weights,
                requires=("disc_logits",),
                defaults={
                    "disc_mode": "double_sigmoid",
                    "clip": None,
                    "temperature": 1.0,
                    "sizes": True,
                },
                variants={
                    "sigmoid": {"disc_mode": "sigmoid"},
                    "double_sigmoid": {"disc_mode": "double_sigmoid"},
                    "sigmoid_clip20": {"disc_mode": "sigmoid", "clip": 20.0},
                },
                reference="FedGO Thm 3.6 Eq. (9), Alg. 2, App. E.2",
            ),
            _method(
                "oracle",
                _oracle_weights,
                requires=("labels", "class_counts"),
                reference="FedGO Thm 3.4 Eq. (8) under label skew (diagnostic)",
            ),
        )
    }
)
"""Read-only registry ``name -> WeightingMethod``; keys are exactly :data:`WEIGHTING_NAMES`.

Adding a weighting is one function and one entry here: configuration checks
(``strategy.weighting``, ``strategy.weighting_params``), which strategies may use it
(``requires``) and the pseudo-label diagnostics all read this registry.
"""

WEIGHTING_NAMES: tuple[str, ...] = tuple(WEIGHTING_METHODS)
"""Names accepted by :func:`compute_weights`, in registry order."""


def get_weighting(name: str) -> WeightingMethod:
    """Return the registry entry for ``name``; unknown names raise ``ValueError`` listing all."""
    try:
        return WEIGHTING_METHODS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown weighting method {name!r}; expected one of {list(WEIGHTING_NAMES)}"
        ) from None


def compute_weights(name: str, inputs: WeightingInputs, **params: Any) -> Tensor:
    """Compute per-sample ensemble weights ``w_k(x)`` with the method called ``name``.

    Args:
        name: one of :data:`WEIGHTING_NAMES`.
        inputs: validated :class:`WeightingInputs`.
        **params: method parameters: ``temperature`` (``entropy``, default 1.0), ``disc_mode``
            (``domain``: default ``"sigmoid"``; ``fedgo``: default ``"double_sigmoid"``) and
            ``clip`` (``fedgo``: bound on ``|log Φ|``, default ``None``).

    Returns:
        ``(K, N)`` float32 tensor on the device of ``inputs.logits``: finite, ``>= 0``, and summing
        to 1 over ``K`` for every sample.

    Raises:
        ValueError: unknown ``name``; a required input missing for this method (e.g. ``fedgo``
            without ``disc_logits``); an unknown or invalid parameter; ``sum_k n_k = 0`` for a
            method that uses ``n_k``.
    """
    method = get_weighting(name)
    if not isinstance(inputs, WeightingInputs):
        raise ValueError(f"inputs must be a WeightingInputs, got {type(inputs).__name__}")
    for field_name in method.requires:
        if getattr(inputs, field_name) is None:
            raise ValueError(
                f"weighting method {name!r} requires input {field_name!r}, which is missing "
                f"(required inputs: {list(method.requires)})"
            )
    weights = method.fn(inputs, **method.check_params(params))
    return weights.to(torch.float32)
