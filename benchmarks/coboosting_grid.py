"""The method grid of Co-Boosting's benchmark (:mod:`benchmarks.coboosting_table1`).

Dai et al., "Enhancing One-Shot Federated Learning Through Data and Ensemble Co-Boosting",
ICLR 2024 (paper 004): the methods behind its Tables 1 and 2 (one-shot FedAvg, FedDF, DENSE,
Co-Boosting, and beyond the paper Co-Boosting with FedGO's odds) and Table 7 (the ablation of
GHS, DHS and EE): their names (``a<alpha>-<method>``), config overrides, run order and whose
uploads each reuses, with the benchmark's default preset, tag and alphas. Constants and pure
functions only (nothing runs here): the driver and :mod:`benchmarks.coboosting_tables` import
them, and the driver re-exports the names its tests use.
"""

from __future__ import annotations

from collections.abc import Iterable

DEFAULT_CONFIG = "conf/bench/coboosting-cifar10-cpu.yaml"
DEFAULT_TAG = "coboosting-cifar10-cpu"
ALPHAS = (0.05, 0.1, 0.3)
ABLATION_ALPHAS = (0.05,)

# -- the methods -----------------------------------------------------------------------------

COMPONENTS = ("GHS", "DHS", "EE")
ABLATION = [  # (GHS, DHS, EE): none, each alone, each pair, all three (= coboosting)
    (False, False, False),
    (True, False, False),
    (False, True, False),
    (False, False, True),
    (True, True, False),
    (True, False, True),
    (False, True, True),
    (True, True, True),
]
BASE_OVERRIDES: dict[str, list[str]] = {
    "oneshot": ["strategy.name=oneshot"],
    "dense": ["strategy.name=dense"],
    "coboosting": ["strategy.name=coboosting"],
    # The authors' diversification (their ``cb_kd_train``): a step of eps * sign(grad) on
    # softmax at temperature 4, against eq. 10's L2-normalised step (the default, "paper").
    "coboosting_sign": ["strategy.name=coboosting", "strategy.boost.variant=code"],
    # Eq. 12 as published: no mean-share cap on the learned weights (the project's default
    # caps each client's share; it binds on honest runs with strong teachers).
    "coboosting_uncapped": ["strategy.name=coboosting", "strategy.share_cap=false"],
    "feddf": ["strategy.name=feddf", "rounds=1", "strategy.weighting=uniform"],
    "coboosting_fedgo": ["strategy.name=coboosting_fedgo", "strategy.combine=odds_learned"],
    "coboosting_fedgo_odds": ["strategy.name=coboosting_fedgo", "strategy.combine=odds"],
    # FedGO's Def. 3.5 odds exp(z) instead of App. E.2's exp(sigmoid(z)), which an untrained
    # generator's saturated discriminators leave near uniform (benchmarks/oneshot_odds.py).
    "coboosting_fedgo_exact": [
        "strategy.name=coboosting_fedgo",
        "strategy.combine=odds_learned",
        "strategy.disc_mode=sigmoid",
    ],
    "coboosting_fedgo_exact_odds": [
        "strategy.name=coboosting_fedgo",
        "strategy.combine=odds",
        "strategy.disc_mode=sigmoid",
    ],
}
REUSED = {
    "coboosting_fedgo_odds": "coboosting_fedgo",
    "coboosting_fedgo_exact": "coboosting_fedgo",
    "coboosting_fedgo_exact_odds": "coboosting_fedgo",
}
"""Whose uploads a method reuses (``strategy.teachers_from``) when not the oneshot run's."""
TRAINS_CLIENTS = ("oneshot", "feddf", "coboosting_fedgo")
"""Methods whose run trains the clients itself (no ``teachers_from``)."""


def ablation_name(ghs: bool, dhs: bool, ee: bool) -> str:
    """``abl-none``, ``abl-ghs``, ``abl-ghs_ee``, ...; all three on is ``coboosting``."""
    on = [name.lower() for name, flag in zip(COMPONENTS, (ghs, dhs, ee), strict=True) if flag]
    if len(on) == len(COMPONENTS):
        return "coboosting"
    return "abl-" + ("_".join(on) if on else "none")


def ablation_overrides(ghs: bool, dhs: bool, ee: bool) -> list[str]:
    """Co-Boosting with each component on or off (paper Table 7)."""
    return [
        "strategy.name=coboosting",
        f"strategy.synthesis.hardness={1 if ghs else 0}",
        f"strategy.boost.diversify={str(dhs).lower()}",
        f"strategy.boost.reweight={str(ee).lower()}",
    ]


def base_overrides(base: str) -> list[str]:
    """The overrides that make method ``base`` of the preset (``ValueError`` if unknown)."""
    if base in BASE_OVERRIDES:
        return list(BASE_OVERRIDES[base])
    for flags in ABLATION:
        if ablation_name(*flags) == base:
            return ablation_overrides(*flags)
    raise ValueError(f"unknown method {base!r}")


def source_of(base: str) -> str | None:
    """The method whose uploads ``base`` reuses (``None``: it trains its clients)."""
    if base in TRAINS_CLIENTS:
        return None
    return REUSED.get(base, "oneshot")


DEFAULT_METHODS = (
    "oneshot",
    "dense",
    "coboosting",
    "feddf",
    "coboosting_fedgo",
    "coboosting_fedgo_odds",
)
"""The methods of a seed by default (the paper's Table 1 and 2, and Co-Boosting with FedGO)."""
EXTRA_METHODS = (
    "coboosting_sign",
    "coboosting_uncapped",
    "coboosting_fedgo_exact",
    "coboosting_fedgo_exact_odds",
)
"""Methods run only when ``--methods`` names them."""
ALL_METHODS = (*DEFAULT_METHODS, *EXTRA_METHODS)


def base_methods(ablation: bool, chosen: Iterable[str] | None = None) -> list[str]:
    """One (alpha, seed)'s methods in run order: every source before the runs reusing it.

    ``chosen``: the methods to run (default :data:`DEFAULT_METHODS`); the sources they reuse
    uploads from are added. The ablation's runs come with ``ablation``."""
    chosen = set(DEFAULT_METHODS if chosen is None else chosen)
    unknown = sorted(chosen - set(ALL_METHODS))
    if unknown:
        raise ValueError(f"unknown methods {unknown}: choose from {list(ALL_METHODS)}")
    for base in list(chosen):
        while (source := source_of(base)) is not None:
            chosen.add(source)
            base = source
    order = ["oneshot", "dense", "coboosting", "coboosting_sign", "coboosting_uncapped"]
    methods = [m for m in order if m in chosen]
    if ablation:
        methods += [ablation_name(*f) for f in ABLATION if ablation_name(*f) != "coboosting"]
    later = ["feddf", "coboosting_fedgo", "coboosting_fedgo_odds", "coboosting_fedgo_exact",
             "coboosting_fedgo_exact_odds"]  # fmt: skip
    return [*methods, *(m for m in later if m in chosen)]


def method_name(alpha: float, base: str) -> str:
    """``a0.1-coboosting`` for alpha 0.1."""
    return f"a{alpha:g}-{base}"


def parse_method(method: str) -> tuple[float, str]:
    """``(alpha, base)`` of a method name (``ValueError`` for another name)."""
    a, sep, base = method.partition("-")
    if not (a.startswith("a") and sep and base):
        raise ValueError(f"method {method!r} is not named a<alpha>-<method>")
    return float(a[1:]), base


def method_grid(
    alphas: Iterable[float],
    ablation_alphas: Iterable[float] = (),
    chosen: Iterable[str] | None = None,
) -> list[str]:
    """Every method of a seed, alpha-major; the ablation only for ``ablation_alphas``;
    ``chosen``: as :func:`base_methods`."""
    ablation = {float(a) for a in ablation_alphas}
    chosen = None if chosen is None else list(chosen)
    return [method_name(a, b) for a in alphas for b in base_methods(float(a) in ablation, chosen)]


def method_overrides(method: str) -> list[str]:
    """The config overrides that make ``method`` of the base config."""
    alpha, base = parse_method(method)
    return [f"data.alpha={alpha:g}", *base_overrides(base)]


def source_method(method: str) -> str | None:
    """The full name of the run whose uploads ``method`` reuses (same alpha)."""
    alpha, base = parse_method(method)
    source = source_of(base)
    return None if source is None else method_name(alpha, source)
