"""Server algorithms, one module per strategy; ``STRATEGIES`` maps YAML names to classes.

Each strategy class names its client-side algorithm (``client_algorithm``, a key of
``clients.CLIENTS``) and declares its YAML parameters as a dataclass ``Params``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from fedgo_flwr.config import _build, _Checker
from strategies.fedavg import FedAvg
from strategies.feddf import FedDF
from strategies.fedgo import FedGO
from strategies.fedprox import FedProx
from strategies.scaffold import Scaffold

log = logging.getLogger("fedgo_flwr")

STRATEGIES: dict[str, type[FedAvg]] = {
    cls.name: cls for cls in (FedAvg, FedProx, Scaffold, FedDF, FedGO)
}


def validate_strategy_params(
    name: str, params: dict[str, Any], err: _Checker | None = None
) -> dict[str, Any]:
    """Check ``strategy.<key>`` values against the strategy's ``Params``; fill in defaults."""
    cls = STRATEGIES[name].Params
    own = {f.name for f in dataclasses.fields(cls)}
    kept = {}
    for key, value in params.items():
        others = [
            n
            for n, c in STRATEGIES.items()
            if key in {f.name for f in dataclasses.fields(c.Params)}
        ]
        if key not in own and others:
            # Swapping strategy.name must be a one-line change: parameters that belong to
            # other strategies are dropped (with a warning); unknown ones are still errors.
            log.warning(
                "strategy.%s ignored: a parameter of %s, not of %s", key, ", ".join(others), name
            )
            continue
        kept[key] = value
    checker = err or _Checker({})
    instance = _build(cls, kept, "strategy.", checker, owner=name)
    try:
        STRATEGIES[name].check_params(instance)
    except ValueError as exc:
        key, _, problem = str(exc).partition(" ")
        checker.fail(f"strategy.{key}", getattr(instance, key, None), problem)
    return dataclasses.asdict(instance)


__all__ = [
    "STRATEGIES",
    "FedAvg",
    "FedDF",
    "FedGO",
    "FedProx",
    "Scaffold",
    "validate_strategy_params",
]
