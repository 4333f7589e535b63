"""A simulation on an existing Ray cluster: where its clients go, checked before it starts.

Flower's Ray backend calls ``ray.init()`` with the simulation's ``init_args``; Ray connects to
a running cluster when ``init_args`` holds ``address`` (``run_simulation``'s
``backend_config``) or, with no address given, when ``RAY_ADDRESS`` is set in the environment
of the process that starts the simulation (for ``run.sh`` and ``flwr run``, the SuperLink's).
Flower then builds its pool of client actors from the whole cluster's resources, one actor per
``client-resources`` share, and Ray places each actor on a node that has the share free.

So on node ``i`` with ``C_i`` CPUs and ``G_i`` GPUs, at most
``min(floor(C_i / client_cpus), floor(G_i / client_gpus))`` clients train side by side (the GPU
term only when ``client_gpus > 0``): with ``client_gpus: 0.25`` four clients share each GPU of
a node, and a node without a GPU gets no client. :func:`actors_per_node` computes that split;
:func:`check_cluster` reads the cluster's nodes and refuses a run none of whose clients could
be placed.

Every node must hold the same Python environment, this project at the same path (Ray's
workers get the driver's ``sys.path``) and the data at ``data.path``; a client loads its
partition on the node it runs on.
"""

from __future__ import annotations

import math
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from fedgo_flwr.config.experiment import ConfigError

ADDRESS_ENV = "RAY_ADDRESS"


def cluster_address() -> str | None:
    """The Ray cluster a simulation started from here would join (``$RAY_ADDRESS``), if any."""
    return os.environ.get(ADDRESS_ENV) or None


def actors_per_node(
    nodes: Sequence[Mapping[str, float]], client_cpus: float, client_gpus: float
) -> list[int]:
    """How many client actors of ``client_cpus`` CPUs and ``client_gpus`` GPUs fit on each node.

    ``nodes`` are the nodes' total resources (Ray's ``{"CPU": ..., "GPU": ...}``). A share of
    zero GPUs places the actor by CPUs alone; a share of zero CPUs is Ray's "no CPU asked",
    which bounds nothing (then only the GPUs do, or one actor per node if neither asks).
    """
    counts = []
    for node in nodes:
        bounds = []
        if client_cpus > 0:
            bounds.append(math.floor(node.get("CPU", 0.0) / client_cpus + 1e-9))
        if client_gpus > 0:
            bounds.append(math.floor(node.get("GPU", 0.0) / client_gpus + 1e-9))
        counts.append(min(bounds) if bounds else 1)
    return counts


def unreachable(address: str, timeout: float = 5.0) -> str | None:
    """Why nothing can be reached at ``address`` (``HOST:PORT``, also ``ray://HOST:PORT``), or
    ``None`` when a TCP connection opens there, or when the address names no port (``auto``
    and other forms Ray resolves itself). ``ray.init`` retries an address where nothing
    listens for minutes without an error (Ray 2.55: its GCS client's reconnect loop), so a
    typo in ``RAY_ADDRESS`` would hang ``run.sh``'s check instead of ending it."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return None
    except OSError as exc:
        return f"nothing accepts connections at {host}:{port}: {exc.strerror or exc}"


def read_nodes(address: str) -> list[dict[str, Any]]:
    """The alive nodes of the Ray cluster at ``address``: id, address, CPUs, GPUs.

    Connects as a driver for the time of the call and disconnects; an address with no
    cluster behind it is a :class:`ConfigError` naming ``RAY_ADDRESS``.
    """
    refused = unreachable(address)
    if refused is not None:  # Ray would retry a dead address for minutes
        raise ConfigError(
            ADDRESS_ENV, address, f"no Ray cluster there ({refused})", source="the environment"
        )
    import ray

    if ray.is_initialized():
        raise RuntimeError("read_nodes needs a process not already connected to Ray")
    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(
            ADDRESS_ENV, address, f"no Ray cluster there ({exc})", source="the environment"
        ) from exc
    try:
        nodes = [
            {
                "id": n["NodeID"],
                "address": n["NodeManagerAddress"],
                "CPU": float(n["Resources"].get("CPU", 0.0)),
                "GPU": float(n["Resources"].get("GPU", 0.0)),
            }
            for n in ray.nodes()
            if n.get("Alive")
        ]
    finally:
        ray.shutdown()
    return nodes


def check_cluster(address: str, client_cpus: float, client_gpus: float) -> list[int]:
    """Refuse a simulation none of whose clients fits on the cluster; print the placement.

    Returns the number of clients each node can train side by side (see the module's
    docstring); raises :class:`ConfigError` naming the resource keys when the total is 0,
    where Flower's simulation would otherwise wait for actors that never start.
    """
    nodes = read_nodes(address)
    counts = actors_per_node(nodes, client_cpus, client_gpus)
    total = sum(counts)
    if total == 0:
        short_of_gpus = client_gpus > 0 and all(n["GPU"] < client_gpus for n in nodes)
        key, value = (
            ("resources.client_gpus", client_gpus)
            if short_of_gpus
            else ("resources.client_cpus", client_cpus)
        )
        raise ConfigError(
            key,
            value,
            f"no node of the Ray cluster at {address} has that much free for one client "
            f"(client_cpus {client_cpus:g}, client_gpus {client_gpus:g}; nodes: "
            + ", ".join(f"{n['CPU']:g} CPUs and {n['GPU']:g} GPUs" for n in nodes)
            + ")",
        )
    lines = [
        f"  node {n['address']} ({n['id'][:8]}): {n['CPU']:g} CPUs, {n['GPU']:g} GPUs "
        f"-> {k} client(s) at a time"
        for n, k in zip(nodes, counts, strict=True)
    ]
    print(
        f"fedgo-flwr: Ray cluster at {address}: {len(nodes)} node(s), {total} clients side by "
        "side\n" + "\n".join(lines),
        file=sys.stderr,
    )
    return counts
