"""Import a script of ``benchmarks/`` as a module, for the tests of the benchmark drivers."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` imported as the module ``name``.

    Run as a script, a driver finds its siblings (``sweep``, ``fedgo_table3`` ...) on
    ``sys.path[0]``; the benchmarks folder is on the path while the script is imported, and
    taken off again after.
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(BENCHMARKS))
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module
