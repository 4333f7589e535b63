"""A section's ``check`` methods: every class of its chain checks what it declares, once each.

:func:`fedgo_flwr.config.schema.build_section` runs the ``check`` of every class in a section's
method resolution order, bases first; a subclass's ``check`` neither hides its parents' nor
calls them.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

import pytest

import strategies
from fedgo_flwr.config.schema import Checker, ConfigError, build_section
from fedgo_flwr.protocol import declaration

CALLS: list[str] = []


@dataclass
class Base:
    x: int = 0

    def check(self, c: Checker) -> None:
        CALLS.append("Base")
        c.require("x", self.x >= 0, "must be >= 0")


@dataclass
class Child(Base):
    y: int = 0

    def check(self, c: Checker) -> None:
        CALLS.append("Child")
        c.require("y", self.y >= 0, "must be >= 0")


@dataclass
class Other:
    z: int = 0

    def check(self, c: Checker) -> None:
        CALLS.append("Other")
        c.require("z", self.z >= 0, "must be >= 0")


@dataclass
class Mixed(Other, Child):
    """Defines no ``check``: its three bases' run."""


def shared_check(self, c: Checker) -> None:
    CALLS.append("shared")
    c.require("w", self.w >= 0, "must be >= 0")


@dataclass
class SharedA:
    w: int = 0
    check = shared_check


@dataclass
class SharedB:
    x: int = 0
    check = shared_check  # one function in two classes (as scalars.parameters builds them)


@dataclass
class Shared(SharedA, SharedB, Child):
    """A function that two classes of the chain share runs once; its own ``check`` last."""

    def check(self, c: Checker) -> None:
        CALLS.append("Shared")


@pytest.fixture(autouse=True)
def _calls():
    CALLS.clear()
    yield
    CALLS.clear()


@pytest.mark.parametrize(
    ("cls", "key"),
    [(Child, "x"), (Child, "y"), (Mixed, "x"), (Mixed, "y"), (Mixed, "z"), (Shared, "y")],
)
def test_a_subclass_refuses_what_each_of_its_bases_refuses(cls, key):
    with pytest.raises(ConfigError) as info:
        build_section(cls, {key: -1}, "strategy.")
    assert info.value.key == f"strategy.{key}"
    assert str(info.value) == f"strategy.{key} = -1: must be >= 0"


@pytest.mark.parametrize(
    ("cls", "order"),
    [
        (Base, ["Base"]),
        (Child, ["Base", "Child"]),
        (Mixed, ["Base", "Child", "Other"]),  # MRO Mixed, Other, Child, Base: reversed
        (Shared, ["Base", "Child", "shared", "Shared"]),
    ],
)
def test_every_check_of_the_chain_runs_once_bases_first(cls, order):
    section = build_section(cls, {"x": 1})
    assert section.x == 1
    assert CALLS == order


def _sections(cls: type, seen: set[type]) -> None:
    """``cls`` and every section dataclass nested in it, into ``seen``."""
    if cls in seen:
        return
    seen.add(cls)
    for tp in typing.get_type_hints(cls).values():
        if typing.get_origin(tp) is list:
            (tp,) = typing.get_args(tp)
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            _sections(tp, seen)


def _all_sections() -> list[type]:
    seen: set[type] = set()
    for name in strategies.available():
        strategy = strategies.strategy_class(name)
        _sections(strategy.Config, seen)
        _sections(declaration(strategy.client_algorithm).Config, seen)
    return sorted(seen, key=lambda c: f"{c.__module__}.{c.__qualname__}")


def test_the_shipped_sections_run_each_check_of_their_chain_once(monkeypatch):
    """Built at its defaults, every strategy's and client's section (and each section nested
    in one) runs the ``check`` of every class in its chain exactly once, bases first: none
    hides a parent's, and none calls one that the schema runs anyway."""
    calls: list[tuple[type, object]] = []

    def counted(klass: type, check: typing.Callable) -> typing.Callable:
        def run(self, c):
            calls.append((klass, self))
            return check(self, c)

        return run

    owners: set[type] = set()
    sections = _all_sections()
    for cls in sections:
        for klass in cls.__mro__:
            if "check" in vars(klass) and klass not in owners:
                owners.add(klass)
                monkeypatch.setattr(klass, "check", counted(klass, vars(klass)["check"]))
    chained = []
    for cls in sections:
        calls.clear()
        section = build_section(cls, {})
        ran = [klass for klass, obj in calls if obj is section]
        expected = [k for k in reversed(cls.__mro__) if k in owners]
        assert ran == expected, cls
        if len(expected) > 1:
            chained.append(cls.__name__)
    # the walk reaches the sections that extend others (a vacuous walk would pass too)
    assert {"FedGOConfig", "DaFKDConfig", "FedGKDPlusConfig", "CPFLConfig"} <= set(chained)


def test_a_partial_nested_section_starts_from_its_fields_own_default() -> None:
    """Co-Boosting + FedGO's generator defaults to ``steps: 0`` (untrained, its docs say) where
    the ``GeneratorConfig`` class says 1000: overriding another generator key must keep 0."""
    from strategies import load_experiment

    plain = load_experiment(None, ["strategy.name=coboosting_fedgo"]).strategy.params
    assert plain.generator.steps == 0
    partial = load_experiment(
        None, ["strategy.name=coboosting_fedgo", "strategy.generator.width=8"]
    ).strategy.params
    assert partial.generator.width == 8 and partial.generator.steps == 0
    given = load_experiment(
        None, ["strategy.name=coboosting_fedgo", "strategy.generator.steps=7"]
    ).strategy.params
    assert given.generator.steps == 7
    # a section whose field default is the class default is unchanged by this
    fedgo = load_experiment(None, ["strategy.name=fedgo", "strategy.generator.width=8"])
    assert fedgo.strategy.params.generator.steps == type(fedgo.strategy.params.generator)().steps
