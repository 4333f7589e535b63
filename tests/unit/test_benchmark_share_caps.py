"""``benchmarks/share_caps.py``: what it records of each capped ensemble, that "off" turns
every cap to 1, that the strategies' own names are restored after, and its table."""

from __future__ import annotations

import torch
from benchmark_scripts import load_benchmark

import strategies.feddf as feddf

share_caps = load_benchmark("share_caps")


def test_it_records_the_largest_share_and_its_cap_and_off_caps_nothing() -> None:
    original = (feddf.cap_mean_shares, feddf.mean_share_caps)
    sizes = torch.tensor([10.0, 10.0, 10.0, 10.0, 10.0])  # caps max(2/5, 3/5) -> 1/2 (K >= 3)
    weights = torch.tensor([[0.75] * 2, [0.0625] * 2, [0.0625] * 2, [0.0625] * 2, [0.0625] * 2])
    on: list[tuple[float, float]] = []
    with share_caps.recorded(on, off=False):
        capped, which = feddf.cap_mean_shares(weights, feddf.mean_share_caps(sizes))
    assert on == [(0.75, 0.5)] and which == [0]
    assert torch.allclose(capped[0], torch.full((2,), 0.5), atol=1e-6)
    off: list[tuple[float, float]] = []
    with share_caps.recorded(off, off=True):
        same, none = feddf.cap_mean_shares(weights, feddf.mean_share_caps(sizes))
    assert off == [(0.75, 1.0)] and none == [] and torch.equal(same, weights)
    assert (feddf.cap_mean_shares, feddf.mean_share_caps) == original


def test_the_table_counts_the_ensembles_where_the_cap_bound() -> None:
    row = share_caps.Capped("dafkd", 0, [(0.51, 0.489), (0.2, 0.5)], 0.678, 0.703)
    assert row.bound == 1
    none = share_caps.Capped("fedavg", 0, [], 0.7, 0.7)
    table = share_caps.markdown([row, none]).splitlines()
    assert table[2] == "| dafkd | 0 | 2 | 1 | 0.510 (0.489) | 0.678 | 0.703 | -0.025 |"
    assert "no per-sample ensemble capped" in table[3]
