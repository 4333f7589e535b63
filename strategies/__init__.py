"""Server algorithms, one module per strategy; ``STRATEGIES`` maps YAML names to classes.

Each strategy class names its client-side algorithm (``client_algorithm``, a key of
``clients.CLIENTS``) and declares its YAML parameters as a dataclass ``Params``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fedgo_flwr.config import _build, _Checker
from strategies.fedavg import FedAvg
from strategies.feddf import FedDF
from strategies.fedgo import FedGO
from strategies.fedprox import FedProx
from strategies.scaffold import Scaffold

STRATEGIES: dict[str, type[FedAvg]] = {
    cls.name: cls for cls in (FedAvg, FedProx, Scaffold, FedDF, FedGO)
}


def validate_strategy_params(
    name: str, params: dict[str, Any], err: _Checker | None = None
) -> dict[str, Any]:
    """Check ``strategy.<key>`` values against the strategy's ``Params``; fill in defaults."""
    cls = STRATEGIES[name].Params
    instance = _build(cls, dict(params), "strategy.", err or _Checker({}), owner=name)
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
