"""Server algorithms, one module per strategy; ``STRATEGIES`` maps YAML names to classes.

Each strategy class names its client-side algorithm (``client_algorithm``, a key of
``clients.CLIENTS``) and declares its YAML parameters as a dataclass ``Params``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fedgo_flwr.config import ConfigError, _Checker, _type_name, _type_ok
from strategies.fedavg import FedAvg
from strategies.fedprox import FedProx
from strategies.scaffold import Scaffold

STRATEGIES: dict[str, type[FedAvg]] = {cls.name: cls for cls in (FedAvg, FedProx, Scaffold)}


def validate_strategy_params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Check ``strategy.<key>`` values against the strategy's ``Params``; fill in defaults."""
    cls = STRATEGIES[name].Params
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = __import__("typing").get_type_hints(cls)
    checked: dict[str, Any] = {}
    for key, value in params.items():
        if key not in fields:
            known = ", ".join(fields) or "none"
            raise ConfigError(
                f"strategy.{key}", value, f"not a parameter of {name} (its parameters: {known})"
            )
        ok, cast = _type_ok(value, hints[key])
        if not ok:
            raise ConfigError(f"strategy.{key}", value, f"must be {_type_name(hints[key])}")
        checked[key] = cast
    try:
        instance = cls(**checked)
    except ValueError as exc:
        key = next(iter(checked), "name")
        raise ConfigError(f"strategy.{key}", checked.get(key), str(exc)) from None
    return dataclasses.asdict(instance)


__all__ = ["STRATEGIES", "FedAvg", "FedProx", "Scaffold", "validate_strategy_params", "_Checker"]
