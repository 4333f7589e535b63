"""What the server sends: the messages to clients and whose reply is whose.

:class:`Outbox`, owned by a strategy as ``self.outbox``, builds messages: the ConfigRecord every
message carries (the core experiment, the client algorithm's name and its own parameters, the
run token: :mod:`fedgo_flwr.runtime.messages`), one message per partition to the node that
serves it (the partition id in its ``group_id``, a reply token of its own in its config, kept in
:attr:`Outbox.tokens` for the intake) and seeded client sampling
(:func:`fedgo_flwr.learning.task.sample_clients`: every strategy trains the same clients in
the same round, and a run is repeatable).
"""

from __future__ import annotations

import collections
import json
from collections.abc import Iterable, Mapping
from typing import Any

from flwr.app import ConfigRecord, Message, RecordDict

from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.learning.task import sample_clients
from fedgo_flwr.protocol import partition_of_reply
from fedgo_flwr.runtime import messages as msgs


class Outbox:
    """The messages of a strategy: ``cfg`` is the experiment, ``node_ids`` partition id -> node
    id (a node may serve several), ``client_algorithm`` the clients' algorithm and
    ``client_params`` its parameters (sent with every message)."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        node_ids: Mapping[int, int],
        client_algorithm: str,
        client_params: Mapping[str, Any],
    ) -> None:
        self.cfg = cfg
        self.node_ids = dict(node_ids)
        served = collections.Counter(self.node_ids.values())
        # node id -> partition id, for nodes that serve one partition (replies without group id)
        self.partition_of = {n: p for p, n in self.node_ids.items() if served[n] == 1}
        self.client_algorithm = client_algorithm
        self.client_params = json.dumps(dict(client_params), sort_keys=True, allow_nan=False)
        # partition id -> the reply token of the latest message sent to it (to())
        self.tokens: dict[int, str] = {}

    def refuse(self, pid: int) -> None:
        """Send partition ``pid`` nothing from now on (its node is no longer trusted with it);
        its node's replies then answer for no partition."""
        self.node_ids.pop(pid, None)
        served = collections.Counter(self.node_ids.values())
        self.partition_of = {n: p for p, n in self.node_ids.items() if served[n] == 1}

    def sample(self, server_round: int) -> list[int]:
        """The partitions trained in ``server_round``: ``clients_per_round`` of
        ``data.num_clients``, drawn with the run's seed and the round."""
        return sample_clients(
            self.cfg.seed, server_round, self.cfg.data.num_clients, self.cfg.clients_per_round
        )

    def config(
        self, server_round: int, run_token: str, config: ConfigRecord | None = None
    ) -> ConfigRecord:
        """The ConfigRecord of every message to clients (:mod:`fedgo_flwr.runtime.messages`):
        ``config`` (a new one if ``None``) with the round, the client algorithm, the
        experiment, the client's parameters and ``run_token``."""
        config = ConfigRecord() if config is None else config
        config[msgs.SERVER_ROUND] = server_round
        config[msgs.ALGORITHM] = self.client_algorithm
        config[msgs.EXPERIMENT] = self.cfg.to_json(strategy_params=False)
        config[msgs.CLIENT_PARAMS] = self.client_params
        config[msgs.RUN_TOKEN] = run_token
        return config

    def to(self, content: RecordDict, pids: Iterable[int], message_type: str) -> list[Message]:
        """One message of ``message_type`` with ``content`` for each partition in ``pids``, to
        the node that serves it, the partition id in its ``group_id`` (a simulated node may
        serve several; the reply carries the group id back: :meth:`pid_of`). A partition
        without a node (refused at node discovery: several nodes claimed it) gets none; it is
        sent no work, and counts as a client that failed.

        Each message gets a fresh reply token (:func:`fedgo_flwr.runtime.messages.new_reply_token`)
        in its own copy of the ConfigRecord (the other records are shared, not copied), kept in
        :attr:`tokens` as the token of partition ``pid``'s latest instruction: the round's
        intake takes only a reply that echoes it (:class:`fedgo_flwr.protocol.RoundIntake`)."""
        config = content.config_records.get(msgs.CONFIG)
        out = []
        for pid in pids:
            if pid not in self.node_ids:
                continue
            token = msgs.new_reply_token()
            own = ConfigRecord(dict(config.items()) if config is not None else {})
            own[msgs.REPLY_TOKEN] = token
            self.tokens[pid] = token
            out.append(
                Message(
                    content=RecordDict({**dict(content.items()), msgs.CONFIG: own}),
                    message_type=message_type,
                    dst_node_id=self.node_ids[pid],
                    group_id=str(pid),
                )
            )
        return out

    def pid_of(self, msg: Message) -> int:
        """The partition a reply answers for (``-1``: none this server knows): its group id
        (ASCII digits), which must be a partition the sending node serves; without one, the
        node's only partition."""
        return partition_of_reply(msg, self.node_ids, self.partition_of)
