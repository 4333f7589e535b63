"""Server / client data partitioning as in FedGO (Jang et al., ICML 2025, Sec. 4 and App. E.2).

The training set is split in two stages:

1. **Server share.**  For every class ``c`` with ``n_c`` training samples,
   ``floor(server_fraction * n_c)`` randomly chosen samples go to the server (default: half of each
   class, as in the paper).  The server uses them *without* labels for ensemble distillation; the
   labels stay available to the caller for diagnostics only.
2. **Client split.**  The remaining samples (the "client pool") are divided over ``K`` clients
   with the per-class Dirichlet label-skew scheme of Hsu, Qi and Brown (2019), "Measuring the
   Effects of Non-Identical Data Distribution for Federated Visual Classification"
   (arXiv:1909.06335), which FedGO uses following Lin et al. (2020) and Cho et al. (2022): for
   every class a proportion vector ``q ~ Dir(alpha * 1_K)`` is drawn and the (shuffled) class
   indices are cut at the cumulative proportions.  The whole draw is repeated until every client
   holds at least ``min_size`` samples.  Small ``alpha`` (0.1, 0.05 in the paper) gives strongly
   skewed clients; ``alpha -> inf`` approaches an IID split (see :func:`iid_partition`).

Everything is driven by a single ``np.random.default_rng(seed)``, so the same labels and arguments
always give the same index arrays.  The server split consumes the generator first and in the same
way for :func:`dirichlet_partition` and :func:`iid_partition`, so for a given seed the server share
does not depend on ``alpha`` or on the client-split scheme.

:func:`component_partition` additionally implements the client split of the FedGO toy example
(App. E.1): each client owns a mixture component and holds 90% of it plus 10% of the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Partition",
    "component_partition",
    "dirichlet_partition",
    "iid_partition",
]

# Guard against floating-point noise such as 0.29 * 100 == 28.999999999999996 when flooring.
_FLOOR_EPS = 1e-9


@dataclass(frozen=True, eq=False)
class Partition:
    """Indices of the server share and of every client's share of a training set.

    Attributes:
        server: Sorted ``int64`` indices (into the training set) of the server's unlabeled share.
        clients: One sorted ``int64`` index array per client.  Server and clients are pairwise
            disjoint.
    """

    server: np.ndarray
    clients: tuple[np.ndarray, ...]

    @property
    def num_clients(self) -> int:
        """Number of clients ``K``."""
        return len(self.clients)

    @property
    def client_sizes(self) -> list[int]:
        """Number of samples held by each client."""
        return [int(c.size) for c in self.clients]

    def histogram(self, labels: np.ndarray, num_classes: int) -> np.ndarray:
        """Per-client class counts.

        Args:
            labels: Integer labels of the whole training set (the array the indices refer to).
            num_classes: Number of classes (columns of the result).

        Returns:
            ``int64`` array of shape ``(K, num_classes)``; row ``k`` counts client ``k``'s labels.
        """
        labels = _as_labels(labels, num_classes)
        out = np.zeros((self.num_clients, num_classes), dtype=np.int64)
        for k, idx in enumerate(self.clients):
            out[k] = np.bincount(labels[idx], minlength=num_classes)
        return out

    def server_histogram(self, labels: np.ndarray, num_classes: int) -> np.ndarray:
        """Class counts of the server share (labels are for diagnostics only)."""
        labels = _as_labels(labels, num_classes)
        return np.bincount(labels[self.server], minlength=num_classes).astype(np.int64)

    def to_json(self, labels: np.ndarray, num_classes: int) -> dict[str, Any]:
        """JSON-serialisable summary of the partition (sizes and class histograms, no indices).

        Returns:
            ``{"num_clients", "server_size", "client_sizes", "class_histogram",
            "server_histogram"}`` with plain Python ints.
        """
        return {
            "num_clients": self.num_clients,
            "server_size": int(self.server.size),
            "client_sizes": self.client_sizes,
            "class_histogram": self.histogram(labels, num_classes).tolist(),
            "server_histogram": self.server_histogram(labels, num_classes).tolist(),
        }


# ------------------------------------------------------------------------------------------
# Validation helpers
# ------------------------------------------------------------------------------------------


def _as_labels(labels: np.ndarray, num_classes: int | None = None) -> np.ndarray:
    """Validate a 1-D array of non-negative integer labels and return it as ``int64``."""
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise ValueError(f"labels must be a 1-D array, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("labels is empty: cannot partition a dataset with 0 samples")
    if not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.bool_)):
        if not np.issubdtype(arr.dtype, np.floating) or not np.all(arr == np.round(arr)):
            raise ValueError(f"labels must be integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.min() < 0:
        raise ValueError(f"labels must be >= 0, got min label {int(arr.min())}")
    if num_classes is not None and arr.max() >= num_classes:
        raise ValueError(f"label {int(arr.max())} is out of range for num_classes={num_classes}")
    return arr


def _check_common(num_clients: int, server_fraction: float) -> None:
    if isinstance(num_clients, bool) or int(num_clients) != num_clients or num_clients < 1:
        raise ValueError(f"num_clients must be an integer >= 1, got {num_clients!r}")
    if not (0.0 <= float(server_fraction) < 1.0):
        raise ValueError(f"server_fraction must be in [0, 1), got {server_fraction!r}")


def _server_split(
    labels: np.ndarray, server_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Take ``floor(server_fraction * n_c)`` random samples of each class for the server.

    Returns:
        ``(server_indices_sorted, pools)`` where ``pools[i]`` holds the remaining (shuffled)
        indices of the ``i``-th class present in ``labels`` (classes in increasing order).
    """
    server_parts: list[np.ndarray] = []
    pools: list[np.ndarray] = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        perm = rng.permutation(idx)
        n_server = int(np.floor(server_fraction * idx.size + _FLOOR_EPS))
        server_parts.append(perm[:n_server])
        pools.append(perm[n_server:])
    server = np.sort(np.concatenate(server_parts)).astype(np.int64)
    return server, pools


# ------------------------------------------------------------------------------------------
# Partitioners
# ------------------------------------------------------------------------------------------


def dirichlet_partition(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    server_fraction: float = 0.5,
    seed: int = 0,
    min_size: int = 1,
    max_retries: int = 1000,
) -> Partition:
    """Server share plus per-class Dirichlet(``alpha``) client split.

    Plain per-class Dirichlet of Hsu et al. (2019) as used by FedGO (Sec. 4, App. E.2).

    Args:
        labels: Integer class labels of the training set, shape ``(N,)``.
        num_clients: Number of clients ``K >= 1``.
        alpha: Dirichlet concentration ``> 0``; smaller is more heterogeneous.
        server_fraction: Fraction of *each class* given to the server, in ``[0, 1)``
            (``floor(server_fraction * n_c)`` samples of class ``c``).
        seed: Seed of the single ``np.random.default_rng`` that drives the whole split.
        min_size: Every client must end up with at least this many samples (``>= 0``).
        max_retries: Maximum number of complete Dirichlet draws before giving up.

    Returns:
        The :class:`Partition`; all index arrays are sorted ``int64``.

    Raises:
        ValueError: On invalid arguments, or if no draw satisfying ``min_size`` was found within
            ``max_retries`` attempts (``alpha`` too small / too many clients for the data).
    """
    labels = _as_labels(labels)
    _check_common(num_clients, server_fraction)
    if not (np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be a finite number > 0, got {alpha!r}")
    if int(min_size) != min_size or min_size < 0:
        raise ValueError(f"min_size must be an integer >= 0, got {min_size!r}")
    if int(max_retries) != max_retries or max_retries < 1:
        raise ValueError(f"max_retries must be an integer >= 1, got {max_retries!r}")
    num_clients = int(num_clients)

    rng = np.random.default_rng(seed)
    server, pools = _server_split(labels, server_fraction, rng)
    pool_size = int(sum(p.size for p in pools))
    if pool_size < num_clients * min_size:
        raise ValueError(
            f"the client pool has only {pool_size} samples ({labels.size} total, server_fraction="
            f"{server_fraction}), fewer than num_clients * min_size = {num_clients} * {min_size}; "
            "use fewer clients, a smaller min_size or a smaller server_fraction"
        )

    concentration = np.full(num_clients, float(alpha))
    best = 0
    for _ in range(int(max_retries)):
        all_cuts: list[np.ndarray] = []
        sizes = np.zeros(num_clients, dtype=np.int64)
        for pool in pools:
            q = rng.dirichlet(concentration)
            if not np.all(np.isfinite(q)):  # pragma: no cover - defensive, tiny alpha
                q = np.full(num_clients, 1.0 / num_clients)
            cuts = (np.cumsum(q) * pool.size).astype(np.int64)[:-1]
            sizes += np.diff(cuts, prepend=0, append=pool.size)
            all_cuts.append(cuts)
        smallest = int(sizes.min())
        best = max(best, smallest)
        if smallest >= min_size:
            shards: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
            for pool, cuts in zip(pools, all_cuts, strict=True):
                for k, part in enumerate(np.split(pool, cuts)):
                    shards[k].append(part)
            clients = tuple(np.sort(np.concatenate(parts)).astype(np.int64) for parts in shards)
            return Partition(server=server, clients=clients)

    raise ValueError(
        f"could not draw a Dirichlet(alpha={alpha}) split of {pool_size} client-pool samples "
        f"({len(pools)} classes) over {num_clients} clients in which every client holds at least "
        f"min_size={min_size} samples after max_retries={max_retries} draws (the best draw's "
        f"smallest client had {best}); alpha is too small or there are too many clients for the "
        "data - use a larger alpha, fewer clients, a smaller min_size, a smaller server_fraction "
        "or more retries"
    )


def iid_partition(
    labels: np.ndarray,
    num_clients: int,
    server_fraction: float = 0.5,
    seed: int = 0,
) -> Partition:
    """Same server share as :func:`dirichlet_partition`, then a uniform random (IID) client split.

    The client pool is shuffled and cut into ``num_clients`` parts whose sizes differ by at most
    one.  This is the ``alpha -> inf`` control.  For a given ``seed`` the server indices are
    identical to those of :func:`dirichlet_partition`.

    Raises:
        ValueError: On invalid arguments or if the client pool has fewer samples than clients.
    """
    labels = _as_labels(labels)
    _check_common(num_clients, server_fraction)
    num_clients = int(num_clients)
    rng = np.random.default_rng(seed)
    server, pools = _server_split(labels, server_fraction, rng)
    pool = rng.permutation(np.concatenate(pools))
    if pool.size < num_clients:
        raise ValueError(
            f"the client pool has only {pool.size} samples, fewer than num_clients={num_clients}"
        )
    clients = tuple(np.sort(p).astype(np.int64) for p in np.array_split(pool, num_clients))
    return Partition(server=server, clients=clients)


def component_partition(
    components: np.ndarray,
    major_share: float = 0.9,
    owners: Sequence[int] | None = None,
    seed: int = 0,
) -> Partition:
    """Client split of the FedGO toy example (App. E.1): one dominant mixture component per client.

    Client ``k`` owns component ``owners[k]``: it receives ``round(major_share * n_j)`` random
    samples of that component ``j``; the rest of component ``j`` is divided as evenly as possible
    over the other clients.  With the paper's four Gaussians of 300 samples, each client holds 270
    samples of its own Gaussian and 10 of each other one (90% / 10%).  The server share is empty:
    in the toy example the server's unlabeled data are separate (uniform on a square, see
    :func:`fedgo_flwr.data.four_gaussians_server_data`).

    Args:
        components: Component id of every sample, ``0 .. K-1``; ``K`` is the number of clients.
        major_share: Fraction of a component kept by its owner, in ``(0, 1]``.
        owners: Component owned by each client (a permutation of ``0 .. K-1``); identity by default.
            The paper's clients 1-4 own the Gaussians of quadrants 3, 4, 2, 1, i.e.
            ``owners=(2, 3, 1, 0)`` with components numbered by quadrant.
        seed: Seed of the ``np.random.default_rng`` used to shuffle each component.
    """
    comp = _as_labels(components)
    num = int(comp.max()) + 1
    if not (0.0 < major_share <= 1.0):
        raise ValueError(f"major_share must be in (0, 1], got {major_share!r}")
    owner_list = list(range(num)) if owners is None else [int(o) for o in owners]
    if sorted(owner_list) != list(range(num)):
        raise ValueError(f"owners must be a permutation of 0..{num - 1}, got {owners!r}")
    rng = np.random.default_rng(seed)
    shards: list[list[np.ndarray]] = [[] for _ in range(num)]
    for client, j in enumerate(owner_list):
        perm = rng.permutation(np.flatnonzero(comp == j))
        n_major = int(np.floor(major_share * perm.size + 0.5))
        shards[client].append(perm[:n_major])
        others = [k for k in range(num) if k != client]
        if others:
            for k, part in zip(others, np.array_split(perm[n_major:], len(others)), strict=True):
                shards[k].append(part)
        else:
            shards[client].append(perm[n_major:])
    clients = tuple(np.sort(np.concatenate(parts)).astype(np.int64) for parts in shards)
    return Partition(server=np.zeros(0, dtype=np.int64), clients=clients)
