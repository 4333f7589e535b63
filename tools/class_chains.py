"""How deep each strategy's class chain is: project classes in its MRO, methods, overrides.

A strategy is read through its class chain (every project class in its method resolution order,
``strategies/*`` and ``fedgo_flwr/*``; Flower's and ``object`` are not counted). For each
strategy class this prints the number of project classes, the methods they define (distinct
names of functions, class and static methods and properties) and how many of those names more
than one class of the chain defines (overrides). ``tests/unit/test_architecture.py`` holds the
limit on the chain's length.

Run from the repository root::

    PYTHONPATH=$PWD python tools/class_chains.py [strategy ...]
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass

PROJECT = ("strategies", "fedgo_flwr", "fedgo_app")
DEFAULT = ("fedavg", "feddf", "fedgo", "cpfl", "coboosting_fedgo")


@dataclass(frozen=True)
class Chain:
    strategy: str
    classes: tuple[str, ...]  # project classes in MRO order
    methods: int
    overridden: int


def _is_method(value: object) -> bool:
    return isinstance(value, (staticmethod, classmethod, property)) or inspect.isfunction(value)


def chain(cls: type) -> Chain:
    """The project classes of ``cls``'s MRO and the methods they define."""
    own = [c for c in cls.__mro__ if c.__module__.split(".")[0] in PROJECT]
    defined: dict[str, int] = {}
    for c in own:
        for name, value in vars(c).items():
            if _is_method(value):
                defined[name] = defined.get(name, 0) + 1
    return Chain(
        strategy=getattr(cls, "name", cls.__name__),
        classes=tuple(f"{c.__module__}.{c.__qualname__}" for c in own),
        methods=len(defined),
        overridden=sum(1 for n in defined.values() if n > 1),
    )


def main(names: list[str]) -> None:
    from strategies import strategy_class

    print("| strategy | project classes | methods | overridden |")
    print("|---|---|---|---|")
    for name in names or DEFAULT:
        c = chain(strategy_class(name))
        print(f"| {c.strategy} | {len(c.classes)} | {c.methods} | {c.overridden} |")
    for name in names or DEFAULT:
        c = chain(strategy_class(name))
        print(f"{c.strategy}: " + " -> ".join(x.rsplit(".", 1)[-1] for x in c.classes))


if __name__ == "__main__":
    main(sys.argv[1:])
