"""Fixtures shared by the test modules."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture
def flwr_log(caplog):
    """Flower's WARNING records (its logger does not propagate by default)."""
    logger = logging.getLogger("flwr")
    old = logger.propagate
    logger.propagate = True
    caplog.set_level(logging.WARNING, logger="flwr")
    yield caplog
    logger.propagate = old
