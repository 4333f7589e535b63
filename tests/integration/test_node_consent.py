"""What the node decides, not the server (issue 12): ``faults`` (crash, exit, ...) act only on
a node that opted in through its own config, and the thread count the server asks for is
capped by the node."""

from __future__ import annotations

import os

import pytest
import torch
from helpers import log_messages, rows_of, tiny_config

from fedgo_app.client_app import node_cpus
from fedgo_app.inprocess import run_inprocess
from fedgo_flwr.learning.task import sample_clients

# -- faults need the node's consent --------------------------------------------------------


@pytest.mark.parametrize("kind", ["crash", "exit", "nan"])
def test_a_node_that_did_not_opt_in_ignores_faults(tmp_path, monkeypatch, flwr_log, kind):
    def no_exit(status):  # an obeyed `exit` fault would end pytest
        raise RuntimeError(f"os._exit({status}) called")

    monkeypatch.setattr(os, "_exit", no_exit)
    monkeypatch.delenv("FEDGO_ALLOW_FAULTS", raising=False)
    bad = sample_clients(0, 1, 4, 2)[0]
    cfg = tiny_config(tmp_path, f"faults=[{{partition: {bad}, round: 1, kind: {kind}}}]")
    run_inprocess(cfg, node_config={"allow-faults": False})
    row = rows_of(tmp_path)[1]
    assert row["clients_replied"] == 2 and row["clients_failed"] == 0
    ignored = [m for m in log_messages(flwr_log) if "ignoring the server's injected fault" in m]
    assert len(ignored) == 1 and f"client {bad}," in ignored[0] and kind in ignored[0]


def test_faults_act_on_a_node_that_opted_in(tmp_path, monkeypatch):
    """Through node config (run_inprocess's default) or, without one, the environment."""
    bad = sample_clients(0, 1, 4, 2)[0]
    fault = f"faults=[{{partition: {bad}, round: 1, kind: crash}}]"
    run_inprocess(tiny_config(tmp_path / "node-config", fault))
    assert rows_of(tmp_path / "node-config")[1]["clients_failed"] == 1
    monkeypatch.setenv("FEDGO_ALLOW_FAULTS", "1")
    run_inprocess(tiny_config(tmp_path / "env", fault), node_config={"allow-faults": None})
    assert rows_of(tmp_path / "env")[1]["clients_failed"] == 1
    # The node's explicit "no" wins over the environment.
    run_inprocess(tiny_config(tmp_path / "no", fault), node_config={"allow-faults": "false"})
    assert rows_of(tmp_path / "no")[1]["clients_failed"] == 0


# -- threads -------------------------------------------------------------------------------


@pytest.fixture
def keep_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.torch_threads
def test_the_server_cannot_ask_a_client_for_more_threads_than_it_has(
    tmp_path, keep_threads, monkeypatch
):
    import fedgo_app.client_app as client_app

    used: list[int] = []  # the thread counts the client handler set (the grid restores the
    real = client_app.client_threads  # server's after each call, so read them here)
    monkeypatch.setattr(client_app, "client_threads", lambda *a: used.append(real(*a)) or used[-1])
    cpus = node_cpus()
    run_inprocess(tiny_config(tmp_path / "a", f"resources.client_cpus={cpus + 3}"))
    assert used and set(used) == {cpus}
    # A node may set a lower limit of its own.
    used.clear()
    run_inprocess(tiny_config(tmp_path / "b", "resources.client_cpus=2"), {"max-threads": 1})
    assert used and set(used) == {1}


@pytest.mark.torch_threads
def test_the_in_process_server_keeps_its_own_threads(tmp_path, keep_threads):
    torch.set_num_threads(2)
    run_inprocess(tiny_config(tmp_path, "resources.client_cpus=1", "resources.server_cpus=2"))
    assert torch.get_num_threads() == 2  # not the clients' 1
