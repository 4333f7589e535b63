"""The one intake of client replies (``fedgo_flwr.protocol``): declared records and metrics,
group ids, one reply per client and round, the server's n_k.

The unit tests build replies by hand; the in-process tests let the clients train honestly and
edit one client's reply on its way to the server (``tamper``), one row each of the attacks that
crashed or steered a run before the intake existed.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from helpers import rows_of
from test_tampered_replies import (
    BAD,
    FEDGO,
    InProcessGrid,
    config,
    drop_record,
    set_metric,
    tamper,
    warnings_with,
)

from fedgo_app.inprocess import run_inprocess
from fedgo_flwr.learning.task import make_partition, sample_clients
from fedgo_flwr.protocol import (
    TRAIN_METRICS,
    ReplySpec,
    RoundIntake,
    Scalar,
    declaration,
    parse_group_id,
)
from fedgo_flwr.protocol.fedgo import FEDGAN_MESSAGE
from fedgo_flwr.runtime import messages as msgs

TEMPLATE = {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}


# -- unit: group ids, scalars, records -----------------------------------------------------------
@pytest.mark.parametrize(
    ("group", "pid"),
    [("0", 0), ("12", 12), ("²", None), ("١", None), ("-1", None), (" 3", None), ("3 ", None)]
    + [("", None), ("1e3", None), ("9" * 13, None)],
)
def test_a_group_id_is_a_partition_id_in_ascii_digits(group, pid):
    assert parse_group_id(group) == pid


@pytest.mark.parametrize(
    ("value", "ok"),
    [(1.5, True), (0, True), (float("nan"), False), (float("inf"), False), ([1.0], False)]
    + [("1", False), (True, False), (-1.0, False), (2.0, False)],
)
def test_a_scalar_is_a_finite_number_within_its_bounds(value, ok):
    assert (Scalar(lo=0.0, hi=1.5).problem(value) is None) == ok


def fake_grid() -> None:
    InProcessGrid(lambda m, c: m, 4)  # sets Flower's task identity, which Message needs


TOKENS = {p: f"{p + 10:x}" * 32 for p in range(4)}  # "aaa...", "bbb...", ...
"""The reply token of the message each partition was sent (partition ``p`` on node ``p + 2``)."""

OWN = object()


def reply(
    node: int,
    metrics: dict,
    group: str = "",
    extra: dict | None = None,
    arrays=None,
    token: object = OWN,
):
    """A reply from ``node``, echoing ``token`` (default: its partition's; ``None``: none)."""
    fake_grid()
    if token is OWN:
        token = TOKENS.get(node - 2)
    request = Message(
        RecordDict({msgs.CONFIG: ConfigRecord()}),
        dst_node_id=node,
        message_type="train",
        group_id=group,
    )
    arrays = TEMPLATE if arrays is None else arrays
    content = RecordDict(
        {
            msgs.ARRAYS: ArrayRecord({k: Array(v) for k, v in arrays.items()}),
            msgs.METRICS: MetricRecord(metrics),
            **(extra or {}),
        }
    )
    if token is not None:
        content[msgs.ECHO] = ConfigRecord({msgs.REPLY_TOKEN: token})
    return Message(content, reply_to=request)


GOOD = {msgs.NUM_EXAMPLES: 10, "train_loss": 0.5, "handler_time": 0.1}


def intake() -> RoundIntake:
    """Partitions 0..3 on nodes 2..5, partitions 0 and 1 sampled, n_k 10 each."""
    return RoundIntake({p: p + 2 for p in range(4)}, [0, 1], [10, 10, 10, 10], tokens=TOKENS)


def take(box: RoundIntake, msg: Message):
    return box.take(msg, ReplySpec(), {msgs.ARRAYS: TEMPLATE})


@pytest.mark.parametrize(
    ("metrics", "reason"),
    [
        ({**GOOD, "handler_time": [0.1]}, "metric 'handler_time'"),
        ({**GOOD, "train_loss": float("nan")}, "metric 'train_loss'"),
        ({**GOOD, "my_key": 1.0}, "undeclared metric 'my_key'"),
        ({**GOOD, msgs.NUM_EXAMPLES: 1e300}, "the server's count of partition 0 is 10"),
        ({"train_loss": 0.5}, "no metric 'num-examples'"),
    ],
)
def test_metrics_are_the_declared_ones(flwr_log, metrics, reason):
    box = intake()
    assert take(box, reply(2, metrics)) is None
    assert box.failed == 2 and box.rejected == 1
    assert any(reason in w and "client 0 (node 2)" in w for w in warnings_with(flwr_log, "Drop"))


def test_records_are_the_declared_ones(flwr_log):
    box = intake()
    extra = {"sneaky": ArrayRecord({"x": Array(np.zeros(1, np.float32))})}
    assert take(box, reply(2, GOOD, extra=extra)) is None
    assert warnings_with(flwr_log, "undeclared ArrayRecord 'sneaky'")
    box = intake()
    assert take(box, reply(2, GOOD, extra={"cfg": ConfigRecord({"a": 1})})) is None
    assert warnings_with(flwr_log, "undeclared record 'cfg'")


def test_arrays_are_checked_against_the_template(flwr_log):
    bad = {"w": np.full((2, 3), 1e30, np.float64), "b": np.zeros(3, np.float32)}
    box = intake()
    assert take(box, reply(2, GOOD, arrays=bad)) is None
    assert warnings_with(flwr_log, "'w' has dtype float64, expected float32")


def test_a_checked_reply_has_the_servers_n_k_and_typed_contents():
    box = intake()
    checked = take(box, reply(2, GOOD))
    assert checked is not None and checked.partition_id == 0 and checked.num_examples == 10
    assert set(checked.arrays) == {msgs.ARRAYS}
    np.testing.assert_array_equal(checked.arrays[msgs.ARRAYS]["w"], TEMPLATE["w"])
    assert box.failed == 1 and box.silent == [1]


def test_a_second_reply_for_a_client_is_refused_and_counted_once(flwr_log):
    box = intake()
    first = reply(2, GOOD)
    assert take(box, first) is not None
    assert take(box, first) is None  # replayed
    assert warnings_with(flwr_log, "a second reply for this client in this round")
    assert box.accepted == {0} and box.failed == 1


def test_a_relabelled_reply_is_refused_and_its_sender_counted_once(flwr_log):
    """Node 2 (partition 0) answers in partition 1's name: refused; partition 0 failed once,
    partition 1 may still answer for itself."""
    box = intake()
    assert take(box, reply(2, GOOD, group="1")) is None
    assert warnings_with(flwr_log, "not a partition this node serves")
    assert take(box, reply(3, GOOD, group="1")) is not None
    assert box.failed == 1 and box.silent == []


@pytest.mark.parametrize("group", ["²", "١", "0x1", "-0"])
def test_a_malformed_group_id_is_refused_never_raised(flwr_log, group):
    box = intake()
    assert take(box, reply(2, GOOD, group=group)) is None
    assert warnings_with(flwr_log, "is not a partition id in ASCII digits")
    assert box.failed == 2 and box.silent == [1]  # partition 0's node did reply


@pytest.mark.parametrize(
    ("echo", "reason"),
    [
        (None, "echoes no reply token"),
        ({msgs.REPLY_TOKEN: TOKENS[1]}, "answers another instruction"),  # partition 1's
        ({msgs.REPLY_TOKEN: "0" * 32}, "answers another instruction"),  # an earlier message's
        ({msgs.REPLY_TOKEN: TOKENS[0].upper()}, "answers another instruction"),
        ({msgs.REPLY_TOKEN: "²" * 32}, "answers another instruction"),
        ({msgs.REPLY_TOKEN: 7}, "echoes no reply token"),
        ({msgs.REPLY_TOKEN: TOKENS[0], "more": "x"}, "echoes no reply token"),
    ],
)
def test_a_reply_must_echo_the_token_of_its_own_message(flwr_log, echo, reason):
    """Node 2 (partition 0) replies with the right group id, records and metrics, but without
    the token of the message partition 0 was sent: refused, naming the client."""
    extra = {} if echo is None else {msgs.ECHO: ConfigRecord(echo)}
    box = intake()
    assert take(box, reply(2, GOOD, group="0", extra=extra, token=None)) is None
    dropped = warnings_with(flwr_log, "Drop")
    assert len(dropped) == 1 and reason in dropped[0] and "client 0 (node 2)" in dropped[0]
    assert box.failed == 2 and box.silent == [1] and box.rejected == 1
    assert take(box, reply(2, GOOD, group="0")) is not None  # its own reply still counts


def test_the_token_is_read_when_the_reply_is_taken_and_the_echo_is_not_passed_on():
    """The intake reads the strategy's tokens as they are when a reply comes (messages may be
    sent after the intake opened), and a strategy never sees the echo."""
    tokens: dict[int, str] = {}
    box = RoundIntake({p: p + 2 for p in range(4)}, [0, 1], [10] * 4, tokens=tokens)
    tokens.update(TOKENS)
    checked = take(box, reply(2, GOOD))
    assert checked is not None and msgs.ECHO not in checked.content
    assert set(checked.content) == {msgs.ARRAYS, msgs.METRICS}


def test_every_declared_spec_accepts_the_training_metrics():
    """Each client algorithm's train reply declares what ``client_app.train`` always sends."""
    from clients import available

    for name in available():
        spec = declaration(name).reply("train")
        for key in TRAIN_METRICS:
            assert spec.scalar(key) is not None, (name, key)


# -- in-process: one tampered reply in a real run -------------------------------------------------
def set_group(group: str):
    """An edit of the reply's metadata (``tamper`` edits content: this wraps the stream)."""
    original = InProcessGrid.stream

    def stream(self, messages, *, timeout=None):
        for r in original(self, messages, timeout=timeout):
            train = r.metadata.message_type == "train"
            if train and r.metadata.src_node_id == BAD + 2 and not r.has_error():
                r.metadata.group_id = group
            yield r

    return stream


def test_a_non_ascii_digit_group_id_drops_the_reply_not_the_run(tmp_path, monkeypatch, flwr_log):
    monkeypatch.setattr(InProcessGrid, "stream", set_group("²"))
    run_inprocess(config(tmp_path, "strategy.name=fedavg"))
    row = rows_of(tmp_path)[1]
    assert row["clients_replied"] == 1 and row["clients_failed"] == 1
    assert warnings_with(flwr_log, f"client -1 (node {BAD + 2}): group id '²'")


def test_a_list_valued_handler_time_drops_the_reply_not_the_run(tmp_path, monkeypatch, flwr_log):
    tamper(monkeypatch, set_metric("handler_time", [1.0, 2.0]))
    run_inprocess(config(tmp_path, "strategy.name=fedavg"))
    row = rows_of(tmp_path)[1]
    assert row["clients_replied"] == 1 and row["clients_failed"] == 1
    assert warnings_with(flwr_log, f"client {BAD} (node {BAD + 2}): metric 'handler_time'")


def test_a_duplicated_reply_is_counted_once(tmp_path, monkeypatch, flwr_log):
    original = InProcessGrid.stream

    def stream(self, messages, *, timeout=None):
        for r in original(self, messages, timeout=timeout):
            yield r
            if r.metadata.message_type == "train" and r.metadata.src_node_id == BAD + 2:
                yield r  # replayed

    monkeypatch.setattr(InProcessGrid, "stream", stream)
    run_inprocess(config(tmp_path, "strategy.name=fedavg"))
    row = rows_of(tmp_path)[1]
    assert row["clients_replied"] == 2 and row["clients_failed"] == 0
    assert warnings_with(flwr_log, "a second reply for this client")


def test_a_relabelled_reply_counts_its_client_once(tmp_path, monkeypatch, flwr_log):
    other = [p for p in sample_clients(0, 1, 4, 2) if p != BAD][0]
    monkeypatch.setattr(InProcessGrid, "stream", set_group(str(other)))
    run_inprocess(config(tmp_path, "strategy.name=fedavg"))
    row = rows_of(tmp_path)[1]
    assert row["clients_replied"] == 1 and row["clients_failed"] == 1


G3 = [
    *FEDGO,
    "strategy.generator.federated_rounds=1",
    "strategy.generator.local_epochs=1",
    "strategy.generator.steps=0",
    "data.server_fraction=0",
    "strategy.distill_data=generated",
    "strategy.generated_size=64",
]


def g3_config(tmp_path: Path, *overrides: str):
    try:
        return config(tmp_path, *G3, *overrides)
    except Exception as exc:  # noqa: BLE001 - the scenario's keys, named if they changed
        pytest.fail(f"the G3 configuration does not load: {exc}")


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        (msgs.NUM_EXAMPLES, 1e300, "the server's count of partition"),
        ("gan_wasserstein", [1.0, 2.0], "metric 'gan_wasserstein'"),
    ],
)
def test_fedgan_replies_go_through_the_intake(tmp_path, monkeypatch, flwr_log, key, value, reason):
    """FedGAN (G3) averages by the server's n_k: a claim of 1e300 examples is refused, not
    made the average's weight; a list-valued statistic is refused, not a crash."""
    cfg = g3_config(tmp_path)
    tamper(monkeypatch, set_metric(key, value), message_type=FEDGAN_MESSAGE)
    run_inprocess(cfg)
    dropped = warnings_with(flwr_log, "FedGAN round 1 reply of client")
    assert len(dropped) == 1 and reason in dropped[0], dropped
    report = json.loads((tmp_path / "prefl.json").read_text())
    clients = report["generator"]["rounds"][0]["clients"]
    assert BAD not in clients and len(clients) == cfg.data.num_clients - 1


def test_a_fedgan_reply_without_its_token_is_refused(tmp_path, monkeypatch, flwr_log):
    tamper(monkeypatch, drop_record(msgs.ECHO), message_type=FEDGAN_MESSAGE)
    run_inprocess(g3_config(tmp_path))
    dropped = warnings_with(flwr_log, "FedGAN round 1 reply of client")
    assert len(dropped) == 1 and "echoes no reply token" in dropped[0], dropped
    report = json.loads((tmp_path / "prefl.json").read_text())
    assert BAD not in report["generator"]["rounds"][0]["clients"]


def test_fedgan_weights_by_the_servers_count(tmp_path, monkeypatch):
    """With every claim honest, the weights are the partition sizes (the same average; the
    mean's, whose accumulator this records: the default consensus rule takes them too)."""
    cfg = g3_config(tmp_path, "strategy.aggregation.rule=mean")
    sizes = make_partition(cfg).client_sizes
    from fedgo_flwr.learning.aggregation import RunningAverage

    weights: list[float] = []
    original = RunningAverage.add

    def add(self, arrays, weight=1.0):
        weights.append(weight)
        return original(self, arrays, weight)

    monkeypatch.setattr(RunningAverage, "add", add)
    run_inprocess(cfg)
    # two averages (generator, critic) per reply in the one FedGAN round
    assert sorted(weights[: 2 * len(sizes)]) == sorted(float(s) for s in sizes for _ in (0, 1))


# -- replies tied to the instruction they answer --------------------------------------------------
def train_round(messages) -> int | None:
    """The server round of a batch of ``train`` messages (``None``: another message type)."""
    for m in messages:
        if m.metadata.message_type == "train":
            return int(m.content[msgs.CONFIG][msgs.SERVER_ROUND])
    return None


def replay(first: int, again: int, pid: int = BAD, reply_of: int | None = None):
    """A stream in which client ``pid``'s ``train`` reply of round ``again`` is replaced by the
    reply that client ``reply_of`` (default: ``pid``) sent in round ``first``, as captured,
    sent from ``pid``'s node in ``pid``'s name (as a relay would send it), after the round's
    other replies."""
    original = InProcessGrid.stream
    source = pid if reply_of is None else reply_of
    kept: dict[str, Message] = {}

    def stream(self, messages, *, timeout=None):
        messages = list(messages)
        rnd = train_round(messages)
        withheld = False
        for r in original(self, messages, timeout=timeout):
            node = r.metadata.src_node_id
            if rnd == first and node == source + 2 and not r.has_error():
                kept["reply"] = copy.deepcopy(r)
            if rnd == again and node == pid + 2:
                withheld = True
                continue
            yield r
        if withheld:
            stale = copy.deepcopy(kept["reply"])
            stale.metadata.__dict__["_src_node_id"] = pid + 2
            stale.metadata.__dict__["_group_id"] = str(pid)
            yield stale

    return stream


def test_a_reply_replayed_from_an_earlier_round_is_refused(tmp_path, monkeypatch, flwr_log):
    """Client 0 is sampled in rounds 1 and 3 (seed 0, K=4, m=2); its round-1 reply, replayed
    whole in round 3 (a well-formed model, the right group id and node), answers round 1's
    instruction, not round 3's: it is refused and the client counted as failed."""
    assert BAD in sample_clients(0, 1, 4, 2) and BAD in sample_clients(0, 3, 4, 2)
    monkeypatch.setattr(InProcessGrid, "stream", replay(1, 3))
    run_inprocess(config(tmp_path, "strategy.name=fedavg", "rounds=3"))
    rows = rows_of(tmp_path)
    assert [r["clients_failed"] for r in rows[1:]] == [0, 0, 1]
    assert rows[3]["clients_replied"] == 1
    dropped = warnings_with(flwr_log, "Dropping reply")
    assert len(dropped) == 1 and f"client {BAD} (node {BAD + 2})" in dropped[0], dropped
    assert "answers another instruction" in dropped[0], dropped


def test_another_clients_reply_of_the_same_round_is_refused(tmp_path, monkeypatch, flwr_log):
    """Client 3's round-1 reply, sent again in client 0's name (its node, its group id): the
    token is per message, so it answers client 3's message, not client 0's."""
    other = [p for p in sample_clients(0, 1, 4, 2) if p != BAD][0]
    monkeypatch.setattr(InProcessGrid, "stream", replay(1, 1, reply_of=other))
    run_inprocess(config(tmp_path, "strategy.name=fedavg"))
    row = rows_of(tmp_path)[1]
    assert row["clients_replied"] == 1 and row["clients_failed"] == 1
    dropped = warnings_with(flwr_log, "Dropping reply")
    assert len(dropped) == 1 and f"client {BAD} (node {BAD + 2}): answers another" in dropped[0]


def test_a_reply_without_its_token_is_refused(tmp_path, monkeypatch, flwr_log):
    tamper(monkeypatch, drop_record(msgs.ECHO))
    run_inprocess(config(tmp_path, "strategy.name=fedavg"))
    row = rows_of(tmp_path)[1]
    assert row["clients_replied"] == 1 and row["clients_failed"] == 1
    assert warnings_with(flwr_log, f"client {BAD} (node {BAD + 2}): echoes no reply token")


def test_every_message_carries_a_fresh_token_and_every_reply_echoes_its_own(tmp_path, monkeypatch):
    """Two rounds of FedAvg: each message's token is new (32 hex digits), and each reply
    echoes the token of the message it answers."""
    original = InProcessGrid.stream
    pairs: list[tuple[str, str]] = []

    def stream(self, messages, *, timeout=None):
        messages = list(messages)
        train = [m for m in messages if m.metadata.message_type == "train"]
        sent = {m.metadata.dst_node_id: m.content[msgs.CONFIG][msgs.REPLY_TOKEN] for m in train}
        for r in original(self, messages, timeout=timeout):
            if r.metadata.message_type == "train":
                pairs.append((sent[r.metadata.src_node_id], msgs.echoed_token(r.content)))
            yield r

    monkeypatch.setattr(InProcessGrid, "stream", stream)
    run_inprocess(config(tmp_path, "strategy.name=fedavg", "rounds=2"))
    assert len(pairs) == 4 and all(sent == echo for sent, echo in pairs)
    tokens = [sent for sent, _ in pairs]
    assert len(set(tokens)) == 4 and all(re.fullmatch("[0-9a-f]{32}", t) for t in tokens)
