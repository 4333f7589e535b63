"""What a client algorithm declares: :class:`Declaration` (its reply specs, parameters and
whether the server keeps state for it). Re-exported by :mod:`fedgo_flwr.protocol`; here so that
:mod:`fedgo_flwr.protocol.scalars` builds declarations without importing the package that looks
them up."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fedgo_flwr.protocol.spec import ReplySpec

TRAIN = "train"
"""The message type of a training round (Flower's ``MessageType.TRAIN``)."""


@dataclass
class EmptyConfig:
    """No parameters of its own."""


@dataclass(frozen=True)
class Declaration:
    """One client algorithm's protocol: the reply spec of each message type it answers, its
    parameters and whether the server keeps state for it."""

    name: str
    replies: Mapping[str, ReplySpec] = field(default_factory=lambda: {TRAIN: ReplySpec()})
    Config: type = EmptyConfig
    """The client's own parameters (``strategy.<key>`` in YAML), a dataclass."""
    server_state: bool = False
    """Whether the server side keeps state beyond the averaged model for it (SCAFFOLD's
    control variate): such an algorithm cannot be run inside CPFL's cohorts, whose servers
    only average."""

    def reply(self, message_type: str = TRAIN) -> ReplySpec:
        """The spec of a reply to ``message_type`` (``KeyError``: not declared)."""
        return self.replies[message_type]
