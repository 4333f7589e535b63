"""Replies are folded in one at a time as they arrive, and arrival order does not matter."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedgo_app.inprocess import InProcessGrid, run_inprocess
from fedgo_flwr.learning.aggregation import RunningAverage, weighted_average
from fedgo_flwr.runtime.messages import stream_replies
from strategies import load_experiment
from strategies.feddf import FedDF

ROOT = Path(__file__).resolve().parents[2]
TINY = ["rounds=2", "data.num_clients=4", "train.local_epochs=1", "data.alpha=1.0"]


def run(tmp_path: Path, *overrides: str) -> list[dict]:
    cfg = load_experiment(ROOT / "conf/default.yaml", [*TINY, f"output_dir={tmp_path}", *overrides])
    run_inprocess(cfg)
    return [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def test_each_reply_is_absorbed_before_the_next_is_pulled(tmp_path, monkeypatch):
    pulled = {"n": 0}
    seen: list[tuple[int, int]] = []
    original_stream = InProcessGrid.stream
    original_absorb = FedDF.absorb
    original_aggregate = FedDF.aggregate

    def counting_stream(self, messages, *, timeout=None):
        for reply in original_stream(self, messages, timeout=timeout):
            pulled["n"] += 1
            yield reply

    original_begin = FedDF.begin_round

    def begin_round(self, server_round):
        pulled["n"] = 0  # count this round's replies only
        original_begin(self, server_round)

    def absorb(self, server_round, reply):
        seen.append((pulled["n"], len(self.bank)))
        original_absorb(self, server_round, reply)

    def aggregate(self, server_round, replies):
        assert all(r.arrays == {} for r in replies), "a client model was kept"
        return original_aggregate(self, server_round, replies)

    monkeypatch.setattr(InProcessGrid, "stream", counting_stream)
    monkeypatch.setattr(FedDF, "begin_round", begin_round)
    monkeypatch.setattr(FedDF, "absorb", absorb)
    monkeypatch.setattr(FedDF, "aggregate", aggregate)
    run(tmp_path, "fraction=1.0", "strategy.name=feddf", "strategy.distill.epochs=1")
    # Round r's k-th absorb happens right after its k-th reply arrived (no read-ahead).
    assert seen == [(k + 1, k) for _ in range(2) for k in range(4)]


@pytest.mark.parametrize(
    "overrides",
    [
        ["strategy.name=fedavg"],
        ["strategy.name=scaffold"],
        ["strategy.name=feddf", "strategy.distill.epochs=1", "strategy.weighting=entropy"],
    ],
    ids=["fedavg", "scaffold", "feddf"],
)
def test_arrival_order_does_not_change_the_run(tmp_path, monkeypatch, overrides):
    straight = run(tmp_path / "a", "fraction=1.0", *overrides)
    original_stream = InProcessGrid.stream

    def reversed_stream(self, messages, *, timeout=None):
        yield from reversed(list(original_stream(self, messages, timeout=timeout)))

    monkeypatch.setattr(InProcessGrid, "stream", reversed_stream)
    backwards = run(tmp_path / "b", "fraction=1.0", *overrides)
    keys = ("test_accuracy", "test_loss", "train_loss", "distill_loss", "pl_acc_uniform")
    for a, b in zip(straight, backwards, strict=True):
        assert {k: a.get(k) for k in keys} == {k: b.get(k) for k in keys}
    model_a = torch.load(tmp_path / "a" / "model.pt")
    model_b = torch.load(tmp_path / "b" / "model.pt")
    assert all(torch.equal(model_a[k], model_b[k]) for k in model_a)


class FakeGrid:
    """Replies become available at given times after the push."""

    def __init__(self, delays: dict[str, float]) -> None:
        self.delays = delays
        self.pulls = 0

    def push_messages(self, messages):
        self.t0 = time.monotonic()
        return list(self.delays)

    def pull_messages(self, ids):
        self.pulls += 1
        now = time.monotonic() - self.t0
        return [
            SimpleNamespace(
                metadata=SimpleNamespace(reply_to_message_id=i),
                content=RecordDict(),
                has_error=lambda: False,
            )
            for i in sorted(ids)
            if self.delays[i] <= now
        ]


def test_stream_replies_yields_in_arrival_order_and_stops_at_the_timeout():
    grid = FakeGrid({"a": 0.3, "b": 0.0, "c": 5.0})
    t0 = time.monotonic()
    got = [m.metadata.reply_to_message_id for m in stream_replies(grid, [], 0.8, 0.05)]
    elapsed = time.monotonic() - t0
    assert got == ["b", "a"]  # "c" comes after the timeout
    assert 0.75 <= elapsed < 1.5
    grid = FakeGrid({"a": 0.0, "b": 0.1})
    t0 = time.monotonic()
    assert len(list(stream_replies(grid, [], 60, 0.05))) == 2
    assert time.monotonic() - t0 < 1.0  # returns as soon as all came, not at the timeout


def test_replies_that_come_close_together_are_picked_up_without_the_full_poll_interval():
    """After a reply the next pull comes within tens of milliseconds and the wait then backs
    off: a reply 0.6 s after the first is pulled long before a 3 s poll interval ends (a
    fixed interval would take 3 s), with a handful of pulls, not one every few milliseconds."""
    grid = FakeGrid({"a": 0.0, "b": 0.6})
    t0 = time.monotonic()
    assert len(list(stream_replies(grid, [], 60, 3.0))) == 2
    assert time.monotonic() - t0 < 1.5
    assert grid.pulls <= 10
    # Nothing arriving: the waits grow to poll_interval (about 0.02+0.04+0.08+0.16+0.2*k s).
    grid = FakeGrid({"a": 99.0})
    assert list(stream_replies(grid, [], 1.2, 0.2)) == []
    assert 5 <= grid.pulls <= 12


def test_running_average_matches_the_batch_average_in_any_order():
    rng = np.random.default_rng(0)
    sets = [{"w": rng.normal(size=(50, 7)).astype(np.float32), "n": np.array(k)} for k in range(9)]
    weights = rng.integers(1, 500, size=9).astype(float)
    forward = weighted_average(sets, weights)
    running = RunningAverage()
    for i in rng.permutation(9):
        running.add(sets[i], weights[i])
    shuffled = running.result()
    assert np.array_equal(forward["w"], shuffled["w"]) and forward["n"] == shuffled["n"]
    terms = [w * s["w"].astype(np.float64) for s, w in zip(sets, weights, strict=True)]
    exact = sum(terms) / weights.sum()
    np.testing.assert_allclose(forward["w"], exact, rtol=1e-6, atol=1e-7)


class SuperLinkGrid:
    """Pushes like Flower's deployment grid (message ids set, returned in order); every reply
    is the error the SuperLink makes for a message whose node stopped sending heartbeats."""

    def push_messages(self, messages):
        self.sent = list(messages)
        for msg in self.sent:
            msg.metadata.__dict__["_message_id"] = msg.object_id
        return [msg.metadata.message_id for msg in self.sent]

    def pull_messages(self, ids):
        from flwr.server.superlink.linkstate.utils import (
            create_message_error_unavailable_res_message,
        )

        return [
            create_message_error_unavailable_res_message(m.metadata, "node_unavail")
            for m in self.sent
            if m.metadata.message_id in ids
        ]


def test_a_reply_the_superlink_makes_for_an_unavailable_node_names_that_node(monkeypatch):
    """The SuperLink sends "Node Unavailable" from its own node id (1); the reply must still
    count for the node the message went to, or the strategy blames "client -1 (node 1)" and
    also reports the real client as silent (two failures for one)."""
    for key, value in {"_run_id": 1, "_task_id": 1, "_node_id": 1}.items():
        monkeypatch.setattr(TaskIdentity, key, value)  # what a ServerApp process has
    messages = [
        Message(content=RecordDict(), dst_node_id=node, message_type=MessageType.TRAIN)
        for node in (7, 8)
    ]
    replies = list(stream_replies(SuperLinkGrid(), messages, 5, 0.01))
    assert sorted(r.metadata.src_node_id for r in replies) == [7, 8]
    assert all(r.has_error() and "Node Unavailable" in r.error.reason for r in replies)


def test_the_server_uses_its_waiting_threads_until_the_last_reply_is_pulled(monkeypatch):
    """resources.server_cpus_waiting: the work on replies that come while other clients train
    runs on that many threads; the last pull's replies, and everything after, on all of them
    (also when the caller stops early)."""
    import fedgo_flwr.runtime.messages as messages

    state = SimpleNamespace(n=4)  # the process's thread count, without touching the real one
    monkeypatch.setattr(torch, "set_num_threads", lambda n: setattr(state, "n", n))
    monkeypatch.setattr(torch, "get_num_threads", lambda: state.n)
    monkeypatch.setattr(messages, "_waiting_threads", 1)
    grid = FakeGrid({"a": 0.0, "b": 0.3, "c": 0.8})
    during = [state.n for _ in stream_replies(grid, [], 60, 0.05)]
    assert during == [1, 1, 4]
    assert state.n == 4
    early = stream_replies(FakeGrid({"a": 0.0, "b": 5.0}), [], 60, 0.05)
    next(early)
    assert state.n == 1
    early.close()  # the strategy stopped reading (an error, a shutdown)
    assert state.n == 4
    # Unset, the count is never touched.
    monkeypatch.setattr(messages, "_waiting_threads", None)
    assert [state.n for _ in stream_replies(FakeGrid({"a": 0.0, "b": 0.1}), [], 60, 0.05)] == [4, 4]
