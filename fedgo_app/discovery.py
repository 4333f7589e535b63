"""Which node serves which partition (client): node discovery at the start of a run.

The ServerApp asks every connected node for its partition id (a QUERY message; the ClientApp
replies with its node config's ``partition-id``, ``num-partitions`` and whether it may serve
several partitions) and maps the partitions 0..K-1, K = ``data.num_clients``, to node ids
(:func:`discover_nodes`). What a node reports is not trusted:

- **Self-reported ids** (the default: a simulation, and a deployment without a node map): each
  claim is checked strictly (an int in 0..num-partitions-1, the same ``num-partitions`` on every
  node), nothing is assigned before every partition is claimed and every connected node has
  replied (in a deployment, :data:`SETTLE_SECONDS` more), and a partition claimed by several
  nodes goes to none of them (one ERROR line names them all). A node that claims the partition
  of a node not connected by then serves it until that node connects; from then on neither
  does (:class:`LateClaims`, asked before every round: one ERROR names both nodes and the
  partition; the run goes on with the others). Only a node map rules that out.
- **A node map** (run config ``node-map``): a JSON object from partition ids to node identities
  (a node id, or the node's public key), in a file on the server machine or as the text itself;
  ``deploy/make-credentials.py`` writes one. The map is authoritative: partition k goes to the
  node it names, whose own claim must agree, and a node not in the map is not used.

Every query carries a fresh reply token of its own, which the node's reply must echo
(:func:`fedgo_app.client_app.reply_token_mod`, as for every message).

Every other problem at discovery (a malformed claim, too few clients left with a node, a node
map that the nodes contradict) ends the run with one :class:`NodeDiscoveryError` (one line
naming the node or nodes and the value; a node that connects later ends nothing: whatever it
sends, it is not used, with a WARNING naming it); a map that cannot be read is a
:class:`~fedgo_flwr.config.schema.ConfigError` of the run config key ``node-map``, raised before
the run starts anything. ``docs/architecture.md`` ("Node discovery") has the rules in full.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from fedgo_flwr.config.schema import ConfigError
from fedgo_flwr.runtime.messages import (
    CONFIG,
    ECHO,
    METRICS,
    NUM_PARTITIONS,
    PARTITION_ID,
    REPLY_TOKEN,
    SHARES_PARTITIONS,
    echoed_token,
    new_reply_token,
    stream_replies,
)

__all__ = [
    "NODE_MAP",
    "SETTLE_SECONDS",
    "LateClaims",
    "NodeDiscoveryError",
    "NodeMap",
    "discover_nodes",
    "load_node_map",
    "parse_index",
]

NODE_MAP = "node-map"
"""The run config key of the node map (``""``: none, the nodes' own claims are used)."""

SETTLE_SECONDS = 5.0
"""How long the ServerApp keeps asking newly connected nodes once every partition is claimed,
in a deployment without a node map (nodes that serve one partition each): a node that claimed
a partition before its own node connected is refused with it if that node connects within
this time. Simulated nodes (which share partitions) and in-process runs do not wait."""

_MAX_DIGITS = 18  # a partition id or node count as text: no more digits than this
_MAX_MAP_BYTES = 1 << 20


class NodeDiscoveryError(RuntimeError):
    """The connected nodes cannot serve this run; the message names the nodes and values."""


def parse_index(value: Any) -> int | None:
    """``value`` as an int >= 0, if it is one: an ``int`` (not a ``bool``) or a text of at most
    18 ASCII digits; anything else (a float, a list, ``"١"``, ``"-1"``, ``" 1"``) is ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if (
        isinstance(value, str)
        and 0 < len(value) <= _MAX_DIGITS
        and value.isascii()
        and value.isdigit()
    ):
        return int(value)
    return None


def _show(value: Any, limit: int = 60) -> str:
    """A short one-line ``repr`` of a value a node sent."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- the node map ------------------------------------------------------------------------------
def public_key_der(key: str | bytes) -> bytes | None:
    """A public key (OpenSSH line or PEM) as DER SubjectPublicKeyInfo bytes, the one form in
    which keys are compared (``None``: not a public key)."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    data = (key.encode() if isinstance(key, str) else bytes(key)).strip()
    if not data:
        return None
    try:
        if data.startswith(b"-----BEGIN"):
            loaded = serialization.load_pem_public_key(data)
        else:
            loaded = serialization.load_ssh_public_key(data)
        return loaded.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return None


def _fingerprint(der: bytes) -> str:
    return "sha256:" + hashlib.sha256(der).hexdigest()[:16]


@dataclass(frozen=True)
class NodeMap:
    """Partition id -> node id (``int``) or DER public key (``bytes``); from ``source``."""

    partitions: Mapping[int, int | bytes]
    source: str

    @property
    def size(self) -> int:
        return len(self.partitions)

    def identity(self, pid: int) -> str:
        """How the map names partition ``pid``'s node, for messages."""
        ident = self.partitions[pid]
        return f"node {ident}" if isinstance(ident, int) else f"public key {_fingerprint(ident)}"

    def partition_of(self, node_id: int, public_key: bytes = b"") -> int | None:
        """The partition the map gives node ``node_id`` (with ``public_key``, as the SuperLink
        reports it), or ``None``; a node named by two entries (by id and by key) is refused."""
        by_id = [p for p, ident in self.partitions.items() if ident == node_id]
        der = public_key_der(public_key) if public_key else None
        by_key = [p for p, ident in self.partitions.items() if der is not None and ident == der]
        found = sorted(set(by_id + by_key))
        if len(found) > 1:
            raise NodeDiscoveryError(
                f"node {node_id} is named by the node map ({self.source}) for partitions "
                f"{found}, by its node id and by its public key"
            )
        return found[0] if found else None


def _resolve(path: str) -> Path:
    out = Path(path).expanduser()
    if not out.is_absolute():
        out = Path(os.environ.get("FEDGO_WORKDIR", os.getcwd())) / out
    return out.resolve()


def load_node_map(value: Any) -> NodeMap | None:
    """The node map of the run config value ``value`` (``""``/``None``: none): a JSON object,
    or the path of a file holding one. Raises :class:`ConfigError` (key ``node-map``) naming
    what is wrong."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None

    def fail(problem: str) -> ConfigError:
        return ConfigError(NODE_MAP, value, problem, "run config")

    if not isinstance(value, str):
        raise fail("must be a JSON object, or the path of a JSON file on the server machine")
    if value.strip().startswith(("{", "[")):
        source, where, text = "given inline", "", value
    else:
        path = _resolve(value.strip())
        source, where = str(path), f"{path}: "
        try:
            with open(path, "rb") as f:
                data = f.read(_MAX_MAP_BYTES + 1)
        except OSError as exc:
            raise fail(f"cannot read {path}: {exc.strerror or exc}") from None
        if len(data) > _MAX_MAP_BYTES:
            raise fail(f"{path} is larger than {_MAX_MAP_BYTES} bytes")
        text = data.decode("utf-8", errors="replace")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise fail(f"{where}not valid JSON: {exc}") from None
    if not isinstance(raw, dict) or not raw:
        raise fail(
            f'{where}must hold a JSON object from partition ids ("0", "1", ...) to node '
            "ids or public keys"
        )
    partitions: dict[int, int | bytes] = {}
    for key, ident in raw.items():
        pid = parse_index(key)
        if pid is None:
            raise fail(f"{where}{_show(key)} is not a partition id (0, 1, ...)")
        if pid in partitions:
            raise fail(f"{where}partition {pid} is given twice")
        if isinstance(ident, int) and not isinstance(ident, bool) and ident > 0:
            node: int | bytes = ident
        elif isinstance(ident, str) and (der := public_key_der(ident)) is not None:
            node = der
        else:
            raise fail(
                f"{where}partition {pid}: {_show(ident)} is neither a node id (an int) nor a "
                "public key (OpenSSH or PEM)"
            )
        twin = next((p for p, n in partitions.items() if n == node), None)
        if twin is not None:
            raise fail(f"{where}partitions {twin} and {pid} name the same node")
        partitions[pid] = node
    missing = sorted(set(range(len(partitions))) - set(partitions))
    if missing:
        raise fail(
            f"{where}the partition ids must be 0..{len(partitions) - 1}; missing {missing[:10]}"
        )
    return NodeMap(dict(sorted(partitions.items())), source)


# -- discovery ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Claim:
    pid: int
    size: int | None  # num-partitions, if the node reports it
    shares: bool


def _claim(reply: Message, node: int, token: str) -> _Claim:
    """A node's reply to the partition-id query whose reply token is ``token``, checked;
    :class:`NodeDiscoveryError` if the reply is an error, answers another message or is
    malformed."""
    if reply.has_error():
        reason = " ".join(str(reply.error.reason).split())[:300]
        raise NodeDiscoveryError(f"node {node} failed to report its partition id: {reason}")
    if echoed_token(reply.content) != token:
        raise NodeDiscoveryError(
            f"node {node}'s reply to the partition-id query does not echo the query's reply "
            f"token (ConfigRecord '{ECHO}'): it answers another message"
        )
    record = reply.content[METRICS] if METRICS in reply.content else None
    if not isinstance(record, MetricRecord | ConfigRecord):
        raise NodeDiscoveryError(
            f"node {node} replied to the partition-id query without a '{METRICS}' record"
        )
    pid = parse_index(record.get(PARTITION_ID))
    if pid is None:
        raise NodeDiscoveryError(
            f"node {node} reports partition-id {_show(record.get(PARTITION_ID))}: not a "
            "partition id (an integer >= 0)"
        )
    size = None
    if NUM_PARTITIONS in record:
        size = parse_index(record[NUM_PARTITIONS])
        if not size:
            raise NodeDiscoveryError(
                f"node {node} reports num-partitions {_show(record[NUM_PARTITIONS])}: not a "
                "number of partitions (an integer >= 1)"
            )
    shares = record.get(SHARES_PARTITIONS, 0)
    if isinstance(shares, float) or shares not in (0, 1):
        raise NodeDiscoveryError(
            f"node {node} reports {SHARES_PARTITIONS} {_show(shares)}: must be 0 or 1"
        )
    return _Claim(pid, size, bool(shares))


def _query(node: int, token: str) -> Message:
    return Message(
        content=RecordDict({CONFIG: ConfigRecord({REPLY_TOKEN: token})}),
        message_type=MessageType.QUERY,
        dst_node_id=node,
    )


def _connected(grid: Grid, node_map: NodeMap | None) -> Iterable[tuple[int, bytes]]:
    """(node id, public key) of every connected node; keys only where a map needs them."""
    if node_map is None or all(isinstance(i, int) for i in node_map.partitions.values()):
        return [(int(n), b"") for n in grid.get_node_ids()]
    return [(int(n.node_id), bytes(n.public_key)) for n in grid.get_nodes()]


def discover_nodes(
    grid: Grid,
    num_clients: int,
    timeout: float = 600.0,
    node_map: NodeMap | None = None,
    *,
    min_clients: int = 1,
    settle: float = 0.0,
    asked_out: set[int] | None = None,
) -> dict[int, int]:
    """Map partition ids 0..K-1 to node ids by asking every connected node for its id.

    Each node reports its ``partition-id``, its federation's size (``num-partitions``) and
    whether it may serve several partitions (simulated nodes may). With N < K nodes that may,
    partition k goes to the node with partition-id ``k mod N``, which trains its clients one
    after another (``flwr run .`` with Flower's 2-node default federation); otherwise every
    partition needs a node of its own. With ``node_map``, partition k goes to the node the map
    names, whose claim must agree; nodes not in the map are not asked. Waits up to ``timeout``
    seconds for the nodes (SuperNodes of a deployment may start late).

    Without a map, no partition is given to a node before every needed partition has been
    claimed and every node connected by then has been asked (with ``settle`` > 0 and nodes
    that serve one partition each, a deployment's, newly connected nodes are asked for
    ``settle`` seconds more). A partition claimed by several nodes goes to none of them (one
    ERROR line names them); the clients of such partitions have no node and the run goes on
    with the others, unless fewer than ``min_clients`` (at least 1) clients have one. The
    returned map then lacks those clients. ``asked_out``, if given, gets the id of every node
    that answered (or that the map leaves out): :class:`LateClaims` asks the others later. Raises
    :class:`NodeDiscoveryError` (see the module's documentation).
    """
    deadline = time.monotonic() + timeout
    claims: dict[int, list[int]] = {}  # partition-id -> the nodes claiming it, in reply order
    asked: set[int] = set()
    # The num-partitions of the first node that reported one; every later report must equal it
    # (so one comparison a node, not one with every node before it: K can be 10,000).
    size_of: tuple[int, int] | None = None  # (node id, num-partitions)
    sharing: set[bool] = set()
    mapped: dict[int, int] = {}  # node id -> its partition in node_map
    settled_at: float | None = None  # when every needed partition was first claimed
    # When the first query went out, and the first and the last reply came (monotonic clock).
    first_query: float | None = None
    first_reply = last_reply = 0.0
    while True:
        new: list[int] = []
        seen = set(asked)
        for node, key in _connected(grid, node_map):
            if node in seen:
                continue
            seen.add(node)
            if node_map is not None:
                pid = node_map.partition_of(node, key)
                if pid is None:
                    asked.add(node)
                    source = node_map.source
                    log(WARNING, "node %d is not in the node map (%s); unused", node, source)
                    continue
                mapped[node] = pid
            new.append(node)
        if new:
            left = max(1.0, deadline - time.monotonic())
            queried = {n: new_reply_token() for n in new}
            queries = [_query(n, token) for n, token in queried.items()]
            first_query = first_query or time.monotonic()
            for reply in stream_replies(grid, queries, left):
                last_reply = time.monotonic()
                first_reply = first_reply or last_reply
                node = reply.metadata.src_node_id
                if node not in queried or node in asked:
                    log(WARNING, "node discovery: dropped an unexpected reply from node %s", node)
                    continue
                asked.add(node)
                claim = _claim(reply, node, queried[node])
                size = claim.size if claim.size is not None else num_clients
                if node_map is not None:
                    if claim.pid != mapped[node]:
                        raise NodeDiscoveryError(
                            f"node {node} reports partition-id {claim.pid}, but the node map "
                            f"({node_map.source}) gives it partition {mapped[node]}: fix the "
                            "node's node config or the map"
                        )
                    if claim.size is not None and claim.size != node_map.size:
                        raise NodeDiscoveryError(
                            f"node {node} reports num-partitions {claim.size}, but the node map "
                            f"({node_map.source}) has {node_map.size} partitions"
                        )
                    size = node_map.size
                elif claim.pid >= size:
                    raise NodeDiscoveryError(
                        f"node {node} reports partition-id {claim.pid}, outside 0..{size - 1} "
                        f"(num-partitions {size})"
                    )
                if claim.size is not None:
                    if size_of is not None and size_of[1] != claim.size:
                        raise NodeDiscoveryError(
                            f"nodes {size_of[0]} and {node} report num-partitions {size_of[1]} "
                            f"and {claim.size}: the nodes of one federation must agree"
                        )
                    size_of = size_of or (node, claim.size)
                claims.setdefault(claim.pid, []).append(node)
                sharing.add(claim.shares)
        if node_map is not None:
            total = node_map.size
        else:
            total = size_of[1] if size_of is not None else num_clients
        if total < num_clients and sharing != {True}:
            raise NodeDiscoveryError(
                f"the federation has {total} SuperNodes (num-partitions) but data.num_clients = "
                f"{num_clients}, and its nodes serve one client each: a deployment needs one "
                "SuperNode per client (or node config share-partitions=true on every node)"
            )
        needed = min(total, num_clients)
        if all(p in claims for p in range(needed)):
            now = time.monotonic()
            settled_at = now if settled_at is None else settled_at
            wait = settle if sharing == {False} and node_map is None else 0.0
            if not new and now - settled_at >= wait:  # a last look found no one new
                if first_query is not None and first_reply:
                    replied = sum(len(nodes) for nodes in claims.values())
                    _log_waits(replied, first_reply - first_query, last_reply - first_reply)
                if asked_out is not None:
                    asked_out.update(asked)
                return _assign(claims, needed, total, num_clients, min_clients, node_map)
            if new:
                continue  # ask whoever connected while these replied, before assigning
        elif time.monotonic() > deadline:
            missing = sorted(set(range(needed)) - set(claims))
            named = ""
            if node_map is not None:
                named = " (" + ", ".join(node_map.identity(p) for p in missing[:10]) + ")"
            conflicts = "".join(f"; {line}" for line in _conflicts(claims, needed))
            raise NodeDiscoveryError(
                f"only {len(claims)} of the {needed} nodes needed for data.num_clients = "
                f"{num_clients} connected within {timeout:.0f}s; missing partition ids "
                f"{missing[:10]}{named}{conflicts}"
            )
        time.sleep(min(1.0, settle) if settled_at is not None else 1.0)


def _log_waits(replied: int, first: float, rest: float) -> None:
    """One INFO line: how long the first reply took (mostly the nodes' own start-up: in a
    simulation, Ray's start, its workers' start and their import of the ClientApp) and the
    rest of the replies after it."""
    log(
        INFO,
        "node discovery: %d nodes replied, the first %.1f s after the first query (the nodes "
        "starting: in a simulation, Ray and its workers), the last %.1f s after it",
        replied,
        first,
        rest,
    )


def _conflicts(claims: Mapping[int, list[int]], below: int) -> list[str]:
    """One line per partition id < ``below`` claimed by several nodes, naming them."""
    lines = []
    for pid, nodes in sorted(claims.items()):
        if len(nodes) < 2 or pid >= below:
            continue
        ordered = sorted(nodes)
        named = ", ".join(map(str, ordered[:-1])) + f" and {ordered[-1]}"
        both = "both" if len(nodes) == 2 else "all"
        lines.append(
            f"nodes {named} {both} claim partition-id {pid}; refusing {both} (each SuperNode "
            "needs a partition-id of its own; run config node-map names which node has which)"
        )
    return lines


def _assign(
    claims: Mapping[int, list[int]],
    needed: int,
    total: int,
    num_clients: int,
    min_clients: int,
    node_map: NodeMap | None,
) -> dict[int, int]:
    """Client k -> the node of partition ``k mod needed``, leaving out the partitions claimed
    by several nodes (one ERROR line each); :class:`NodeDiscoveryError` (those lines in one)
    if fewer than ``min_clients`` clients keep a node."""
    hosts = {pid: nodes[0] for pid, nodes in claims.items() if len(nodes) == 1}
    refused = _conflicts(claims, needed)
    clients = {k: hosts[k % needed] for k in range(num_clients) if k % needed in hosts}
    least = max(min_clients, 1)
    if len(clients) < least:
        raise NodeDiscoveryError(
            f"{'; '.join(refused)}: {len(clients)} of {num_clients} clients have a node, fewer "
            f"than min_clients = {least}"
        )
    for line in refused:
        log(ERROR, "node discovery: %s", line)
    if refused:
        left = sorted(set(range(num_clients)) - set(clients))
        log(
            WARNING,
            "node discovery: clients %s have no node; the run goes on with the other %d",
            left[:20],
            len(clients),
        )
    if total < num_clients:
        log(
            INFO,
            "%d clients on %d nodes: node k serves the clients k, k+%d, ... in turn",
            num_clients,
            total,
            total,
        )
    unused = sorted(p for p in claims if p >= needed)
    if unused:
        log(INFO, "Nodes with partition-id %s >= data.num_clients; unused", unused[:10])
    if node_map is not None:
        log(INFO, "node map (%s): partitions 0..%d found", node_map.source, needed - 1)
    return clients


class LateClaims:
    """The nodes that connect after discovery, without a node map: each is asked for its
    partition id once, and a claim of a partition that a node serves refuses both.

    Discovery gives partition ``p`` to the one node that claimed it among those connected by
    then. A node that connects later and claims ``p`` too (the honest node, when another took
    its partition first, or another node claiming an honest node's) makes the claim
    ambiguous: the server cannot tell which of the two is ``p``'s. Both are refused from then
    on, with one ERROR naming both nodes and the partition: the node that served ``p`` gets no
    more messages (every client it served is left out, counted as failed) and the new node
    none. Nothing else changes: the run goes on with the unambiguous nodes. A late node whose
    reply is malformed, an error, or a claim of a partition that no node serves (refused
    already, or outside the run), or that does not answer within ``timeout`` seconds, is not
    used, with a WARNING naming it (each node is asked once: a node that never answers cannot
    hold up every round).

    ``seen``: the nodes discovery asked (:func:`discover_nodes`' ``asked_out``). Call the instance
    before every round with the grid and the strategy's partition -> node map; it returns the
    partitions (clients) that lost their node.
    """

    def __init__(self, seen: Iterable[int], timeout: float = 30.0) -> None:
        self.seen = {int(n) for n in seen}
        self.timeout = timeout

    def __call__(self, grid: Grid, node_ids: Mapping[int, int]) -> list[int]:
        new = [int(n) for n in grid.get_node_ids() if int(n) not in self.seen]
        if not new:
            return []
        self.seen.update(new)
        queried = {n: new_reply_token() for n in new}
        queries = [_query(n, token) for n, token in queried.items()]
        taken: list[int] = []
        answered: set[int] = set()
        for reply in stream_replies(grid, queries, self.timeout):
            node = reply.metadata.src_node_id
            if node not in queried or node in answered:
                log(WARNING, "node discovery: dropped an unexpected reply from node %s", node)
                continue
            answered.add(node)
            try:
                claim = _claim(reply, node, queried[node])
            except NodeDiscoveryError as exc:
                log(
                    WARNING,
                    "node discovery: node %d, connected after discovery: %s; unused",
                    node,
                    exc,
                )
                continue
            holder = node_ids.get(claim.pid)
            if holder is None or holder == node:
                log(
                    WARNING,
                    "node discovery: node %d, connected after discovery, claims partition-id "
                    "%d, which no node serves in this run (refused at discovery, or outside "
                    "it); unused",
                    node,
                    claim.pid,
                )
                continue
            lost = sorted(p for p, n in node_ids.items() if n == holder and p not in taken)
            taken += lost
            log(
                ERROR,
                "node discovery: node %d connected after discovery and claims partition-id %d, "
                "which node %d has served since discovery; refusing both nodes from now on "
                "(clients %s have no node; only run config node-map guarantees that no node "
                "takes another's partition before that node connects)",
                node,
                claim.pid,
                holder,
                lost[:20],
            )
            node_ids = {p: n for p, n in node_ids.items() if n != holder}
        for node in sorted(set(queried) - answered):
            log(
                WARNING,
                "node discovery: node %d, connected after discovery, did not report its "
                "partition id within %.0f s; unused",
                node,
                self.timeout,
            )
        return sorted(taken)
