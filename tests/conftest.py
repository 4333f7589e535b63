"""Fixtures shared by the test modules, and the tier markers.

The tests are in three folders, and each test is marked with its folder's name:
``tests/unit`` (pure functions, no federated run), ``tests/integration`` (in-process runs on tiny
data) and ``tests/e2e`` (Ray, ``run.sh``, ``flwr run``, a deployment, network namespaces). So
``-m "not e2e"`` is the edit-test loop and ``-m unit`` the quickest check. The shared helpers
(``helpers.py``, ``deployment_helpers.py``, ...) stay in ``tests/``, on the path of every tier (put
there below, not by ``pythonpath`` in pyproject.toml: ``run.sh`` re-installs ``.venv`` whenever
that file changes).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path

# The golden runs (tests/integration/test_golden_runs.py) compare a run's floats bit for bit.
# On x86 torch, oneDNN, MKL and NumPy's OpenBLAS each pick their kernels by the CPU's widest
# vector instructions, and AVX-512 kernels round differently from the AVX2 ones the runs were
# recorded with. So the tests cap all four at AVX2 (Haswell is OpenBLAS's AVX2 core; an AVX2
# machine is unaffected), set here before torch or NumPy is first imported and inherited by the
# xdist workers and every process a test starts. A machine without AVX2, or not x86, still
# differs in the last bits.
KERNEL_LEVEL = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "OPENBLAS_CORETYPE": "Haswell",
}
for _key, _value in KERNEL_LEVEL.items():
    os.environ.setdefault(_key, _value)

import pytest  # noqa: E402 - after the kernel level

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


TIERS = {
    "unit": "tests/unit: pure functions, no federated run",
    "integration": "tests/integration: in-process runs on tiny data",
    "e2e": "tests/e2e: Ray, run.sh, flwr run, a deployment, network namespaces",
}


def pytest_configure(config):
    for name, what in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {what} (set by tests/conftest.py)")
    config.addinivalue_line(
        "markers",
        "torch_threads: keeps torch's thread handling (the unit and integration tiers hold "
        "one thread otherwise: tests/helpers.py, one_torch_thread)",
    )


def _tier_can_match(markexpr: str, tier: str) -> bool:
    """Whether a test of ``tier`` can match the ``-m`` expression: true for some choice of
    the other markers the expression names (a test carries its tier and no other tier)."""
    if not markexpr:
        return True
    from itertools import product

    from _pytest.mark.expression import Expression

    expression = Expression.compile(markexpr)
    names = sorted(set(re.findall(r"[A-Za-z_][\w.-]*", markexpr)) - {"and", "or", "not"})
    others = [n for n in names if n not in TIERS]
    for values in product((False, True), repeat=len(others)):
        chosen = dict(zip(others, values, strict=True))
        if expression.evaluate(lambda name, c=chosen, **_: c.get(name, name == tier)):
            return True
    return False


def pytest_ignore_collect(collection_path, config):
    """A tier's folder that the ``-m`` expression leaves out entirely is not imported (``-m
    "not e2e"``, ``-m unit``): importing the e2e modules alone (Ray, Flower's simulation) costs
    every pytest-xdist worker 2-3 s of collection."""
    path = Path(collection_path)
    if path.parent == HERE and path.name in TIERS:
        if not _tier_can_match(config.getoption("markexpr", ""), path.name):
            return True
    return None


def pytest_collection_modifyitems(config, items):
    """Mark every test with its tier, the folder under ``tests/`` it is in."""
    for item in items:
        parts = Path(item.path).resolve().relative_to(HERE).parts
        if len(parts) > 1 and parts[0] in TIERS:
            item.add_marker(parts[0])


@pytest.fixture
def flwr_log(caplog):
    """Flower's WARNING records (its logger does not propagate by default)."""
    logger = logging.getLogger("flwr")
    old = logger.propagate
    logger.propagate = True
    caplog.set_level(logging.WARNING, logger="flwr")
    yield caplog
    logger.propagate = old


@pytest.fixture(autouse=True)
def _kernel_switches():
    """Every test starts and ends with the process-wide kernel switches of
    :mod:`fedgo_flwr.runtime.kernels` (channels-last, precision, the GPU inference batch) as
    it found them: a run or benchmark that sets one (``resources.channels_last``, a profiling
    setting) would otherwise leak it into whichever test its worker runs next."""
    from fedgo_flwr.runtime import kernels

    saved = (kernels._channels_last, kernels._precision, kernels._gpu_inference_batch)
    yield
    kernels._channels_last, kernels._precision, kernels._gpu_inference_batch = saved
