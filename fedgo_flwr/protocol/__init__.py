"""What server and clients exchange, declared once per client algorithm, and the one intake.

Both sides import this package; neither ``strategies/`` nor ``clients/`` owns it. A client
algorithm whose messages carry more than the model (records of its own, metrics of its own,
extra message types) declares them in ``fedgo_flwr/protocol/<name>.py`` as ``PROTOCOL``, a
:class:`Declaration`: the record keys both sides use, and per message type the
:class:`~fedgo_flwr.protocol.spec.ReplySpec` that every reply must meet. One whose own parts are
a few scalar parameters (and reply metrics) is instead one entry of
:data:`fedgo_flwr.protocol.scalars.SCALAR_ALGORITHMS`. An algorithm declared in neither has the
default: ``train`` replies with the model and the training metrics
(:data:`~fedgo_flwr.protocol.spec.TRAIN_METRICS`), no parameters of its own
(:class:`EmptyConfig`) and no server-side state.

A declaration also holds what the server must know of the client without importing it: its
parameters (``Config``, the dataclass a strategy sends; the client class takes it from here)
and whether the server keeps state for it beyond the averaged model (``server_state``).

The server checks every reply against its declaration in one place,
:class:`~fedgo_flwr.protocol.intake.RoundIntake`; strategies receive checked values.
"""

from __future__ import annotations

import importlib

from fedgo_flwr.protocol.base import TRAIN, Declaration, EmptyConfig
from fedgo_flwr.protocol.intake import (
    Checked,
    ModelFault,
    RoundIntake,
    parse_group_id,
    partition_of_reply,
)
from fedgo_flwr.protocol.scalars import SCALAR_ALGORITHMS
from fedgo_flwr.protocol.spec import COMMON_METRICS, TRAIN_METRICS, ReplySpec, Scalar, is_number

__all__ = [
    "COMMON_METRICS",
    "TRAIN",
    "TRAIN_METRICS",
    "Checked",
    "Declaration",
    "EmptyConfig",
    "ReplySpec",
    "ModelFault",
    "RoundIntake",
    "Scalar",
    "declaration",
    "is_number",
    "parse_group_id",
    "partition_of_reply",
]

_MACHINERY = frozenset({"base", "spec", "intake", "scalars"})


def declaration(name: str) -> Declaration:
    """Client algorithm ``name``'s declaration: ``PROTOCOL`` of ``fedgo_flwr.protocol.<name>``
    if that module exists, else its entry of
    :data:`~fedgo_flwr.protocol.scalars.SCALAR_ALGORITHMS`, else the default (the model and
    the training metrics)."""
    if name in _MACHINERY or not name.isidentifier():
        return Declaration(name)
    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        return SCALAR_ALGORITHMS.get(name) or Declaration(name)
    return module.PROTOCOL
