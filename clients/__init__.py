"""Client-side algorithms, one module per algorithm, found by name (``clients/<name>.py``).

Each module defines one :class:`clients.base.ClientAlgorithm` subclass whose ``name`` is the
module's name; a strategy names the one its clients run (``Strategy.client_algorithm``).
"""

from __future__ import annotations

import sys

from clients.base import ClientAlgorithm, ClientJob, EmptyConfig
from fedgo_flwr.runtime.plugins import load_class, module_names

__all__ = ["ClientAlgorithm", "ClientJob", "EmptyConfig", "available", "client_class"]


def available() -> list[str]:
    """Names of every client algorithm module."""
    return module_names(sys.modules[__name__])


def client_class(name: str) -> type[ClientAlgorithm]:
    """The client algorithm of module ``clients.<name>`` (``ValueError`` if there is none)."""
    return load_class(sys.modules[__name__], name, ClientAlgorithm, "client algorithm")
