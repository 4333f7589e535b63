"""Fixtures shared by the test modules."""

from __future__ import annotations

import logging

import pytest
from side_by_side import lock_for_this_run

SIDE_BY_SIDE = lock_for_this_run()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under pytest-xdist, a test marked ``alone`` runs with no other test beside it
    (``tests/side_by_side.py``); its module's fixtures, set up in its protocol, too."""
    if SIDE_BY_SIDE is None:
        return (yield)
    with SIDE_BY_SIDE.hold(exclusive=item.get_closest_marker("alone") is not None):
        return (yield)


@pytest.fixture
def flwr_log(caplog):
    """Flower's WARNING records (its logger does not propagate by default)."""
    logger = logging.getLogger("flwr")
    old = logger.propagate
    logger.propagate = True
    caplog.set_level(logging.WARNING, logger="flwr")
    yield caplog
    logger.propagate = old
