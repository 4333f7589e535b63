"""Tests for ``fedgo_flwr.learning.systems``: device profiles, the round clock, CPU-hours and
bytes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fedgo_flwr.learning.systems import (
    FEDSCALE_BYTES_PER_SECOND,
    FEDSCALE_SECONDS_PER_BATCH,
    DeviceProfile,
    ProfileError,
    SimClock,
    client_round_seconds,
    load_profiles,
    round_seconds,
    synthetic_profiles,
)

# Hand-made devices: (seconds per batch, bytes per second).
FAST = DeviceProfile(1.0, 1000.0)
SLOW = DeviceProfile(4.0, 100.0)


def test_client_round_is_download_plus_training_plus_upload() -> None:
    # 500 B down at 100 B/s = 5 s, 3 batches x 4 s = 12 s, 200 B up = 2 s.
    assert client_round_seconds(SLOW, 3, 500, 200) == pytest.approx(19.0)
    assert client_round_seconds(FAST, 3, 500, 200) == pytest.approx(0.5 + 3.0 + 0.2)


def test_round_lasts_as_long_as_the_slowest_participant() -> None:
    assert round_seconds([FAST, SLOW], 3, 500, 200) == pytest.approx(19.0)
    # Per-participant batches: the fast client with many batches is now the slowest.
    assert round_seconds([FAST, SLOW], [30, 1], 500, 200) == pytest.approx(30.7)
    assert round_seconds([], 3, 500, 200) == 0.0


def test_round_rejects_mismatched_or_negative_inputs() -> None:
    with pytest.raises(ValueError, match="batches: 1 values for 2 participants"):
        round_seconds([FAST, SLOW], [3], 500, 200)
    with pytest.raises(ValueError, match="upload_bytes"):
        round_seconds([FAST], 3, 500, -1)


def test_sim_clock_sums_rounds_cpu_time_and_bytes() -> None:
    clock = SimClock()
    first = clock.add_round([FAST, SLOW], 3, 500, 200)
    second = clock.add_round([SLOW], [2], 100, [100])
    assert first == pytest.approx(19.0)
    assert second == pytest.approx(1.0 + 8.0 + 1.0)
    assert clock.seconds == pytest.approx(29.0)
    assert clock.rounds == 2
    # CPU time: compute only, every participant: (3 + 12) + 8.
    assert clock.cpu_seconds == pytest.approx(23.0)
    assert clock.bytes_down == 2 * 500 + 100
    assert clock.bytes_up == 2 * 200 + 100
    clock.add_bytes(up=1000)  # e.g. the cohort model to the global server: no time
    assert clock.bytes_total == 1100 + 1500
    assert clock.seconds == pytest.approx(29.0)
    assert clock.hours == pytest.approx(29.0 / 3600)
    assert clock.cpu_hours == pytest.approx(23.0 / 3600)


def test_sim_clock_state_round_trips_and_parallel_takes_the_slowest_cohort() -> None:
    a, b = SimClock(), SimClock()
    a.add_round([SLOW], 10, 0, 0)  # 40 s
    b.add_round([FAST], 5, 0, 0)  # 5 s
    b.add_round([FAST], 5, 1000, 1000)  # 7 s
    assert SimClock.from_state(a.state()) == a
    total = SimClock.parallel([a, b])
    assert total.seconds == pytest.approx(40.0)
    assert total.cpu_seconds == pytest.approx(40.0 + 10.0)
    assert total.bytes_total == 2000
    assert total.rounds == 2
    assert SimClock.parallel([]) == SimClock()


@pytest.mark.parametrize(
    ("spb", "bps"), [(0.0, 1.0), (-1.0, 1.0), (1.0, math.inf), (math.nan, 1.0), (True, 1.0)]
)
def test_device_profile_rejects_bad_values(spb: float, bps: float) -> None:
    with pytest.raises(ProfileError, match="seconds_per_batch|bytes_per_second"):
        DeviceProfile(spb, bps)


def test_synthetic_profiles_are_seeded_and_within_fedscale_ranges() -> None:
    a = synthetic_profiles(500, seed=3)
    assert a == synthetic_profiles(500, seed=3)
    assert a != synthetic_profiles(500, seed=4)
    # Client i's device does not depend on the population size.
    assert synthetic_profiles(10, seed=3) == a[:10]
    spb = [p.seconds_per_batch for p in a]
    bps = [p.bytes_per_second for p in a]
    assert FEDSCALE_SECONDS_PER_BATCH[0] <= min(spb) and max(spb) <= FEDSCALE_SECONDS_PER_BATCH[1]
    assert FEDSCALE_BYTES_PER_SECOND[0] <= min(bps) and max(bps) <= FEDSCALE_BYTES_PER_SECOND[1]
    # Log-uniform: about half the devices lie below the geometric midpoint of each range
    # (a uniform draw would put only ~5% of bandwidths below it).
    mid_bps = math.sqrt(FEDSCALE_BYTES_PER_SECOND[0] * FEDSCALE_BYTES_PER_SECOND[1])
    mid_spb = math.sqrt(FEDSCALE_SECONDS_PER_BATCH[0] * FEDSCALE_SECONDS_PER_BATCH[1])
    assert 0.4 < sum(x < mid_bps for x in bps) / len(bps) < 0.6
    assert 0.4 < sum(x < mid_spb for x in spb) / len(spb) < 0.6


def test_synthetic_profiles_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="num_clients"):
        synthetic_profiles(0, seed=0)
    with pytest.raises(ValueError, match="seed"):
        synthetic_profiles(3, seed=-1)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "devices.csv"
    path.write_text(text)
    return path


def test_load_profiles_reads_rows_in_any_order(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "bytes_per_second, client_id, seconds_per_batch\n100, 1, 4\n\n1e3, 0, 1.0\n",
    )
    assert load_profiles(path, 2) == [FAST, SLOW]


def test_load_profiles_reports_every_bad_row_with_file_line_and_column(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "client_id,seconds_per_batch,bytes_per_second\n"
        "0,1.0,1000\n"  # line 2: fine
        "0,2.0,1000\n"  # line 3: duplicate of line 2
        "1,0,1000\n"  # line 4: non-positive
        "2,abc,1000\n"  # line 5: not a number
        "3,1.0,inf\n"  # line 6: non-finite
        "x,1.0,1000\n"  # line 7: bad id
        "9,1.0,1000\n"  # line 8: out of range
        "4,1.0\n",  # line 9: too few fields
    )
    with pytest.raises(ProfileError) as info:
        load_profiles(path, 6)
    msg = str(info.value)
    assert f"{path}:3, column client_id" in msg and "line 2" in msg
    assert f"{path}:4, column seconds_per_batch" in msg
    assert f"{path}:5, column seconds_per_batch" in msg and "'abc' is not a number" in msg
    assert f"{path}:6, column bytes_per_second" in msg
    assert f"{path}:7, column client_id" in msg
    assert f"{path}:8, column client_id" in msg and "outside 0..5" in msg
    assert f"{path}:9: 2 fields, expected 3" in msg
    assert "no row for client(s) 4-5" in msg
    assert "8 problem(s)" in msg


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "empty device profile file"),
        ("client_id,seconds_per_batch\n0,1\n", r"lacks column\(s\) \['bytes_per_second'\]"),
    ],
)
def test_load_profiles_rejects_bad_headers(tmp_path: Path, text: str, match: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ProfileError, match=match) as info:
        load_profiles(path, 1)
    assert str(path) in str(info.value)


def test_load_profiles_names_a_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.csv"
    with pytest.raises(ProfileError, match="nope.csv"):
        load_profiles(missing, 3)
