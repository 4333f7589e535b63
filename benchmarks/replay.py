"""Replay an experiment's FedAvg rounds through the library, showing each client model to a probe.

The diagnostics ``ensemble_vs_average.py`` and ``ideal_generator.py`` need the client models of
a round, which a run does not keep. :func:`replay` runs the experiment in this process with the
library's own code, the ServerApp's :func:`fedgo_app.server_app.run_experiment` with its FedAvg
strategy and the ClientApp, on :class:`ReplayGrid`, an
:class:`fedgo_app.inprocess.InProcessGrid` that hands every successful train reply (one client
model) to ``on_reply`` as it passes, and calls ``on_round_end`` when a round's replies are all
out, before the strategy aggregates them. So the partition, client sampling, initial model and
client training are those of ``./run.sh`` for the config, and the client models of a round are
those of a FedDF or FedGO run with the same config until that run's first distillation (their
clients train like FedAvg's).

Imported by the scripts next to it (``from benchmarks.replay import ...``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import torch
from flwr.app import Message, MessageType
from torch import nn

from fedgo_app.client_app import app as client_app
from fedgo_app.inprocess import InProcessGrid
from fedgo_app.server_app import run_experiment
from fedgo_flwr.runtime.messages import ARRAYS, METRICS, NUM_EXAMPLES, PARTITION_ID
from strategies import load_experiment

# Plain FedAvg, no checkpoints: the replay's own files go to a temporary folder.
FEDAVG = ("strategy.name=fedavg", "checkpoint=false", "resume=false")


class ReplayGrid(InProcessGrid):
    """The in-process grid, with a look at every round's client models."""

    def __init__(
        self,
        num_nodes: int,
        on_reply: Callable[[Message], None],
        on_round_start: Callable[[], None] | None = None,
        on_round_end: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(client_app, num_nodes)
        self.on_reply, self.on_round_start, self.on_round_end = (
            on_reply,
            on_round_start,
            on_round_end,
        )

    def stream(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterator[Message]:
        messages = list(messages)
        training = any(m.metadata.message_type == MessageType.TRAIN for m in messages)
        if training and self.on_round_start:
            self.on_round_start()
        for reply in super().stream(messages, timeout=timeout):
            if reply.metadata.message_type == MessageType.TRAIN and not reply.has_error():
                self.on_reply(reply)
            yield reply
        if training and self.on_round_end:
            self.on_round_end()


def client_model(reply: Message, model: nn.Module) -> tuple[int, int]:
    """Load the client model of a train reply into ``model``; return its partition id and
    number of training examples."""
    model.load_state_dict(reply.content[ARRAYS].to_torch_state_dict())
    metrics = reply.content[METRICS]
    return int(metrics[PARTITION_ID]), int(metrics[NUM_EXAMPLES])


def replay(
    config: str | Path,
    overrides: Sequence[str],
    on_reply: Callable[[Message], None],
    on_round_start: Callable[[], None] | None = None,
    on_round_end: Callable[[], None] | None = None,
) -> dict:
    """Run ``config`` with ``overrides`` as FedAvg on a :class:`ReplayGrid`; return the summary.

    The number of torch threads is restored afterwards (the ClientApp sets its own).
    """
    threads = torch.get_num_threads()
    try:
        with tempfile.TemporaryDirectory() as out:
            cfg = load_experiment(config, [*overrides, *FEDAVG, f"output_dir={out}"])
            grid = ReplayGrid(cfg.data.num_clients, on_reply, on_round_start, on_round_end)
            return run_experiment(grid, cfg)
    finally:
        torch.set_num_threads(threads)
