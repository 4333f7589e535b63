"""Client algorithms whose own parts are a few scalar parameters: one entry each.

A client algorithm that needs no records, message types or server state of its own, only a few
numbers, strings or switches that the server sends with every message, is declared here by one
entry of :data:`SCALAR_ALGORITHMS` instead of a module ``fedgo_flwr/protocol/<name>.py``: a
:class:`~fedgo_flwr.protocol.Declaration` whose ``Config`` :func:`parameters` builds from
:class:`Param` s (default, description, bound or choices). :func:`fedgo_flwr.protocol.declaration`
finds it by name; both sides use it as they use a module's ``PROTOCOL``: the client's class sets
``Config = declaration("<name>").Config`` and the strategy's ``Config`` extends that class.

The built ``Config`` is a dataclass like any section:
:func:`~fedgo_flwr.config.schema.build_section` builds and checks it, a parameter's
description is its field's ``metadata["doc"]`` and its bound's text ``metadata["rule"]``
(``docs/gen_configuration.py`` writes both on the configuration page), and it pickles by name
(this module's :func:`__getattr__`).
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
from collections.abc import Iterable
from typing import Any

from fedgo_flwr.config.schema import Checker
from fedgo_flwr.protocol.base import TRAIN, Declaration
from fedgo_flwr.protocol.spec import ReplySpec, Scalar

__all__ = ["SCALAR_ALGORITHMS", "Param", "parameters"]


@dataclasses.dataclass(frozen=True)
class Param:
    """One scalar parameter: ``strategy.<name>`` in YAML, sent to the client with every
    message."""

    default: bool | int | float | str | None
    doc: str
    """What it does (docstring markup), for the configuration page."""
    type: type | None = None
    """``bool``, ``int``, ``float`` or ``str``; ``None``: the default's type (a ``None`` default
    needs it, and then ``null`` is allowed)."""
    at_least: float | None = None
    """The value must be ``>=`` this."""
    above: float | None = None
    """The value must be ``>`` this."""
    choices: tuple[str, ...] = ()
    """The values a ``str`` may take."""

    def annotation(self) -> Any:
        tp = self.type or type(self.default)
        if tp not in (bool, int, float, str):
            raise TypeError(f"a Param is a bool, int, float or str, not {tp.__name__}")
        return tp | None if self.default is None else tp

    def rule(self) -> str | None:
        """The bound as the configuration page and the error say it."""
        if self.choices:
            return "one of " + ", ".join(f"`{c}`" for c in self.choices)
        if self.above is not None:
            return f"must be > {self.above:g}"
        if self.at_least is not None:
            return f"must be >= {self.at_least:g}"
        return None

    def ok(self, value: Any) -> bool:
        if value is None:
            return self.default is None
        if self.choices:
            return value in self.choices
        if isinstance(value, float) and math.isnan(value):
            return False
        if self.above is not None and not value > self.above:
            return False
        return self.at_least is None or value >= self.at_least


def _check(self: Any, c: Checker) -> None:
    """A built ``Config``'s check: every parameter against its :class:`Param`'s bound (a
    strategy's ``Config`` that extends it has other fields too)."""
    for f in dataclasses.fields(self):
        param: Param | None = f.metadata.get("param")
        if param is None:
            continue
        value = getattr(self, f.name)
        if param.choices and value is not None:
            c.choice(f.name, param.choices)
        elif not param.ok(value):
            c.fail(f.name, param.rule() or "not allowed")


def parameters(class_name: str, doc: str, **params: Param) -> type:
    """A ``Config`` dataclass named ``class_name`` (docstring ``doc``) with one field per
    :class:`Param`, in the order given, and a ``check`` that enforces their bounds."""
    fields = [
        (
            name,
            p.annotation(),
            dataclasses.field(
                default=p.default, metadata={"param": p, "doc": p.doc, "rule": p.rule()}
            ),
        )
        for name, p in params.items()
    ]
    text = textwrap.fill(" ".join(doc.split()), 92, break_on_hyphens=False)
    namespace = {"check": _check, "__doc__": text, "__module__": __name__}
    return dataclasses.make_dataclass(class_name, fields, namespace=namespace)


def _table(declarations: Iterable[Declaration]) -> dict[str, Declaration]:
    return {d.name: d for d in declarations}


SCALAR_ALGORITHMS: dict[str, Declaration] = _table(
    [
        Declaration(
            "fedprox",
            Config=parameters(
                "FedProxConfig",
                "FedProx's client parameter (Li et al., MLSys 2020; ``clients/fedprox.py``).",
                mu=Param(
                    0.01,
                    "Weight of the proximal term ``mu/2 ||w - w^t||^2`` of the clients' "
                    "objective (the FedGO paper's best value is 0.001; 0: FedAvg's training).",
                    at_least=0,
                ),
            ),
        ),
        Declaration(
            "feduv",
            {TRAIN: ReplySpec().with_metrics(uv_var=Scalar(), uv_unif=Scalar())},
            Config=parameters(
                "FedUVConfig",
                "FedUV's client parameters (Son et al., CVPR 2024; ``clients/feduv.py``); its "
                "replies carry the means of its two terms (``uv_var``, ``uv_unif``).",
                variance_weight=Param(
                    2.5, "alpha, the variance term's weight (the code's ``std_coeff``).", at_least=0
                ),
                uniformity_weight=Param(
                    0.5,
                    "lambda, the uniformity term's weight (the code's ``unif_coeff``).",
                    at_least=0,
                ),
                gamma=Param(
                    None,
                    "The floor of each class's probability std over a batch; ``null``: "
                    "1/sqrt(C), the std of one-hot outputs of a batch holding each class once.",
                    type=float,
                    above=0,
                ),
                bandwidth=Param(
                    "median",
                    "The uniformity kernel's bandwidth: ``median`` (the code's: the batch's "
                    "median non-zero squared distance) or ``fixed`` (``exp(-t d^2)`` on "
                    "L2-normalised features).",
                    choices=("median", "fixed"),
                ),
                t=Param(2.0, "The ``fixed`` bandwidth's t.", above=0),
                detach_bandwidth=Param(
                    False, "Detach the ``median`` bandwidth from the graph (the code does not)."
                ),
            ),
        ),
    ]
)
"""The client algorithms declared here, by name; :func:`fedgo_flwr.protocol.declaration`
reads it (a module ``fedgo_flwr/protocol/<name>.py`` of the same name would win)."""


def __getattr__(name: str) -> type:
    """A built ``Config`` by its class name (``pickle`` finds the classes so)."""
    for d in SCALAR_ALGORITHMS.values():
        if d.Config.__name__ == name:
            return d.Config
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
