"""Simulated time, CPU-hours and bytes of a federated run (the systems model of CPFL).

CPFL (paper 003, "Cohort-Parallel Federated Learning") reports, next to accuracy, how long
training takes on real devices and how much it costs. It does not measure this on its own
hardware but simulates it (Sec. 4.1, "Compute infrastructure": a custom asyncio event loop that
processes events without delay, as in FedScale/Oort/REFL):

* every client has a device profile, drawn from the FedScale traces of 131,000 mobile devices:
  **0.9 s to 11.9 s to train one mini-batch**, network speed **130 KB/s to 26 MB/s**; cohort
  servers have unlimited bandwidth and serve all transfers of a round in parallel; every node is
  always online (Sec. 4.1, "Traces");
* a round lasts until the server holds every update: for each participant download + local
  training + upload, and the server waits for the slowest (synchronous FedAvg; digest A.3);
* **time to convergence** is the time from the start of training until all cohorts have finished
  (Sec. 4.2, "Time-to-accuracy"): the maximum over cohorts of each cohort's summed rounds, with
  distillation excluded;
* **CPU-hours** is "the total time CPUs spent on training" (Sec. 4.2, "Resource usage"): the
  simulated compute time summed over all clients and rounds, without network time (the
  authors' code sums ``total_training_time``);
* **communication volume** is every byte sent, in both directions (App. B.4).

This module is that model in plain Python/NumPy, for any strategy: :class:`DeviceProfile`,
a seeded synthetic population (:func:`synthetic_profiles`), a user's CSV
(:func:`load_profiles`), the round arithmetic (:func:`client_round_seconds`,
:func:`round_seconds`) and an accumulator (:class:`SimClock`).

Units: seconds and bytes; 1 KB = 1,000 bytes and 1 MB = 10**6 bytes (the paper writes KB/s and
MB/s without saying which; decimal units are assumed).
"""

from __future__ import annotations

import csv
import math
import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "FEDSCALE_BYTES_PER_SECOND",
    "FEDSCALE_SECONDS_PER_BATCH",
    "PROFILE_COLUMNS",
    "DeviceProfile",
    "ProfileError",
    "SimClock",
    "client_round_seconds",
    "load_profiles",
    "round_seconds",
    "synthetic_profiles",
]

FEDSCALE_SECONDS_PER_BATCH: tuple[float, float] = (0.9, 11.9)
"""Range of compute seconds per mini-batch in the FedScale traces (CPFL Sec. 4.1)."""

FEDSCALE_BYTES_PER_SECOND: tuple[float, float] = (130e3, 26e6)
"""Range of network speeds in the FedScale traces, 130 KB/s to 26 MB/s (CPFL Sec. 4.1)."""

PROFILE_COLUMNS: tuple[str, str, str] = ("client_id", "seconds_per_batch", "bytes_per_second")
"""Header of a device-profile CSV file (any column order)."""


class ProfileError(ValueError):
    """A device profile (or a profile file) is unusable; the message names the culprit."""


def _positive_finite(value: object, what: str) -> float:
    """``value`` as a float if it is a real, finite number > 0, else :class:`ProfileError`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ProfileError(f"{what} must be a positive finite number, got {value!r}")
    out = float(value)
    if not math.isfinite(out) or out <= 0:
        raise ProfileError(f"{what} must be a positive finite number, got {value!r}")
    return out


@dataclass(frozen=True)
class DeviceProfile:
    """Compute speed and bandwidth of one client's device.

    Attributes:
        seconds_per_batch: simulated seconds to train one mini-batch (the paper's traces:
            0.9-11.9 s). The authors' code derives it from a per-sample time and multiplies by
            an augmentation factor; here it is given directly, per mini-batch, as the paper
            states it.
        bytes_per_second: bandwidth in both directions (one figure per device, as in the
            traces).
    """

    seconds_per_batch: float
    bytes_per_second: float

    def __post_init__(self) -> None:
        spb = _positive_finite(self.seconds_per_batch, "seconds_per_batch")
        bps = _positive_finite(self.bytes_per_second, "bytes_per_second")
        object.__setattr__(self, "seconds_per_batch", spb)
        object.__setattr__(self, "bytes_per_second", bps)

    def compute_seconds(self, batches: int) -> float:
        """Simulated time to train ``batches`` mini-batches."""
        return _count(batches, "batches") * self.seconds_per_batch

    def transfer_seconds(self, nbytes: int) -> float:
        """Simulated time to send or receive ``nbytes`` bytes (the server side is unlimited)."""
        return _count(nbytes, "bytes") / self.bytes_per_second


def _count(value: object, what: str) -> int:
    """``value`` as a non-negative int, else ``ValueError`` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{what} must be a non-negative int, got {value!r}")
    return int(value)


def synthetic_profiles(num_clients: int, seed: int) -> list[DeviceProfile]:
    """A seeded population of ``num_clients`` device profiles over the FedScale ranges.

    The paper draws devices from FedScale's trace file (a pickle of 131,000 devices); that
    file is not available offline, so this draws each client's compute time per mini-batch and
    its bandwidth independently and **log-uniformly** over the ranges the paper reports
    (:data:`FEDSCALE_SECONDS_PER_BATCH`, :data:`FEDSCALE_BYTES_PER_SECOND`, Sec. 4.1).
    Log-uniform because the ranges span one (compute) and two (network) orders of magnitude;
    the traces' real distribution is not given in the paper.

    Client ``i``'s profile depends only on ``seed`` and ``i`` (not on ``num_clients``), so a
    run with more clients keeps the first ones' devices.

    Args:
        num_clients: population size (>= 1).
        seed: seed of the NumPy generator (>= 0); pass e.g. ``derive_seed(seed, "profiles")``.

    Returns:
        One :class:`DeviceProfile` per client, indexed by client id.
    """
    n = _count(num_clients, "num_clients")
    if n < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients!r}")
    rng = np.random.default_rng(_count(seed, "seed"))
    lows = np.log([FEDSCALE_SECONDS_PER_BATCH[0], FEDSCALE_BYTES_PER_SECOND[0]])
    highs = np.log([FEDSCALE_SECONDS_PER_BATCH[1], FEDSCALE_BYTES_PER_SECOND[1]])
    # Row-major draws: row i is client i whatever num_clients is.
    draws = np.exp(rng.uniform(lows, highs, size=(n, 2)))
    return [DeviceProfile(float(spb), float(bps)) for spb, bps in draws]


def load_profiles(csv_path: str | Path, num_clients: int) -> list[DeviceProfile]:
    """Read device profiles from a CSV with the header ``client_id, seconds_per_batch,
    bytes_per_second`` (any order, surrounding spaces allowed, blank lines skipped).

    Every client ``0 .. num_clients-1`` needs exactly one row; ids outside that range are
    refused too (a file for a bigger population would silently assign the wrong devices if
    ids were renumbered). All bad rows are reported at once, each as ``file:line, column``.

    Returns:
        One :class:`DeviceProfile` per client, indexed by client id.

    Raises:
        ProfileError: the file is missing or unreadable, the header lacks a column, or any
            row is bad: wrong number of fields, non-numeric text, a non-integer or
            out-of-range ``client_id``, a duplicate ``client_id``, a non-positive or
            non-finite value; or clients have no row (they are listed).
    """
    n = _count(num_clients, "num_clients")
    if n < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients!r}")
    path = Path(csv_path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"device profile file {str(path)!r} cannot be read: {exc}") from exc

    reader = csv.reader(text.splitlines())
    header: list[str] | None = None
    header_line = 0
    for row in reader:
        if any(cell.strip() for cell in row):
            header = [cell.strip() for cell in row]
            header_line = reader.line_num
            break
    if header is None:
        raise ProfileError(f"{path}: empty device profile file; expected the header {_HEADER}")
    missing = [c for c in PROFILE_COLUMNS if c not in header]
    if missing:
        raise ProfileError(
            f"{path}:{header_line}: header {header} lacks column(s) {missing}; expected {_HEADER}"
        )
    index = {c: header.index(c) for c in PROFILE_COLUMNS}

    errors: list[str] = []
    profiles: dict[int, DeviceProfile] = {}
    seen_on: dict[int, int] = {}
    for row in reader:
        line = reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            errors.append(f"{path}:{line}: {len(row)} fields, expected {len(header)} ({_HEADER})")
            continue
        cid = _parse_client_id(row[index["client_id"]], n, f"{path}:{line}, column client_id")
        values: dict[str, float] = {}
        for column in PROFILE_COLUMNS[1:]:
            where = f"{path}:{line}, column {column}"
            value = _parse_positive(row[index[column]], where)
            if isinstance(value, str):
                errors.append(value)
            else:
                values[column] = value
        if isinstance(cid, str):
            errors.append(cid)
            continue
        if cid in seen_on:
            errors.append(
                f"{path}:{line}, column client_id: client {cid} already has a row "
                f"(line {seen_on[cid]})"
            )
            continue
        seen_on[cid] = line
        if len(values) == 2:
            profiles[cid] = DeviceProfile(**values)
    absent = [i for i in range(n) if i not in seen_on]
    if absent:
        errors.append(f"{path}: no row for client(s) {_ranges(absent)} (of {n} clients)")
    if errors:
        raise ProfileError(
            f"bad device profile file {str(path)!r} ({len(errors)} problem(s)):\n  "
            + "\n  ".join(errors)
        )
    return [profiles[i] for i in range(n)]


_HEADER = ", ".join(PROFILE_COLUMNS)


def _parse_client_id(cell: str, num_clients: int, where: str) -> int | str:
    """The client id in ``cell``, or an error message naming ``where``."""
    text = cell.strip()
    try:
        cid = int(text)
    except ValueError:
        return f"{where}: {cell!r} is not an integer client id"
    if not 0 <= cid < num_clients:
        return f"{where}: client id {cid} is outside 0..{num_clients - 1}"
    return cid


def _parse_positive(cell: str, where: str) -> float | str:
    """The positive finite number in ``cell``, or an error message naming ``where``."""
    try:
        value = float(cell.strip())
    except ValueError:
        return f"{where}: {cell!r} is not a number"
    if not math.isfinite(value) or value <= 0:
        return f"{where}: {cell.strip()!r} must be a positive finite number"
    return value


def _ranges(ids: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` as ``"0-2, 5"`` (sorted input)."""
    parts: list[str] = []
    start = prev = ids[0]
    for i in [*ids[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ", ".join(parts)


def client_round_seconds(
    profile: DeviceProfile, batches: int, download_bytes: int, upload_bytes: int
) -> float:
    """One participant's round: download the model, train ``batches`` mini-batches, upload.

    The transfers are limited by the client's bandwidth only (cohort servers have unlimited
    bandwidth and serve all transfers in parallel, CPFL Sec. 4.1 "Traces").
    """
    return (
        profile.transfer_seconds(download_bytes)
        + profile.compute_seconds(batches)
        + profile.transfer_seconds(upload_bytes)
    )


def _per_client(value: int | Sequence[int], n: int, what: str) -> list[int]:
    """A scalar broadcast to ``n`` participants, or a sequence of exactly ``n``."""
    if isinstance(value, numbers.Integral):
        return [_count(value, what)] * n
    values = list(value)
    if len(values) != n:
        raise ValueError(f"{what}: {len(values)} values for {n} participants")
    return [_count(v, what) for v in values]


def round_seconds(
    profiles: Sequence[DeviceProfile],
    batches: int | Sequence[int],
    download_bytes: int | Sequence[int],
    upload_bytes: int | Sequence[int],
) -> float:
    """Duration of a synchronous round: the slowest participant's
    :func:`client_round_seconds` (0.0 if nobody takes part).

    ``batches``, ``download_bytes`` and ``upload_bytes`` are either one value for everybody or
    one per participant (clients with more data train more batches).
    """
    n = len(profiles)
    b = _per_client(batches, n, "batches")
    down = _per_client(download_bytes, n, "download_bytes")
    up = _per_client(upload_bytes, n, "upload_bytes")
    return max(
        (client_round_seconds(p, *args) for p, *args in zip(profiles, b, down, up, strict=True)),
        default=0.0,
    )


@dataclass
class SimClock:
    """Accumulates the simulated cost of one sequence of rounds (e.g. one cohort).

    Attributes:
        seconds: simulated wall time, the sum of the rounds' durations (:func:`round_seconds`).
        cpu_seconds: summed simulated compute time of every participant of every round
            (CPFL's "CPU hours", Sec. 4.2; network time is not included).
        bytes_down: bytes sent by the server to clients (App. B.4 counts both directions).
        bytes_up: bytes sent by clients to the server.
        rounds: number of rounds added.
    """

    seconds: float = 0.0
    cpu_seconds: float = 0.0
    bytes_down: int = 0
    bytes_up: int = 0
    rounds: int = 0

    def add_round(
        self,
        profiles: Sequence[DeviceProfile],
        batches: int | Sequence[int],
        download_bytes: int | Sequence[int],
        upload_bytes: int | Sequence[int],
    ) -> float:
        """Add one synchronous round of ``profiles``' participants; return its duration.

        Pass the participants that were sent work. A round with none still counts as a
        round and takes no time.
        """
        n = len(profiles)
        b = _per_client(batches, n, "batches")
        down = _per_client(download_bytes, n, "download_bytes")
        up = _per_client(upload_bytes, n, "upload_bytes")
        duration = round_seconds(profiles, b, down, up)
        self.seconds += duration
        self.cpu_seconds += sum(p.compute_seconds(k) for p, k in zip(profiles, b, strict=True))
        self.bytes_down += sum(down)
        self.bytes_up += sum(up)
        self.rounds += 1
        return duration

    def add_bytes(self, down: int = 0, up: int = 0) -> None:
        """Count transfers that take no simulated time, e.g. a cohort server uploading its
        model to the global server (servers have unlimited bandwidth)."""
        self.bytes_down += _count(down, "down")
        self.bytes_up += _count(up, "up")

    @property
    def hours(self) -> float:
        """Simulated wall time in hours."""
        return self.seconds / 3600.0

    @property
    def cpu_hours(self) -> float:
        """Summed simulated compute time in hours."""
        return self.cpu_seconds / 3600.0

    @property
    def bytes_total(self) -> int:
        """Bytes sent in both directions."""
        return self.bytes_down + self.bytes_up

    def state(self) -> dict[str, float | int]:
        """A JSON-able copy of the counters (for checkpoints and ``summary.json``)."""
        return {
            "seconds": self.seconds,
            "cpu_seconds": self.cpu_seconds,
            "bytes_down": self.bytes_down,
            "bytes_up": self.bytes_up,
            "rounds": self.rounds,
        }

    @classmethod
    def from_state(cls, state: dict[str, float | int]) -> SimClock:
        """The inverse of :meth:`state` (resuming a run)."""
        return cls(
            seconds=float(state["seconds"]),
            cpu_seconds=float(state["cpu_seconds"]),
            bytes_down=int(state["bytes_down"]),
            bytes_up=int(state["bytes_up"]),
            rounds=int(state["rounds"]),
        )

    @classmethod
    def parallel(cls, clocks: Iterable[SimClock]) -> SimClock:
        """The total of clocks that ran side by side (CPFL's cohorts): wall time and rounds
        are the maximum (time to convergence = the last cohort to finish, Sec. 4.2),
        CPU-seconds and bytes are summed."""
        items = list(clocks)
        return cls(
            seconds=max((c.seconds for c in items), default=0.0),
            cpu_seconds=sum(c.cpu_seconds for c in items),
            bytes_down=sum(c.bytes_down for c in items),
            bytes_up=sum(c.bytes_up for c in items),
            rounds=max((c.rounds for c in items), default=0),
        )
