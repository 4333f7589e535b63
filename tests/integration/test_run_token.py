"""The server's run token names the client's state folder (issue 12): only the server's own
form is taken, and the folder must resolve inside the node's base folder."""

from __future__ import annotations

import pytest
from helpers import log_messages, rows_of, tiny_config

from fedgo_app import server_app as server_app_module
from fedgo_app.inprocess import run_inprocess
from fedgo_flwr.records.checkpoint import (
    new_run_token,
)

# -- the run token and the node's folder ---------------------------------------------------


@pytest.mark.parametrize("kind", ["climbing", "absolute", "symlink"])
def test_a_run_token_cannot_steer_the_client_out_of_its_folder(
    tmp_path, monkeypatch, flwr_log, kind
):
    outside = tmp_path / "outside"
    out = tmp_path / "run"
    token = {"climbing": "../../outside", "absolute": str(outside)}.get(kind, new_run_token())
    if kind == "symlink":  # a valid token whose folder is a link out of the base
        (out / "client-state").mkdir(parents=True)
        outside.mkdir()
        (out / "client-state" / token).symlink_to(outside)
    monkeypatch.setattr(server_app_module, "new_run_token", lambda: token)
    run_inprocess(tiny_config(out, "strategy.name=scaffold"))
    assert not list(outside.rglob("*.pt")), "the client wrote outside its state folder"
    row = rows_of(out)[1]
    assert row["clients_replied"] == 0 and row["clients_failed"] == 2
    dropped = [m for m in log_messages(flwr_log) if "Dropping reply" in m]
    assert len(dropped) == 2
    assert all("run token" in m or "outside" in m for m in dropped), dropped
