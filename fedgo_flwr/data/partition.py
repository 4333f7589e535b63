"""Server / client data partitioning as in FedGO (Jang et al., ICML 2025, Sec. 4 and App. E.2),
plus the client splits of Co-Boosting (Dai et al., ICLR 2024, Sec. 5 and App. B).

The training set is split in two stages:

1. **Server share.**  For every class ``c`` with ``n_c`` training samples,
   ``floor(server_fraction * n_c)`` randomly chosen samples go to the server (default: half of
   each class, as in the paper), which uses them *without* labels; the labels stay available to
   the caller for diagnostics only.
2. **Client split.**  The remaining samples are divided over ``K`` clients by one of three
   schemes (``data.partition``, :data:`~fedgo_flwr.config.names.PARTITION_SCHEMES`):
   ``dirichlet`` (default, :func:`dirichlet_partition`: per class, proportions over the clients
   ``q ~ Dir(alpha * 1_K)``, Hsu et al. 2019, as FedGO, FedDF and CPFL use it), ``dirichlet_prior``
   (:func:`dirichlet_prior_partition`: per client, a prior over the classes and a log-normal data
   amount, the Co-Boosting authors' "dir" scheme) and ``classes`` (:func:`classes_partition`:
   ``classes_per_client`` classes each, Co-Boosting's ``C_cls``). ``docs/architecture.md``
   ("Data partitioning") describes each draw.

Everything is driven by a single ``np.random.default_rng(seed)``, so the same labels and arguments
always give the same index arrays.  The server split consumes the generator first and in the same
way for every scheme, so for a given seed the server share does not depend on ``alpha``, on the
client-split scheme or on its other arguments.  A split that cannot satisfy ``min_size`` or whose
arguments cannot work for these labels raises :class:`PartitionError` naming the argument.

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
    "PartitionError",
    "classes_partition",
    "component_partition",
    "dirichlet_partition",
    "dirichlet_prior_partition",
    "iid_partition",
]


class PartitionError(ValueError):
    """No split with these arguments exists for these labels (or none was found in
    ``max_retries`` draws); ``argument`` names the argument to change."""

    def __init__(self, argument: str, message: str) -> None:
        self.argument = argument
        super().__init__(message)


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


def _check_alpha(alpha: float) -> None:
    if not (np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be a finite number > 0, got {alpha!r}")


def _check_retries(min_size: int, max_retries: int) -> None:
    if int(min_size) != min_size or min_size < 0:
        raise ValueError(f"min_size must be an integer >= 0, got {min_size!r}")
    if int(max_retries) != max_retries or max_retries < 1:
        raise ValueError(f"max_retries must be an integer >= 1, got {max_retries!r}")


def _check_pool(
    labels: np.ndarray,
    pools: list[np.ndarray],
    num_clients: int,
    server_fraction: float,
    min_size: int,
) -> int:
    """The client pool's size; :class:`PartitionError` if it cannot give every client
    ``min_size`` samples."""
    pool_size = int(sum(p.size for p in pools))
    if pool_size < num_clients * min_size:
        raise PartitionError(
            "min_size",
            f"the client pool has only {pool_size} samples ({labels.size} total, server_fraction="
            f"{server_fraction}), fewer than num_clients * min_size = {num_clients} * {min_size}; "
            "use fewer clients, a smaller min_size or a smaller server_fraction",
        )
    return pool_size


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
        ValueError: On invalid arguments.
        PartitionError: If no draw satisfying ``min_size`` was found within ``max_retries``
            attempts (``alpha`` too small / too many clients for the data).
    """
    labels = _as_labels(labels)
    _check_common(num_clients, server_fraction)
    _check_alpha(alpha)
    _check_retries(min_size, max_retries)
    num_clients = int(num_clients)

    rng = np.random.default_rng(seed)
    server, pools = _server_split(labels, server_fraction, rng)
    pool_size = _check_pool(labels, pools, num_clients, server_fraction, min_size)

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

    raise PartitionError(
        "min_size",
        f"could not draw a Dirichlet(alpha={alpha}) split of {pool_size} client-pool samples "
        f"({len(pools)} classes) over {num_clients} clients in which every client holds at least "
        f"min_size={min_size} samples after max_retries={max_retries} draws (the best draw's "
        f"smallest client had {best}); alpha is too small or there are too many clients for the "
        "data - use a larger alpha, fewer clients, a smaller min_size, a smaller server_fraction "
        "or more retries",
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


def _amounts(raw: np.ndarray, total: int) -> np.ndarray:
    """Integer amounts proportional to ``raw`` that sum to ``total`` (largest remainders get
    the leftover units; ties go to the lower index)."""
    exact = raw / raw.sum() * total
    out = np.floor(exact).astype(np.int64)
    short = total - int(out.sum())
    if short > 0:
        out[np.argsort(-(exact - out), kind="stable")[:short]] += 1
    return out


def _deal(
    pools: list[np.ndarray],
    priors: np.ndarray,
    amounts: np.ndarray,
    rng: np.random.Generator,
) -> tuple[np.ndarray, ...]:
    """Deal the pools' samples to clients one at a time (the Co-Boosting authors' loop).

    Each step picks a client uniformly among those still short of their ``amounts`` and gives
    it one sample of a class drawn from its prior restricted to the classes with samples left
    (the authors redraw client and class until both are available, which has the same
    distribution). The sample is the last one left in the (already shuffled) class pool. If a
    client's prior puts no mass at all on the classes left (possible only when its prior
    underflowed to exact zeros, at tiny ``alpha``; the authors' loop never ends then), the class
    is drawn uniformly among those left.
    """
    left = np.array([p.size for p in pools], dtype=np.int64)
    need = amounts.astype(np.int64).copy()
    active = [k for k in range(need.size) if need[k] > 0]
    taken: list[list[int]] = [[] for _ in range(need.size)]
    draws = rng.random((int(need.sum()), 2))
    for u_client, u_class in draws:
        j = int(u_client * len(active))
        k = active[j]
        cum = np.cumsum(priors[k] * (left > 0))
        if cum[-1] > 0:
            c = int(np.searchsorted(cum, u_class * cum[-1], side="right"))
        else:
            avail = np.flatnonzero(left)
            c = int(avail[int(u_class * avail.size)])
        left[c] -= 1
        taken[k].append(int(pools[c][left[c]]))
        need[k] -= 1
        if need[k] == 0:
            active[j] = active[-1]
            active.pop()
    return tuple(np.sort(np.asarray(t, dtype=np.int64)) for t in taken)


def dirichlet_prior_partition(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    sigma: float = 0.0,
    server_fraction: float = 0.5,
    seed: int = 0,
    min_size: int = 1,
    max_retries: int = 1000,
) -> Partition:
    """Server share plus the Co-Boosting code's per-client Dirichlet prior split.

    Co-Boosting (Dai et al., ICLR 2024, Sec. 5, "Dir(alpha)-parted"; App. B quantity skew) as
    implemented by the authors (``utils_fl.partition_data``, ``partition == "dir"``, after
    Acar et al. 2021):

    1. client amounts ``a_k ~ LogNormal(log(P / K), sigma)`` (``P``: client-pool size),
       rescaled to sum to ``P``; drawn again (up to ``max_retries`` times) while a client
       would get fewer than ``min_size``;
    2. a class prior per client, ``p_k ~ Dir(alpha * 1_M)`` over the ``M`` classes present;
    3. samples dealt one at a time (:func:`_deal`): a random client still short of its amount
       takes a sample of a class drawn from ``p_k`` among the classes with samples left.

    Deviations from the authors' code (none changes how a client's classes are drawn): the
    amounts are rounded by largest remainders so that they sum to ``P`` exactly (the
    authors floor them and leave up to ``K - 1`` samples unused), so every client-pool sample
    is dealt; a class's samples are taken in a random order (the authors take them in dataset
    order from the end); a prior with no mass left on the remaining classes falls back to a
    uniform draw over them (the authors' loop would not end). Unlike :func:`dirichlet_partition`
    the amounts do not depend on the labels, and with ``sigma = 0`` all clients get
    ``P / K`` samples (differing by at most one).

    Args:
        labels: Integer class labels of the training set, shape ``(N,)``.
        num_clients: Number of clients ``K >= 1``.
        alpha: Dirichlet concentration of the class priors, ``> 0``; small ``alpha`` gives
            clients dominated by one or two classes.
        sigma: Log-normal spread of the client amounts, ``>= 0`` (``0``: equal amounts).
        server_fraction: As in :func:`dirichlet_partition` (same server share for a seed).
        seed: Seed of the single ``np.random.default_rng`` that drives the whole split.
        min_size: Every client must end up with at least this many samples (``>= 0``).
        max_retries: Maximum number of amount draws before giving up.

    Raises:
        ValueError: On invalid arguments.
        PartitionError: If no amount draw gave every client ``min_size`` samples.
    """
    labels = _as_labels(labels)
    _check_common(num_clients, server_fraction)
    _check_alpha(alpha)
    _check_retries(min_size, max_retries)
    if not (np.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be a finite number >= 0, got {sigma!r}")
    num_clients = int(num_clients)
    rng = np.random.default_rng(seed)
    server, pools = _server_split(labels, server_fraction, rng)
    pool_size = _check_pool(labels, pools, num_clients, server_fraction, min_size)

    best = 0
    for _ in range(int(max_retries)):
        raw = rng.lognormal(np.log(pool_size / num_clients), float(sigma), num_clients)
        amounts = _amounts(raw, pool_size)
        best = max(best, int(amounts.min()))
        if amounts.min() >= min_size:
            break
    else:
        raise PartitionError(
            "min_size",
            f"could not draw LogNormal(sigma={sigma}) client amounts for {pool_size} client-pool "
            f"samples over {num_clients} clients in which every client holds at least "
            f"min_size={min_size} samples after max_retries={max_retries} draws (the best "
            f"draw's smallest client had {best}); use a smaller sigma, fewer clients or a "
            "smaller min_size",
        )
    priors = rng.dirichlet(np.full(len(pools), float(alpha)), size=num_clients)
    bad = ~np.all(np.isfinite(priors), axis=1)
    priors[bad] = 1.0 / len(pools)  # pragma: no cover - defensive, tiny alpha
    clients = _deal(pools, priors, amounts, rng)
    return Partition(server=server, clients=clients)


def _held_classes(
    num_clients: int, cpc: int, num_classes: int, rng: np.random.Generator | None
) -> list[list[int]]:
    """The ``cpc`` classes of each client. ``rng is None``: consecutive classes, client ``k``
    holding ``(cpc*k + j) mod num_classes`` (the authors' rule for ``K <= 5``). Otherwise a
    random assignment in which every class has a holder (``cpc * num_clients >= num_classes``):
    class ``i`` goes to the ``i``-th of ``num_classes`` distinct random slots among the
    ``cpc * num_clients`` (slot ``s`` belongs to client ``s // cpc``), and each client's
    remaining slots get distinct random classes it does not hold yet."""
    if rng is None:
        return [[(cpc * k + j) % num_classes for j in range(cpc)] for k in range(num_clients)]
    held: list[list[int]] = [[] for _ in range(num_clients)]
    for c, slot in enumerate(rng.permutation(cpc * num_clients)[:num_classes]):
        held[int(slot) // cpc].append(c)
    for classes in held:
        rest = np.setdiff1d(np.arange(num_classes), classes)
        classes += rng.choice(rest, cpc - len(classes), replace=False).tolist()
    return held


def classes_partition(
    labels: np.ndarray,
    num_clients: int,
    classes_per_client: int,
    server_fraction: float = 0.5,
    seed: int = 0,
    min_size: int = 1,
    max_retries: int = 1000,
) -> Partition:
    """Server share plus a split in which every client holds exactly ``classes_per_client``
    classes: Co-Boosting's ``C_cls`` partition (Dai et al., ICLR 2024, Sec. 5, Table 5, "each
    client only possesses data of C out of all classes", after Diao et al.).

    Which classes a client holds follows the authors' code (``utils_fl.partition_data``,
    ``partition == "n_cls"``): with ``K <= 5`` clients, client ``k`` holds classes
    ``(C*k + j) mod M`` for ``j < C`` (consecutive, no randomness); with more clients the
    classes are random (:func:`_held_classes`). Then each class's client-pool samples (already
    shuffled) are split evenly (sizes differing by at most one) among the clients holding it.

    Deviations from the authors' code: (a) with ``K > 5`` the authors draw ``C`` distinct
    classes per client independently, so some class may have no holder (its samples then go
    unused, and their sampling loop waits forever for samples no client may take); here the
    random draw gives every class a holder, and is repeated (up to ``max_retries`` times) while
    a client would get fewer than ``min_size`` samples. (b) The authors deal
    ``N / K`` samples to every client, one at a time from a uniform prior over its classes,
    redrawing the class when it ran out, which also never ends once all of a client's classes
    are used up; an even split of every class among its holders always ends, uses every sample
    and gives clients sizes that depend on how many others share their classes.

    Args:
        labels: Integer class labels of the training set, shape ``(N,)``.
        num_clients: Number of clients ``K >= 1``.
        classes_per_client: ``C``, with ``1 <= C <= M`` (the number of classes present) and
            ``C * K >= M`` (else some class has no holder).
        server_fraction: As in :func:`dirichlet_partition` (same server share for a seed).
        seed: Seed of the single ``np.random.default_rng`` that drives the whole split.
        min_size: Every client must end up with at least this many samples (``>= 0``).
        max_retries: Maximum number of class assignments drawn before giving up.

    Raises:
        ValueError: On invalid arguments.
        PartitionError: If ``classes_per_client`` cannot work for these labels, or no
            assignment met the conditions above within ``max_retries`` draws.
    """
    labels = _as_labels(labels)
    _check_common(num_clients, server_fraction)
    _check_retries(min_size, max_retries)
    cpc = classes_per_client
    if isinstance(cpc, bool) or int(cpc) != cpc or cpc < 1:
        raise ValueError(f"classes_per_client must be an integer >= 1, got {cpc!r}")
    num_clients, cpc = int(num_clients), int(cpc)
    rng = np.random.default_rng(seed)
    server, pools = _server_split(labels, server_fraction, rng)
    num_classes = len(pools)
    if cpc > num_classes:
        raise PartitionError(
            "classes_per_client",
            f"classes_per_client={cpc} is more than the {num_classes} classes of the labels",
        )
    if cpc * num_clients < num_classes:
        raise PartitionError(
            "classes_per_client",
            f"classes_per_client * num_clients = {cpc} * {num_clients} < {num_classes} classes: "
            "some class would have no client; use more classes per client or more clients",
        )
    _check_pool(labels, pools, num_clients, server_fraction, min_size)
    fixed = num_clients <= 5
    tries = 1 if fixed else int(max_retries)
    best = 0
    for _ in range(tries):
        held = _held_classes(num_clients, cpc, num_classes, None if fixed else rng)
        holders: list[list[int]] = [[] for _ in range(num_classes)]
        for k, classes in enumerate(held):
            for c in classes:
                holders[c].append(k)
        shards: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for pool, h in zip(pools, holders, strict=True):
            for k, part in zip(h, np.array_split(pool, len(h)), strict=True):
                shards[k].append(part)
        smallest = min(sum(part.size for part in parts) for parts in shards)
        best = max(best, smallest)
        if smallest >= min_size:
            clients = tuple(np.sort(np.concatenate(parts)).astype(np.int64) for parts in shards)
            return Partition(server=server, clients=clients)
    raise PartitionError(
        "min_size",
        f"could not assign {cpc} classes to each of {num_clients} clients ({num_classes} classes, "
        f"{'fixed consecutive classes' if fixed else f'max_retries={max_retries} random draws'}) "
        f"so that every client holds at least min_size={min_size} samples (the best "
        f"assignment's smallest client had {best}); use more classes per client, fewer "
        "clients or a smaller min_size",
    )


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
