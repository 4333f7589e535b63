"""Algorithms found by module name (the FL-bench convention): ``<package>/<name>.py``.

``strategies/`` and ``clients/`` each hold one module per algorithm, defining one class whose
``name`` is the module's name. Nothing lists them: :func:`module_names` finds the modules and
:func:`load_class` imports the one asked for.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

__all__ = ["load_class", "module_names"]

_NOT_ALGORITHMS = {"base"}


def module_names(package: ModuleType) -> list[str]:
    """Names of the algorithm modules of ``package`` (private and ``base`` modules excluded)."""
    return sorted(
        m.name
        for m in pkgutil.iter_modules(list(package.__path__))
        if not m.name.startswith("_") and m.name not in _NOT_ALGORITHMS
    )


def load_class(package: ModuleType, name: str, base: type, what: str) -> type:
    """The subclass of ``base`` with ``name`` defined in module ``<package>.<name>``.

    ``ValueError`` names ``what`` was asked for and lists the known names.
    """
    known = module_names(package)
    if name not in known:
        raise ValueError(f"unknown {what} '{name}'; choose one of {', '.join(known)}")
    module = importlib.import_module(f"{package.__name__}.{name}")
    for value in vars(module).values():
        if (
            isinstance(value, type)
            and issubclass(value, base)
            and value.__module__ == module.__name__
            and getattr(value, "name", None) == name
        ):
            return value
    raise ValueError(
        f"{package.__name__}/{name}.py defines no {base.__name__} subclass with name = '{name}'"
    )
