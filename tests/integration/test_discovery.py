"""Node discovery with untrusted nodes (``fedgo_app/discovery.py``): which node serves which
partition. A node's reply to the partition-id query may be anything; a wrong or hostile one
ends the run with one :class:`NodeDiscoveryError` naming the node(s) and the value, never
another exception. With a node map (run config ``node-map``) the operator, not the nodes,
decides which node has which partition.

The nodes here are :class:`InProcessGrid`'s (node ids 2, 3, ...) running a ClientApp whose
query replies are crafted per node.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.app import ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.proto.node_pb2 import NodeInfo
from helpers import rows_of, run_context, tiny_config

from fedgo_app import server_app
from fedgo_app.client_app import app as client_app
from fedgo_app.client_app import reply_token_mod
from fedgo_app.discovery import (
    SETTLE_SECONDS,
    LateClaims,
    NodeDiscoveryError,
    discover_nodes,
    load_node_map,
    parse_index,
    public_key_der,
)
from fedgo_app.inprocess import InProcessGrid
from fedgo_flwr.config.experiment import ConfigError
from fedgo_flwr.runtime import messages as msgs

ROOT = Path(__file__).resolve().parents[2]


def claim(pid, size=None, shares=None, record=MetricRecord) -> RecordDict:
    """A query reply's content: ``partition-id`` (and ``num-partitions``, ``shares-...``)."""
    values = {msgs.PARTITION_ID: pid}
    if size is not None:
        values[msgs.NUM_PARTITIONS] = size
    if shares is not None:
        values[msgs.SHARES_PARTITIONS] = shares
    return RecordDict({msgs.METRICS: record(values)})


class CraftedGrid(InProcessGrid):
    """Nodes 2, 3, ... whose query replies are ``replies[node]`` (echoing the query's reply
    token, as the real ClientApp's do); ``keys[node]`` is the public key (PEM) the SuperLink
    would report for it (``Grid.get_nodes``)."""

    def __init__(self, replies: dict[int, RecordDict], keys: dict[int, bytes] | None = None):
        app = ClientApp(mods=[reply_token_mod])

        @app.query()
        def query(msg: Message, context: Context) -> Message:
            return Message(content=replies[context.node_id], reply_to=msg)

        super().__init__(app, len(replies))
        assert sorted(self.contexts) == sorted(replies)
        self.keys = keys or {}

    def get_nodes(self):
        return [NodeInfo(node_id=n, public_key=self.keys.get(n, b"")) for n in self.contexts]


def refused(grid, num_clients: int, node_map=None, **kwargs) -> str:
    with pytest.raises(NodeDiscoveryError) as info:
        discover_nodes(grid, num_clients, timeout=2, node_map=node_map, **kwargs)
    text = str(info.value)
    assert "\n" not in text and "Traceback" not in text
    return text


# -- self-reported ids (no node map: simulations, and deployments without one) -----------------
def test_honest_claims_map_partitions_to_nodes():
    grid = CraftedGrid({2: claim(2, 3), 3: claim(0, 3), 4: claim(1, 3)})
    assert discover_nodes(grid, 3, timeout=2) == {0: 3, 1: 4, 2: 2}
    # The real ClientApp's replies, as before.
    assert discover_nodes(InProcessGrid(client_app, 3), 3, timeout=2) == {0: 2, 1: 3, 2: 4}


def test_discovery_says_how_long_the_nodes_took_to_answer(flwr_log):
    """One INFO line: how many nodes replied and how long the first reply took (in a simulation
    mostly Ray's start and its workers'), which the ServerApp's start-up line counts as
    discovery."""
    import re
    import time

    replies = {2: claim(2, 3), 3: claim(0, 3), 4: claim(1, 3)}
    app = ClientApp(mods=[reply_token_mod])
    calls = []

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        if not calls:  # the first node to answer is still starting
            time.sleep(0.5)
        calls.append(context.node_id)
        return Message(content=replies[context.node_id], reply_to=msg)

    grid = InProcessGrid(app, 3)
    flwr_log.set_level(logging.INFO, logger="flwr")
    assert discover_nodes(grid, 3, timeout=5) == {0: 3, 1: 4, 2: 2}
    lines = [r.getMessage() for r in flwr_log.records if "nodes replied" in r.getMessage()]
    assert len(lines) == 1, lines
    found = re.fullmatch(
        r"node discovery: 3 nodes replied, the first ([\d.]+) s after the first query .*, "
        r"the last ([\d.]+) s after it",
        lines[0],
    )
    assert found and float(found[1]) >= 0.5, lines[0]


def test_a_query_reply_replayed_from_an_earlier_query_is_refused(monkeypatch):
    """Node 3's honest reply to a first discovery, replayed to a second one: its claim is
    still right, but it echoes the first query's token, so it answers another message."""
    grid = InProcessGrid(client_app, 2)
    original = InProcessGrid.stream
    captured: dict[int, Message] = {}

    def capture(self, messages, *, timeout=None):
        for r in original(self, messages, timeout=timeout):
            captured.setdefault(r.metadata.src_node_id, r)
            yield r

    def replay(self, messages, *, timeout=None):
        for r in original(self, messages, timeout=timeout):
            yield captured[3] if r.metadata.src_node_id == 3 else r

    monkeypatch.setattr(InProcessGrid, "stream", capture)
    assert discover_nodes(grid, 2, timeout=2) == {0: 2, 1: 3}
    monkeypatch.setattr(InProcessGrid, "stream", replay)
    text = refused(grid, 2)
    assert text.startswith("node 3's reply to the partition-id query does not echo"), text


def error_lines(flwr_log) -> list[str]:
    return [r.getMessage() for r in flwr_log.records if r.levelno == logging.ERROR]


@pytest.mark.parametrize("first_is_hostile", [True, False])
def test_a_partition_claimed_twice_is_refused_naming_both_nodes(first_is_hostile, flwr_log):
    """Whichever of the two replied first, both are named in one ERROR line and neither gets
    the partition; the run goes on with the other partitions (before, the run ended)."""
    hostile, honest = (2, 3) if first_is_hostile else (3, 2)
    replies = {hostile: claim(1, 4), honest: claim(1, 4), 4: claim(0, 4), 5: claim(2, 4)}
    replies[6] = claim(3, 4)
    grid = CraftedGrid(dict(sorted(replies.items())))
    assert discover_nodes(grid, 4, timeout=2, min_clients=2) == {0: 4, 2: 5, 3: 6}
    [line] = error_lines(flwr_log)
    assert line.startswith("node discovery: nodes 2 and 3 both claim partition-id 1; refusing")
    # Three claimants: all refused, all named.
    grid = CraftedGrid({2: claim(0, 2), 3: claim(1, 2), 4: claim(1, 2), 5: claim(1, 2)})
    assert discover_nodes(grid, 2, timeout=2) == {0: 2}
    assert "nodes 3, 4 and 5 all claim partition-id 1; refusing all" in error_lines(flwr_log)[-1]


def test_too_few_clients_left_after_refused_claims_is_one_error():
    grid = CraftedGrid({2: claim(0, 3), 3: claim(0, 3), 4: claim(1, 3), 5: claim(2, 3)})
    text = refused(grid, 3, min_clients=3)
    assert text == (
        "nodes 2 and 3 both claim partition-id 0; refusing both (each SuperNode needs a "
        "partition-id of its own; run config node-map names which node has which): 2 of 3 "
        "clients have a node, fewer than min_clients = 3"
    )


class LateGrid(CraftedGrid):
    """Nodes that connect in waves: ``get_node_ids`` lists the nodes of ``waves[0]``, then
    also those of ``waves[1]`` once asked again, and so on (each listing is one poll)."""

    def __init__(self, replies, waves: list[list[int]]):
        super().__init__(replies)
        self.waves, self.polls = waves, 0

    def get_node_ids(self):
        self.polls += 1
        return [n for wave in self.waves[: self.polls] for n in wave]


def test_a_squatter_connecting_first_is_refused_when_the_honest_node_connects(flwr_log):
    """Node 5 claims partition 0 before node 2, whose partition it is, connects. Discovery
    asks whoever connected while the others replied before it gives a partition away, and a
    deployment's nodes (one partition each) for ``settle`` seconds more: node 2's claim then
    conflicts with node 5's and both are refused (before, node 5 took partition 0 silently)."""
    replies = {2: claim(0, 3), 3: claim(1, 3), 4: claim(2, 3), 5: claim(0, 3)}
    grid = LateGrid(replies, [[5], [3, 4], [], [2]])
    assert discover_nodes(grid, 3, timeout=10, settle=1.5) == {1: 3, 2: 4}
    [line] = error_lines(flwr_log)
    assert "nodes 2 and 5 both claim partition-id 0; refusing both" in line
    # The honest node connecting while the others reply: no waiting needed.
    grid = LateGrid(replies, [[5], [3, 4], [2]])
    assert discover_nodes(grid, 3, timeout=10) == {1: 3, 2: 4}
    # What discovery cannot see without a node map: an honest node that does not connect
    # before it ends. Node 5 then serves partition 0 until node 2 connects (LateClaims, below).
    grid = LateGrid(replies, [[5], [3, 4], [], [], [], [], [2]])
    assert discover_nodes(grid, 3, timeout=10, settle=1.0) == {0: 5, 1: 3, 2: 4}


def test_a_node_connecting_after_discovery_that_claims_a_served_partition_refuses_both(flwr_log):
    """Node 5 took partition 0 before node 2, its own node, connected, and discovery ended.
    When node 2 connects (asked before the next round), the claim is ambiguous: both nodes are
    refused from then on, one ERROR naming both and the partition. Before, node 5 kept it and
    node 2 was never asked. Late nodes that are malformed, claim a partition no node serves or
    never answer are not used (a WARNING each), and nothing ends the run."""
    replies = {2: claim(0, 4), 3: claim(1, 4), 4: claim(2, 4), 5: claim(0, 4), 6: claim(3, 4)}
    replies[7] = claim("one", 4, record=ConfigRecord)  # malformed
    replies[8] = claim(9, 4)  # no such partition in the run
    grid = LateGrid(replies, [[5, 3, 4, 6]])
    seen: set[int] = set()
    node_ids = discover_nodes(grid, 4, timeout=10, asked_out=seen)
    assert node_ids == {0: 5, 1: 3, 2: 4, 3: 6} and seen == {3, 4, 5, 6}
    late = LateClaims(seen, timeout=5)
    assert late(grid, node_ids) == []  # no one new: nothing is sent
    grid.waves.append([2, 7, 8])
    assert late(grid, node_ids) == [0]
    [line] = error_lines(flwr_log)
    assert line.startswith(
        "node discovery: node 2 connected after discovery and claims partition-id 0, which "
        "node 5 has served since discovery; refusing both nodes from now on (clients [0] have "
        "no node; only run config node-map"
    ), line
    warned = [r.getMessage() for r in flwr_log.records if r.levelno == logging.WARNING]
    assert any(
        m.startswith("node discovery: node 7, connected after discovery: node 7 reports")
        for m in warned
    )
    assert any("node 8, connected after discovery, claims partition-id 9" in m for m in warned)
    assert late(grid, {1: 3, 2: 4, 3: 6}) == []  # each node is asked once


class LateNodeGrid(InProcessGrid):
    """The real ClientApp on nodes 2..6; node ``late`` connects (``get_node_ids`` lists it)
    once the first round's training messages have been served."""

    def __init__(self, late: int) -> None:
        super().__init__(client_app, 5)
        self.late, self.trained = late, False

    def get_node_ids(self):
        return [n for n in self.contexts if n != self.late or self.trained]

    def stream(self, messages, *, timeout=None):
        messages = list(messages)  # the node is listed from the next get_node_ids on
        self.trained |= any(m.metadata.message_type == MessageType.TRAIN for m in messages)
        yield from super().stream(messages, timeout=timeout)


def test_a_run_refuses_both_nodes_when_a_late_node_claims_a_served_partition(tmp_path, flwr_log):
    """In process, the whole run: node 6 claims partition 1, which node 3 has served since
    discovery, and connects after round 1. From round 2 on neither is sent work (client 1
    counts as failed), one ERROR names both nodes and the partition, the run goes on."""
    cfg = tiny_config(tmp_path, "rounds=3", "fraction=1.0", "min_clients=2")
    grid = LateNodeGrid(late=6)
    for node, pid in [(2, 0), (3, 1), (4, 2), (5, 3), (6, 1)]:
        grid.contexts[node].node_config.update({"partition-id": pid, "num-partitions": 4})
    server_app.run_experiment(grid, cfg)
    rows = rows_of(tmp_path)
    got = [(r["clients_replied"], r["clients_failed"]) for r in rows[1:]]
    assert got == [(4, 0), (3, 1), (3, 1)], got
    [line] = error_lines(flwr_log)
    assert "node 6 connected after discovery and claims partition-id 1, which node 3" in line
    assert "client 1 has no node" in flwr_log.text


@pytest.mark.parametrize(
    ("value", "record", "shown"),
    [
        ([0, 1], MetricRecord, "[0, 1]"),  # a list: int() raised TypeError before
        (1.0, MetricRecord, "1.0"),
        ("\u0661", ConfigRecord, "'\u0661'"),  # ARABIC-INDIC DIGIT ONE: int() took it as 1
        ("1 ", ConfigRecord, "'1 '"),
        (True, ConfigRecord, "True"),  # int(True) == 1 was taken before
        ("-1", ConfigRecord, "'-1'"),
        (-1, MetricRecord, "-1"),
        ("9" * 5000, ConfigRecord, "'99999"),  # int() refused it with ValueError before
    ],
)
def test_a_malformed_partition_id_is_refused_naming_node_and_value(value, record, shown):
    grid = CraftedGrid({2: claim(0, 2), 3: claim(value, 2, record=record)})
    text = refused(grid, 2)
    assert text.startswith(f"node 3 reports partition-id {shown}"), text
    assert "not a partition id" in text and len(text) < 200


def test_a_partition_id_outside_the_federation_is_refused():
    grid = CraftedGrid({2: claim(0, 3), 3: claim(1, 3), 4: claim(7, 3)})
    assert "node 4 reports partition-id 7, outside 0..2 (num-partitions 3)" in refused(grid, 3)
    # Without num-partitions in the reply the federation is data.num_clients partitions.
    grid = CraftedGrid({2: claim(0), 3: claim(1), 4: claim(3)})
    assert "node 4 reports partition-id 3, outside 0..2" in refused(grid, 3)
    # Nodes of a larger federation that claim ids beyond data.num_clients stay unused, as before.
    grid = CraftedGrid({n: claim(n - 2, 5) for n in range(2, 7)})
    assert discover_nodes(grid, 3, timeout=2) == {0: 2, 1: 3, 2: 4}


@pytest.mark.parametrize(
    ("reply", "fragment"),
    [
        (RecordDict(), "without a 'metrics' record"),
        (RecordDict({msgs.CONFIG: ConfigRecord({msgs.PARTITION_ID: 1})}), "without a 'metrics'"),
        (claim(1, size=[3]), "reports num-partitions [3]"),
        (claim(1, size=0), "reports num-partitions 0"),
        (claim(1, size="3\u0663", record=ConfigRecord), "reports num-partitions '3\u0663'"),
        (claim(1, 3, shares=2), "reports shares-partitions 2: must be 0 or 1"),
        (claim(1, 3, shares=[1]), "reports shares-partitions [1]"),
    ],
)
def test_a_malformed_reply_is_refused_naming_the_node(reply, fragment):
    grid = CraftedGrid({2: claim(0, 3), 3: reply, 4: claim(2, 3)})
    text = refused(grid, 3)
    assert text.startswith("node 3 ") and fragment in text, text


def test_nodes_that_disagree_on_the_federation_size_are_refused():
    """A node reporting a smaller num-partitions would steer which node serves which client
    (partition k goes to node k mod N); the smallest one was taken before."""
    share = {"shares": 1}
    grid = CraftedGrid({2: claim(0, 3, **share), 3: claim(1, 2, **share), 4: claim(2, 3, **share)})
    text = refused(grid, 3)
    assert "nodes 2 and 3 report num-partitions 3 and 2" in text


def test_an_error_reply_is_one_line_naming_the_node():
    app = ClientApp()

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        raise ValueError("line one\nline two " + "x" * 1000)

    text = refused(InProcessGrid(app, 2), 2)
    assert text.startswith("node 2 failed to report its partition id: ValueError: line one line")
    assert len(text) < 400


def test_the_client_refuses_a_malformed_partition_id_of_its_own_node_config():
    grid = InProcessGrid(client_app, 2)
    grid.contexts[3].node_config["partition-id"] = "\u0661"
    text = refused(grid, 2)
    assert "node 3 failed to report its partition id" in text
    assert "partition-id = '\u0661': must be an integer >= 0" in text


@pytest.mark.parametrize(
    ("value", "parsed"),
    [(0, 0), (12, 12), ("3", 3), ("007", 7), (True, None), (1.0, None), ([1], None)]
    + [("", None), ("\u0663", None), ("+3", None), ("1" * 19, None), (None, None), (-2, None)],
)
def test_parse_index(value, parsed):
    assert parse_index(value) == parsed


# -- a node map: the operator says which node has which partition ------------------------------
def ssh_and_pem() -> tuple[str, bytes]:
    """A new EC public key as an OpenSSH line (as in a .pub file) and as PEM (as the SuperLink
    reports a node's key)."""
    public = ec.generate_private_key(ec.SECP384R1()).public_key()
    ssh = public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    pem = public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return ssh.decode() + " supernode-k", pem


def test_with_a_node_map_an_intruder_claiming_a_partition_is_not_used(flwr_log):
    """Node 5 claims partition 0 first; the map gives 0 to node 4, so node 5 is never asked and
    the run goes on (without a map this is a refusal of both)."""
    flwr_log.set_level(logging.INFO, logger="flwr")
    replies = {5: claim(0, 3), 2: claim(2, 3), 3: claim(1, 3), 4: claim(0, 3)}
    grid = CraftedGrid(dict(sorted(replies.items())))
    node_map = load_node_map(json.dumps({"0": 4, "1": 3, "2": 2}))
    assert discover_nodes(grid, 3, timeout=2, node_map=node_map) == {0: 4, 1: 3, 2: 2}
    assert "node 5 is not in the node map (given inline); unused" in flwr_log.text
    # The same grid without the map: both claimants of partition 0 are refused.
    assert discover_nodes(grid, 3, timeout=2) == {1: 3, 2: 2}
    assert "nodes 4 and 5 both claim partition-id 0" in error_lines(flwr_log)[-1]


def test_a_node_map_by_public_key_finds_the_nodes_the_superlink_authenticated(tmp_path):
    keys = {n: ssh_and_pem() for n in (2, 3, 4)}
    # Node ids change when a SuperLink without --database restarts; keys do not.
    (tmp_path / "map.json").write_text(json.dumps({"0": keys[3][0], "1": keys[2][0]}))
    node_map = load_node_map(str(tmp_path / "map.json"))
    grid = CraftedGrid(
        {2: claim(1, 2), 3: claim(0, 2), 4: claim(0, 2)}, {n: pem for n, (_, pem) in keys.items()}
    )
    assert discover_nodes(grid, 2, timeout=2, node_map=node_map) == {0: 3, 1: 2}
    # PEM in the map works too, and a relative path is resolved against $FEDGO_WORKDIR.
    (tmp_path / "pem.json").write_text(json.dumps({"0": keys[3][1].decode(), "1": 2}))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FEDGO_WORKDIR", str(tmp_path))
        node_map = load_node_map("pem.json")
    assert discover_nodes(grid, 2, timeout=2, node_map=node_map) == {0: 3, 1: 2}


def test_a_mapped_node_whose_claim_disagrees_is_refused():
    grid = CraftedGrid({2: claim(0, 2), 3: claim(0, 2)})
    node_map = load_node_map('{"0": 2, "1": 3}')
    text = refused(grid, 2, node_map)
    assert text.startswith("node 3 reports partition-id 0, but the node map")
    assert "gives it partition 1" in text
    grid = CraftedGrid({2: claim(0, 3), 3: claim(1, 3)})
    assert "node 2 reports num-partitions 3, but the node map" in refused(grid, 2, node_map)
    grid = CraftedGrid({2: claim([0], 2), 3: claim(1, 2)})
    assert refused(grid, 2, node_map).startswith("node 2 reports partition-id [0]")


def test_a_node_named_twice_by_the_map_is_refused():
    ssh, pem = ssh_and_pem()
    node_map = load_node_map(json.dumps({"0": 2, "1": ssh}))
    grid = CraftedGrid({2: claim(0, 2), 3: claim(1, 2)}, {2: pem})
    assert "node 2 is named by the node map" in refused(grid, 2, node_map)


def test_a_mapped_node_that_never_connects_is_named():
    ssh, _ = ssh_and_pem()
    node_map = load_node_map(json.dumps({"0": 2, "1": ssh}))
    grid = CraftedGrid({2: claim(0, 2), 3: claim(1, 2)})  # node 3 has no (matching) key
    text = refused(grid, 2, node_map)
    assert "missing partition ids [1] (public key sha256:" in text


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "not valid JSON"),
        ("[1, 2]", "must hold a JSON object"),
        ("{}", "must hold a JSON object"),
        ('{"x": 2}', "'x' is not a partition id"),
        ('{"\u0661": 2}', "is not a partition id"),
        ('{"0": 2, "00": 3}', "partition 0 is given twice"),
        ('{"0": true}', "True is neither a node id (an int) nor a public key"),
        ('{"0": "ecdsa-sha2-nistp384 AAAAnot-a-key"}', "is neither a node id"),
        ('{"0": [2]}', "is neither a node id"),
        ('{"0": 2, "1": 2}', "partitions 0 and 1 name the same node"),
        ('{"0": 2, "2": 3}', "the partition ids must be 0..1; missing [1]"),
        ("no-such-map.json", "cannot read"),
    ],
)
def test_a_bad_node_map_is_a_config_error_of_its_key(text, problem, tmp_path, monkeypatch):
    monkeypatch.setenv("FEDGO_WORKDIR", str(tmp_path))
    with pytest.raises(ConfigError) as info:
        load_node_map(text)
    assert info.value.key == "node-map" and problem in str(info.value), str(info.value)
    assert load_node_map("") is None and load_node_map("  ") is None


def test_public_keys_compare_in_any_form():
    ssh, pem = ssh_and_pem()
    assert public_key_der(ssh) == public_key_der(pem) is not None
    assert public_key_der(ssh.rsplit(" ", 1)[0]) == public_key_der(pem)  # without the comment
    assert public_key_der("not a key") is None and public_key_der(b"") is None


def test_make_credentials_writes_the_node_map_of_its_keys(tmp_path):
    import subprocess
    import sys

    subprocess.run(
        [sys.executable, str(ROOT / "deploy/make-credentials.py"), str(tmp_path), "-n", "2"],
        check=True,
        capture_output=True,
    )
    node_map = load_node_map(str(tmp_path / "node-map.json"))
    pub = (tmp_path / "supernode-keys" / "supernode-1.pub").read_text()
    assert node_map.size == 2 and node_map.partitions[1] == public_key_der(pub)


# -- how the ServerApp reports it ---------------------------------------------------------------
def test_the_server_app_logs_one_line_for_a_bad_node_map(flwr_log):
    context = run_context(**{"node-map": '{"0": true}'})
    with pytest.raises(ConfigError, match="node-map"):
        server_app.main(InProcessGrid(client_app, 2), context)
    [line] = [r.getMessage() for r in flwr_log.records if r.levelno == logging.ERROR]
    assert line.startswith("fedgo-flwr: run config: node-map = ") and "\n" not in line


def test_the_server_app_logs_one_line_when_discovery_fails(tmp_path, flwr_log, monkeypatch):
    monkeypatch.setattr(server_app, "discover_nodes", _hostile_discovery)
    overrides = f"rounds=1 data.num_clients=2 min_clients=2 output_dir={tmp_path}"
    with pytest.raises(NodeDiscoveryError):
        server_app.main(InProcessGrid(client_app, 2), run_context(overrides=overrides))
    [line] = [r.getMessage() for r in flwr_log.records if r.levelno == logging.ERROR]
    assert line == "fedgo-flwr: nodes 2 and 3 both claim partition-id 0; refusing both (each " + (
        "SuperNode needs a partition-id of its own; run config node-map names which node has "
        "which): 1 of 2 clients have a node, fewer than min_clients = 2"
    )


def _hostile_discovery(grid, num_clients, node_map=None, min_clients=1, settle=0.0, asked_out=None):
    assert settle == SETTLE_SECONDS  # the Flower ServerApp waits for late deployment nodes
    crafted = CraftedGrid({2: claim(0, 2), 3: claim(0, 2), 4: claim(1, 2)})
    return discover_nodes(
        crafted,
        num_clients,
        timeout=2,
        node_map=node_map,
        min_clients=min_clients,
        asked_out=asked_out,
    )


def test_a_run_goes_on_without_the_refused_partitions_clients(tmp_path, flwr_log):
    """Nodes 3 and 4 both claim partition 1 of 4: client 1 has no node, and the run trains the
    others (each round samples client 1 too, and counts it as failed)."""
    flwr_log.set_level(logging.INFO, logger="flwr")
    cfg = tiny_config(tmp_path, "rounds=2", "fraction=1.0", "min_clients=2")
    grid = InProcessGrid(client_app, 5)  # the real ClientApp, its node configs changed
    for node, pid in [(2, 0), (3, 1), (4, 1), (5, 2), (6, 3)]:
        grid.contexts[node].node_config.update({"partition-id": pid, "num-partitions": 4})
    server_app.run_experiment(grid, cfg)
    rows = rows_of(tmp_path)
    assert [(r["clients_replied"], r["clients_failed"]) for r in rows[1:]] == [(3, 1), (3, 1)]
    assert "client 1 has no node (refused at node discovery)" in flwr_log.text
