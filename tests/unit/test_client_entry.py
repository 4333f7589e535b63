"""The ClientApp Flower loads (fedgo_app.client_entry): light to import, and the same replies as
the handlers it fronts."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from flwr.app import Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedgo_app import client_entry
from fedgo_app.client_app import app as handlers
from fedgo_flwr.runtime import messages as msgs

ROOT = Path(__file__).resolve().parents[2]


def test_flower_loads_the_front():
    components = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert components["components"]["clientapp"] == "fedgo_app.client_entry:app"


def _run(code: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**base, "PYTHONPATH": str(ROOT), **env},
        cwd=ROOT,
    )
    return out.stdout.strip()


def test_importing_the_front_imports_neither_torch_nor_the_handlers():
    code = (
        "import json, sys, os; import fedgo_app.client_entry; "
        "print(json.dumps([m in sys.modules for m in ('torch', 'fedgo_app.client_app', 'clients')]"
        " + [os.environ.get(k) for k in ('RAY_enable_worker_prestart', "
        "'RAY_prestart_worker_first_driver')]))"
    )
    assert json.loads(_run(code)) == [False, False, False, "0", "0"]


def test_a_users_ray_setting_wins():
    code = "import os, fedgo_app.client_entry; print(os.environ['RAY_enable_worker_prestart'])"
    assert _run(code, RAY_enable_worker_prestart="1") == "1"


@pytest.fixture
def identity(monkeypatch):
    """Flower's process identity, which a Message needs (a run's processes have it)."""
    for key, value in (("run_id", 1), ("task_id", 1), ("node_id", 0)):
        monkeypatch.setattr(TaskIdentity, f"_{key}", value, raising=False)


def _query(node_config: dict) -> tuple[Message, Context]:
    msg = Message(content=RecordDict(), dst_node_id=5, message_type="query")
    ctx = Context(run_id=1, node_id=5, node_config=node_config, state=RecordDict(), run_config={})
    return msg, ctx


def test_the_front_answers_as_the_handlers_do(identity):
    app = pickle.loads(pickle.dumps(client_entry.app))  # as Flower ships it to a Ray actor
    got = app(*_query({"partition-id": 3, "num-partitions": 7}))
    want = handlers(*_query({"partition-id": 3, "num-partitions": 7}))
    assert not got.has_error()
    assert dict(got.content[msgs.METRICS]) == dict(want.content[msgs.METRICS])
    assert got.content[msgs.METRICS][msgs.PARTITION_ID] == 3


def test_a_handlers_error_reaches_the_caller(identity):
    with pytest.raises(ValueError, match="partition-id"):  # no partition-id: refused
        client_entry.app(*_query({}))
