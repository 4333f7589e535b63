"""``resources.local_workers``: ``--local`` with a round's clients in worker processes.

The same tiny runs with 1 and 2 workers give the same metrics (a strategy with client state
across rounds too); the workers really serve the clients (their log lines, with their own
process ids, reach the run's log); the first free worker takes the next message, a node's
``Context.state`` going with it; a worker that dies gives an error reply, not a hang, its node
keeps its earlier state and a new worker goes on; replies come in the messages' order, late
ones dropped.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from helpers import rows_of, tiny_config, without_timing

from fedgo_app import client_app
from fedgo_app.inprocess import run_inprocess
from fedgo_app.local_workers import LocalWorkers, resolve_workers
from fedgo_flwr.learning.task import sample_clients


def _run(tmp_path, name: str, *overrides: str) -> list[dict]:
    run_inprocess(tiny_config(tmp_path / name, "rounds=3", *overrides))
    return rows_of(tmp_path / name)


@pytest.mark.parametrize("strategy", ["fedavg", "scaffold"])
def test_metrics_do_not_depend_on_the_worker_count(tmp_path, strategy, monkeypatch):
    """SCAFFOLD keeps each client's control variate in its node's Context.state (alone: without
    ``checkpoint`` no state file keeps it too): a worker that lost it would train round 3's
    returning clients differently."""
    one = _run(tmp_path, "one", f"strategy.name={strategy}", "checkpoint=false")
    # each process says once which device its clients train on: let the workers say it
    monkeypatch.setattr(client_app, "_logged_devices", set())
    two = _run(
        tmp_path,
        "two",
        f"strategy.name={strategy}",
        "checkpoint=false",
        "resources.local_workers=2",
    )
    assert [r["round"] for r in two] == [0, 1, 2, 3]
    assert [r["clients_replied"] for r in two[1:]] == [2, 2, 2]
    assert without_timing(two) == without_timing(one)
    # a returning client (SCAFFOLD's state matters only then)
    rounds = [set(sample_clients(0, r, 4, 2)) for r in (1, 2, 3)]
    assert rounds[2] & (rounds[0] | rounds[1])
    # Two worker processes trained the clients; their log lines reached run.log.
    log = (tmp_path / "two" / "run.log").read_text()
    pids = set(re.findall(r"fedgo-flwr client: training on cpu \(pid (\d+)\)", log))
    assert len(pids) == 2 and str(os.getpid()) not in pids


def test_a_client_that_ends_its_worker_fails_its_round_and_the_run_goes_on(tmp_path):
    """The ``exit`` fault ends the client's process: with workers, only that worker."""
    victim = sample_clients(0, 1, 4, 2)[0]
    fault = f"faults=[{{partition: {victim}, round: 1, kind: exit}}]"
    rows = _run(tmp_path, "exit", "resources.local_workers=2", fault)
    assert [(r["clients_replied"], r["clients_failed"]) for r in rows[1:]] == [
        (1, 1),
        (2, 0),
        (2, 0),
    ]
    log = (tmp_path / "exit" / "run.log").read_text()
    assert "ended (exit code 1) before replying" in log


def _test_app() -> ClientApp:
    """Sleeps the message's ``sleep`` seconds, counts the messages its node has had in
    ``Context.state`` and replies with its process id, its node, what it slept and the count."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context) -> Message:
        sleep = float(msg.content["config"]["sleep"])
        time.sleep(sleep)
        count = int(context.state["count"]["n"]) + 1 if "count" in context.state else 1
        context.state["count"] = ConfigRecord({"n": count})
        reply = {"pid": os.getpid(), "node": context.node_id, "slept": sleep, "count": count}
        return Message(content=RecordDict({"config": ConfigRecord(reply)}), reply_to=msg)

    return app


def _said(replies: list[Message], key: str) -> list:
    return [r.content["config"][key] for r in replies]


def _messages(*sleeps: tuple[int, float]) -> list[Message]:
    return [
        Message(
            content=RecordDict({"config": ConfigRecord({"sleep": s})}),
            dst_node_id=node,
            message_type="train",
        )
        for node, s in sleeps
    ]


@pytest.fixture
def workers():
    nodes = {n: {"partition-id": n - 2} for n in (2, 3, 4, 5)}
    pool = LocalWorkers(_test_app(), nodes, 2)
    yield pool
    pool.close()


def test_replies_come_in_the_messages_order_and_late_ones_are_dropped(workers):
    # node 2 is slow, nodes 3 and 5 fast (the other worker): their replies wait for node 2's
    replies = list(workers.serve(_messages((2, 0.4), (3, 0.0), (5, 0.0))))
    assert [r.metadata.src_node_id for r in replies] == [2, 3, 5]
    pids = _said(replies, "pid")
    assert pids[0] != pids[1] == pids[2] and os.getpid() not in pids
    late = list(workers.serve(_messages((2, 0.5), (3, 0.0)), timeout=0.3))
    assert [r.metadata.src_node_id for r in late] == [3]


def test_a_caller_that_stops_early_leaves_the_workers_ready_for_the_next_round(workers):
    stream = workers.serve(_messages((2, 0.0), (3, 0.3), (4, 0.0), (5, 0.0)))
    assert next(stream).metadata.src_node_id == 2
    stream.close()  # node 3's message is in flight; 4 and 5 may never be sent
    assert workers.idle()
    replies = list(workers.serve(_messages((3, 0.0), (4, 0.0))))
    assert [r.metadata.src_node_id for r in replies] == [3, 4]
    assert _said(replies, "slept") == [0.0, 0.0]  # not the stale 0.3


def test_a_killed_worker_gives_an_error_reply_and_its_node_keeps_its_state(workers):
    list(workers.serve(_messages((2, 0.0), (3, 0.0))))  # both started; node 2 has count 1
    victim = workers.pids()[0]
    killer = threading.Timer(0.5, os.kill, (victim, signal.SIGKILL))  # while node 2 sleeps
    started = time.monotonic()
    killer.start()
    replies = list(workers.serve(_messages((2, 5.0), (4, 0.0), (3, 0.0))))
    killer.join()
    assert time.monotonic() - started < 4  # not the 5 s the handler would sleep
    assert [r.metadata.src_node_id for r in replies] == [2, 4, 3]
    assert [r.has_error() for r in replies] == [True, False, False]  # only the killed message
    assert replies[0].error.code == ErrorCode.CLIENT_APP_CRASHED
    assert f"pid {victim}" in replies[0].error.reason and "node 2" in replies[0].error.reason
    again = list(workers.serve(_messages((2, 0.0))))
    assert not again[0].has_error() and again[0].content["config"]["pid"] != victim
    assert again[0].content["config"]["count"] == 2  # the state from before the killed message


def test_the_first_free_worker_takes_the_next_message(workers):
    """Node 2 is slow: the other worker serves every other node meanwhile (a fixed share of the
    nodes per worker would give node 4 to node 2's worker, after it)."""
    started = time.monotonic()
    replies = list(workers.serve(_messages((2, 1.5), (3, 0.05), (4, 0.05), (5, 0.05))))
    pids = _said(replies, "pid")
    assert pids[0] not in pids[1:] and len(set(pids[1:])) == 1
    assert time.monotonic() - started < 2.9  # not 1.5 + 0.05 s and then the rest


def test_a_nodes_state_goes_with_it_to_whichever_worker_serves_it(workers):
    first = list(workers.serve(_messages((2, 0.3), (3, 0.0))))
    second = list(workers.serve(_messages((3, 0.3), (2, 0.0))))  # the workers swap nodes
    assert _said(first, "node") == [2, 3] and _said(second, "node") == [3, 2]
    assert _said(first, "pid")[0] == _said(second, "pid")[0]  # the worker of node 2, then of 3
    assert _said(first, "count") == [1, 1] and _said(second, "count") == [2, 2]
    assert workers.state(2)["count"]["n"] == 2 and workers.state(5) == RecordDict()


def test_two_messages_to_one_node_run_one_after_the_other(workers):
    """The second needs the state the first leaves: it waits for it, though a worker is free."""
    replies = list(workers.serve(_messages((2, 0.3), (2, 0.0), (3, 0.0))))
    assert _said(replies, "node") == [2, 2, 3]
    assert _said(replies, "count") == [1, 2, 1]


def test_a_worker_that_ended_between_rounds_is_replaced(workers):
    list(workers.serve(_messages((2, 0.0), (3, 0.0))))
    victim = workers.pids()[1]
    os.kill(victim, signal.SIGKILL)
    workers.slots[1].process.join(5)  # it has ended before the next round's messages
    replies = list(workers.serve(_messages((3, 0.0), (2, 0.0))))
    assert [r.has_error() for r in replies] == [False, False]
    assert replies[0].content["config"]["pid"] not in (victim, os.getpid())


@pytest.mark.parametrize(
    ("value", "nodes", "cpus", "client_cpus", "expected"),
    [
        (1, 10, 8, 1, 1),
        (4, 10, 2, 1, 4),  # as asked, even beyond the CPUs
        (4, 3, 2, 1, 3),  # never more than the nodes
        ("auto", 10, 8, 2, 4),  # one per client_cpus of the CPUs
        ("auto", 2, 8, 1, 2),
    ],
)
def test_worker_count(value, nodes, cpus, client_cpus, expected):
    assert resolve_workers(value, nodes, cpus, client_cpus) == expected
