"""Import a module of the ``benchmarks`` package, for the tests of the benchmark drivers."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as the module ``benchmarks.<name>`` (as ``python -m
    benchmarks.<name>`` runs it from the repository's root, which is put on ``sys.path``)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(f"benchmarks.{name}")
