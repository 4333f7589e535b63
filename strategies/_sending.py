"""What the server sends: the training messages of a round.

:class:`Sending` is the part of :class:`strategies.base.Strategy` that builds messages: the
ConfigRecord every message carries (the core experiment, the client algorithm's name and its
own parameters, the run token: :mod:`fedgo_flwr.runtime.messages`), one message per sampled
partition to the node that serves it (the partition id in its ``group_id``, a reply token of its
own in its config), seeded client sampling
(:func:`fedgo_flwr.experiment.task.sample_clients`: every strategy trains the same clients in the
same round, and a run is repeatable) and, with ``model.client_models``, one record per architecture.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from logging import INFO
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from fedgo_flwr.experiment.task import sample_clients
from fedgo_flwr.protocol import declaration, partition_of_reply
from fedgo_flwr.runtime import messages as msgs
from fedgo_flwr.runtime.messages import to_numpy


class Sending:
    """Message building of :class:`strategies.base.Strategy` (a mixin)."""

    def client_params(self) -> dict[str, Any]:
        """The client algorithm's own parameters, taken from this strategy's ``Config``."""
        fields = [f.name for f in dataclasses.fields(declaration(self.client_algorithm).Config)]
        own = dataclasses.asdict(self.params)
        return {key: own[key] for key in fields}

    def message_config(self, server_round: int, config: ConfigRecord | None = None) -> ConfigRecord:
        """The ConfigRecord of every message to clients (:mod:`fedgo_flwr.runtime.messages`)."""
        config = ConfigRecord() if config is None else config
        config[msgs.SERVER_ROUND] = server_round
        config[msgs.ALGORITHM] = self.client_algorithm
        config[msgs.EXPERIMENT] = self.cfg.to_json(strategy_params=False)
        config[msgs.CLIENT_PARAMS] = json.dumps(
            self.client_params(), sort_keys=True, allow_nan=False
        )
        config[msgs.RUN_TOKEN] = self.run_token
        return config

    def messages_to(
        self, content: RecordDict, pids: Iterable[int], message_type: str
    ) -> list[Message]:
        """One message of ``message_type`` with ``content`` for each partition in ``pids``, to
        the node that serves it, the partition id in its ``group_id`` (a simulated node may
        serve several; the reply carries the group id back: :meth:`pid_of`). A partition
        without a node (refused at node discovery: several nodes claimed it) gets none; it is
        sent no work, and counts as a client that failed.

        Each message gets a fresh reply token (:func:`fedgo_flwr.runtime.messages.new_reply_token`)
        in its own copy of the ConfigRecord (the other records are shared, not copied), kept in
        :attr:`reply_tokens` as the token of partition ``pid``'s latest instruction: the round's
        intake takes only a reply that echoes it (:class:`fedgo_flwr.protocol.RoundIntake`)."""
        config = content.config_records.get(msgs.CONFIG)
        out = []
        for pid in pids:
            if pid not in self.node_ids:
                continue
            token = msgs.new_reply_token()
            own = ConfigRecord(dict(config.items()) if config is not None else {})
            own[msgs.REPLY_TOKEN] = token
            self.reply_tokens[pid] = token
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

    def train_record(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord
    ) -> RecordDict:
        """The content sent to every sampled client (subclasses add their own records); with
        ``model.client_models``, once per architecture, ``arrays`` being :meth:`arrays_for`'s."""
        return RecordDict({msgs.ARRAYS: arrays, msgs.CONFIG: config})

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self.global_arrays = to_numpy(arrays)
        pids = sample_clients(
            self.cfg.seed, server_round, self.cfg.data.num_clients, self.cfg.clients_per_round
        )
        log(INFO, "configure_train: clients %s", pids)
        config = self.message_config(server_round, config)
        if not self.heterogeneous:
            record = self.train_record(server_round, arrays, config)
            self.open_round(pids)
            return self.messages_to(record, pids, MessageType.TRAIN)
        records: dict[str, RecordDict] = {}  # one per architecture, shared by its clients
        messages: list[Message] = []
        for pid in pids:  # in partition order, as without client_models
            arch = self.client_arch(pid)
            if arch not in records:
                records[arch] = self.train_record(
                    server_round, self.arrays_for(arch, arrays), config
                )
            messages += self.messages_to(records[arch], [pid], MessageType.TRAIN)
        self.open_round(pids)
        return messages
