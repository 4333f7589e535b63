"""Flower's SuperNode heartbeat interval shortened, for a test's SuperNode only.

Python imports this module at start-up in every process whose ``PYTHONPATH`` holds this folder
(``tests/deployment_helpers.py`` puts it there for the SuperNodes given ``heartbeat_s``, and
their ClientApp processes inherit it). With ``FEDGO_TEST_HEARTBEAT_S`` set, Flower's default
heartbeat interval (``HEARTBEAT_DEFAULT_INTERVAL``, 30 s in Flower 1.42) becomes that many
seconds before any Flower module reads it: the node then sends a heartbeat every 0.8 x
(interval - 5 s) and the SuperLink reports it unavailable 2 x interval after the last one
(the SuperLink accepts 10 s to 30 min). Nothing else changes.
"""

import os

_seconds = os.environ.get("FEDGO_TEST_HEARTBEAT_S")
if _seconds:
    import flwr.common.constant as _constant

    _constant.HEARTBEAT_DEFAULT_INTERVAL = float(_seconds)
