"""No name on a strategy means two things: a method of its class chain is never also an
instance attribute (``self.x = ...`` in any of its classes' methods), which would hide the
method on the instance (``last_round``, once a round's metrics and the run's last row), nor a
plain class attribute of another class of the chain.

The instance attributes are read from the source of every class of a strategy's chain (each
assignment to ``self.<name>``, plain, annotated, augmented, unpacked or by ``setattr``), so
attributes set in ``setup`` or in any later method count as well as those of ``__init__``.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import strategies
from strategies.base import Strategy
from strategies.fedavg import FedAvg


def _self_targets(node: ast.expr, me: str) -> list[str]:
    """The ``me.<name>`` attributes an assignment target sets (tuples and lists unpacked)."""
    if isinstance(node, (ast.Tuple, ast.List)):
        return [n for elt in node.elts for n in _self_targets(elt, me)]
    if isinstance(node, ast.Starred):
        return _self_targets(node.value, me)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == me:
        return [node.attr]
    return []


def instance_attributes(cls: type) -> dict[str, str]:
    """Every ``self.<name>`` that a method of ``cls``'s chain assigns: name -> ``Class.method``."""
    found: dict[str, str] = {}
    for klass in cls.__mro__:
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):  # object, builtins: no source, no self assignments
            continue
        body = ast.parse(source).body[0]
        assert isinstance(body, ast.ClassDef), klass
        for fn in body.body:
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or not fn.args.args:
                continue
            if any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list):
                continue  # its first argument is not the instance
            me = fn.args.args[0].arg
            for node in ast.walk(fn):
                targets: list[ast.expr] = []
                if isinstance(node, ast.Assign):
                    targets = node.targets
                elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                    targets = [node.target]
                elif (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id == "setattr"
                    and len(node.args) >= 2
                    and isinstance(node.args[0], ast.Name)
                    and node.args[0].id == me
                    and isinstance(node.args[1], ast.Constant)
                ):
                    found.setdefault(node.args[1].value, f"{klass.__name__}.{fn.name}")
                for target in targets:
                    for name in _self_targets(target, me):
                        found.setdefault(name, f"{klass.__name__}.{fn.name}")
    return found


def methods(cls: type) -> dict[str, str]:
    """Every method, class method, static method and read-only property of ``cls``'s chain:
    name -> the class that defines it (the first in the MRO)."""
    found: dict[str, str] = {}
    for klass in cls.__mro__[:-1]:  # not object
        for name, value in vars(klass).items():
            routine = inspect.isfunction(value) or isinstance(value, (classmethod, staticmethod))
            if routine or (isinstance(value, property) and value.fset is None):
                found.setdefault(name, klass.__name__)
    return found


def shadows(cls: type) -> list[str]:
    """The names that are both a method of ``cls``'s chain and an instance attribute."""
    attrs, routines = instance_attributes(cls), methods(cls)
    return [
        f"{name}: a method of {routines[name]}, set by {attrs[name]}"
        for name in sorted(set(attrs) & set(routines))
    ]


def class_clashes(cls: type) -> list[str]:
    """The names that one class of ``cls``'s chain defines as a method and another as a plain
    class attribute (one hides the other for every instance)."""
    kinds: dict[str, dict[str, str]] = {}
    for klass in cls.__mro__[:-1]:
        for name, value in vars(klass).items():
            if name.startswith("__") or name.startswith("_abc"):
                continue
            routine = inspect.isfunction(value) or isinstance(
                value, (classmethod, staticmethod, property)
            )
            kinds.setdefault(name, {}).setdefault("method" if routine else "value", klass.__name__)
    return [
        f"{name}: a method of {k['method']}, a class attribute of {k['value']}"
        for name, k in sorted(kinds.items())
        if len(k) == 2
    ]


class Shadowing(FedAvg):
    """A strategy that hides the class method ``final_row`` under a dict of its own, and the
    method ``summary`` under a class attribute."""

    summary = "FedAvg, shadowed"

    def setup(self, grid) -> None:
        self.total, (self.final_row, _) = 0, ({}, None)


def test_no_strategy_name_is_both_a_method_and_an_attribute():
    clashes = {}
    for name in strategies.available():
        cls = strategies.strategy_class(name)
        found = shadows(cls) + class_clashes(cls)
        if found:
            clashes[name] = found
    assert not clashes, clashes


def test_the_walk_sees_the_attributes_and_methods_it_compares():
    """Not vacuous: it finds the base's instance attributes (``__init__`` and later methods)
    and its methods, and refuses a method hidden by an unpacked assignment."""
    attrs, routines = instance_attributes(Strategy), methods(Strategy)
    assert attrs["last_round"] == "Strategy.__init__"
    assert {"params", "global_arrays", "outbox", "_server_unlabeled"} <= set(attrs)
    assert routines["final_row"] == "Strategy" and "server_unlabeled" in routines
    assert shadows(Shadowing) == ["final_row: a method of Strategy, set by Shadowing.setup"]
    assert class_clashes(Shadowing) == [
        "summary: a method of Strategy, a class attribute of Shadowing"
    ]
