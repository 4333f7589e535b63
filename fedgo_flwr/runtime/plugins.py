"""Algorithms found by module name (the FL-bench convention): ``<package>/<name>.py``.

``strategies/`` and ``clients/`` each hold one module per algorithm, defining one class whose
``name`` is the module's name. Nothing lists them: :func:`module_names` finds the modules and
:func:`load_class` imports the one asked for. :func:`client_algorithms` lists the client
algorithms without importing ``clients`` (the server side must not).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
from collections.abc import Iterable
from types import ModuleType

__all__ = ["client_algorithms", "load_class", "module_names", "package_module_names"]

_NOT_ALGORITHMS = {"base"}
CLIENTS = "clients"
"""The package of the client algorithms (``clients/<name>.py``)."""


def _algorithm_names(paths: Iterable[str]) -> list[str]:
    return sorted(
        m.name
        for m in pkgutil.iter_modules(list(paths))
        if not m.name.startswith("_") and m.name not in _NOT_ALGORITHMS
    )


def module_names(package: ModuleType) -> list[str]:
    """Names of the algorithm modules of ``package`` (private and ``base`` modules excluded)."""
    return _algorithm_names(package.__path__)


def package_module_names(package: str) -> list[str]:
    """:func:`module_names` of the top-level package named ``package``, without importing it:
    its folders are those of the imported package if it is imported, else where the import
    system would find it (``ModuleNotFoundError``: nowhere)."""
    module = sys.modules.get(package)
    if module is not None:
        return module_names(module)
    spec = importlib.util.find_spec(package)
    if spec is None or spec.submodule_search_locations is None:
        raise ModuleNotFoundError(f"no package {package!r}", name=package)
    return _algorithm_names(spec.submodule_search_locations)


def client_algorithms() -> list[str]:
    """Names of every client algorithm module (``clients/<name>.py``), ``clients`` not imported."""
    return package_module_names(CLIENTS)


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
