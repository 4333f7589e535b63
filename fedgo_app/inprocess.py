"""Run an experiment in one Python process: the same ServerApp and ClientApp code, no Ray.

:class:`InProcessGrid` is a Flower ``Grid`` that hands each message straight to the ClientApp
(``client_app(message, context)``) in this process, one node after another, keeping one
``Context`` (with its persistent ``state``) per node, and turns a handler's exception into an
error reply as Flower's runtime does. With ``workers`` above 1 (``resources.local_workers``)
it hands them instead to that many worker processes, each message to the first free one
with its node's state (:mod:`fedgo_app.local_workers`): the clients of a round train side by
side, and the
replies come back in the same order with the same numbers. A client handler sets torch's
thread count to its own (``resources.client_cpus``); the grid puts the server's back after each
call, so the server's work runs with ``resources.server_cpus`` threads as it does in its own
process. A reply whose
handler took longer than ``timeout`` seconds is dropped, as if the nodes had run in parallel
and that reply came too late. :meth:`InProcessGrid.stream` yields replies one at a time, like
:func:`fedgo_flwr.runtime.messages.stream_replies` on a real grid. Used for fast tests of strategy
logic and to measure the simulation runtime's overhead (``benchmarks/overhead.py``); experiments
should use ``./run.sh``, or, for debugging in one process without Ray or a SuperLink,
``./run.sh --local CONFIG [k=v ...]`` (``python -m fedgo_app.inprocess``: :func:`main`): the
same checks as ``run.sh``, the same ServerApp and ClientApp code, clients one after another
or side by side in ``resources.local_workers`` processes.

Each node's config is ``partition-id`` and ``num-partitions`` plus ``node_config`` (the same
for every node, e.g. ``allow-faults``, ``max-threads``, ``state-dir``). :func:`run_inprocess`
opts its nodes in to the config's ``faults`` (``allow-faults``) and to the code it names
(``allow-code``: ``strategy.generator.module``): server and clients are one user's (one process, or
its workers), so the config is the nodes' own.

It sets Flower's process identity (``flwr.supercore.task_identity.TaskIdentity``: run, task and
node id), which message construction reads; that is an internal of the pinned Flower (1.42; as
in 1.41).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from fedgo_app.local_workers import LocalWorkers, resolve_workers
from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.records.provenance import Launch
from fedgo_flwr.runtime.fileio import strict_json
from fedgo_flwr.runtime.messages import waiting_threads

SERVER_NODE_ID = 1


class InProcessGrid(Grid):
    """K virtual nodes served by ``client_app``: sequentially in this process, or by
    ``workers`` processes side by side (:class:`~fedgo_app.local_workers.LocalWorkers`;
    ``client_cpus``: their torch threads, which decides how they start; ``app_ref``: the
    ClientApp as ``"module:attribute"``, for workers that import it). :meth:`close` stops the
    workers."""

    def __init__(
        self,
        client_app: ClientApp,
        num_nodes: int,
        run_id: int = 1,
        node_config: Mapping[str, Any] | None = None,
        workers: int = 1,
        client_cpus: int = 1,
        app_ref: str | None = None,
    ) -> None:
        self.client_app = client_app
        extra = dict(node_config or {})
        self.contexts = {
            node: Context(
                run_id=run_id,
                node_id=node,
                node_config={"partition-id": node - 2, "num-partitions": num_nodes, **extra},
                state=RecordDict(),
                run_config={},
            )
            for node in range(2, num_nodes + 2)
        }
        TaskIdentity.run_id = run_id
        TaskIdentity.task_id = run_id
        TaskIdentity.node_id = SERVER_NODE_ID
        self.workers: LocalWorkers | None = None
        if workers > 1:
            configs = {node: c.node_config for node, c in self.contexts.items()}
            self.workers = LocalWorkers(
                client_app, configs, workers, run_id, client_cpus=client_cpus, app_ref=app_ref
            )

    def close(self) -> None:
        """Stop the worker processes, if any."""
        if self.workers is not None:
            self.workers.close()

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        return list(self.stream(messages, timeout=timeout))

    def stream(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterator[Message]:
        """Serve the messages one node after another, yielding each reply when it is made; with
        workers, side by side, yielding the replies in the same order (:meth:`_side_by_side`)."""
        if self.workers is not None:
            yield from self._side_by_side(list(messages), timeout)
            return
        for msg in list(messages):
            node = msg.metadata.dst_node_id
            TaskIdentity.node_id = node
            started = time.monotonic()
            threads = torch.get_num_threads()  # the client sets its own (resources.client_cpus)
            try:
                reply = self.client_app(msg, self.contexts[node])
            except Exception as exc:  # noqa: BLE001 - reported like Flower's runtime does
                reply = Message(
                    error=Error(code=0, reason=f"{type(exc).__name__}: {exc}"), reply_to=msg
                )
            finally:
                TaskIdentity.node_id = SERVER_NODE_ID
                torch.set_num_threads(threads)  # and the server goes on with its own
            if timeout is not None and time.monotonic() - started > timeout:
                continue  # too late: the server has stopped waiting for this node
            yield reply

    def _side_by_side(self, messages: list[Message], timeout: float | None) -> Iterator[Message]:
        """The workers' replies; while any worker still trains, the server's own work on them
        runs with ``resources.server_cpus_waiting`` threads when set, as with a real grid
        (:func:`fedgo_flwr.runtime.messages.stream_replies`)."""
        assert self.workers is not None
        full = torch.get_num_threads()
        waiting = waiting_threads()
        try:
            if waiting is not None:
                torch.set_num_threads(min(waiting, full))
            for reply in self.workers.serve(messages, timeout):
                if self.workers.idle():  # no client trains any more
                    torch.set_num_threads(full)
                yield reply
        finally:
            torch.set_num_threads(full)

    # The rest of the Grid interface is not needed by strategies that use send_and_receive.
    def set_run(self, run: Any) -> None:
        raise NotImplementedError

    @property
    def run(self) -> Any:
        raise NotImplementedError

    def create_message(self, *args: Any, **kwargs: Any) -> Message:
        raise NotImplementedError

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        raise NotImplementedError

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        raise NotImplementedError


def run_inprocess(
    cfg: ExperimentConfig,
    node_config: Mapping[str, Any] | None = None,
    num_nodes: int | None = None,
    launch: Launch | None = None,
) -> dict:
    """Run ``cfg`` in this process; return its summary (files as with ``./run.sh``).

    ``num_nodes`` virtual nodes (default: one per client); with fewer nodes than clients, each
    serves several (``share-partitions``), as simulated nodes do. The nodes' config is
    ``{"allow-faults": True, "allow-code": True}`` (plus ``share-partitions``) updated with
    ``node_config``. ``launch``: how the user started the run (its command line for
    ``env.json``, its start for the summary's ``launch`` stage); default: unknown (``env.json``
    records this process's arguments). The nodes are served by ``resources.local_workers``
    processes (``auto``: one per ``resources.client_cpus`` of this process's CPUs), stopped
    when the run ends.
    """
    from fedgo_app.client_app import SHARE_PARTITIONS, node_cpus
    from fedgo_app.client_app import app as client_app
    from fedgo_app.server_app import run_experiment
    from fedgo_flwr.runtime.trust import ALLOW_CODE

    count = num_nodes or cfg.data.num_clients
    nodes = {
        "allow-faults": True,
        ALLOW_CODE: True,
        SHARE_PARTITIONS: count < cfg.data.num_clients,
    }
    nodes.update(node_config or {})
    res = cfg.resources
    workers = resolve_workers(res.local_workers, count, node_cpus(), res.client_cpus)
    grid = InProcessGrid(
        client_app,
        count,
        node_config=nodes,
        workers=workers,
        client_cpus=res.client_cpus,
        app_ref="fedgo_app.client_app:app",
    )
    try:
        return run_experiment(grid, cfg, launch=launch)
    finally:
        grid.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m fedgo_app.inprocess CONFIG [k=v ...]``: check, run, print the summary's
    scalars as JSON; exit 2 with one message for a bad configuration (the schema's, found when
    the config loads, or the machine's, found by the run's own ``preflight`` before it starts)
    or a checkpoint the run cannot resume from (:class:`CheckpointError`, naming the file)."""
    from fedgo_flwr.config.experiment import ConfigError, config_and_overrides
    from fedgo_flwr.records.checkpoint import CheckpointError
    from fedgo_flwr.records.recorder import decide_output_dir
    from strategies import load_experiment

    parser = argparse.ArgumentParser(prog="python -m fedgo_app.inprocess")
    parser.add_argument("config", nargs="?", help="the YAML file (default: conf/default.yaml)")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value")
    args = parser.parse_args(argv)
    config, overrides = config_and_overrides(args.config, args.overrides)
    launch = Launch.from_environ()  # ./run.sh --local: what the user typed, and when
    try:
        cfg = decide_output_dir(load_experiment(config, overrides))
        summary = run_inprocess(cfg, launch=launch)
    except ConfigError as exc:
        print(f"fedgo-flwr: invalid configuration: {exc}", file=sys.stderr)
        return 2
    except CheckpointError as exc:
        print(f"fedgo-flwr: {exc}", file=sys.stderr)
        return 2
    scalars = {k: v for k, v in summary.items() if not isinstance(v, dict | list)}
    print(strict_json(scalars, name="summary", nan_is_missing=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
