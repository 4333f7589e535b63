"""benchmarks/server_memory.py: what it counts in Flower's store, and where it says memory grew."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from benchmark_scripts import load_benchmark
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict


@pytest.fixture(scope="module")
def mem():
    return load_benchmark("server_memory")


class Stored:
    """What :func:`held_bytes` reads of a message in Flower's store: its content, or an error."""

    def __init__(self, arrays: dict[str, np.ndarray] | None, error: bool = False) -> None:
        self.content = RecordDict({"config": ConfigRecord({"x": 1})})
        if arrays is not None:
            self.content["arrays"] = ArrayRecord({k: Array(v) for k, v in arrays.items()})
        self.error = error

    def has_error(self) -> bool:
        return self.error


def test_held_bytes_counts_the_arrays_of_every_reply_and_none_of_an_error(mem) -> None:
    a = np.zeros((10, 10), dtype=np.float32)  # 400 bytes of data
    b = np.zeros(25, dtype=np.float64)  # 200 bytes
    store = {"r1": Stored({"w": a}), "r2": Stored({"w": a, "v": b}), "r3": Stored(None)}
    one = mem.held_bytes({"r1": store["r1"]})
    assert one >= a.nbytes
    both = mem.held_bytes({"r2": store["r2"]})
    assert both - one >= b.nbytes  # the second array counted too
    assert mem.held_bytes(store) == one + both  # a reply without arrays adds nothing
    assert mem.held_bytes({**store, "e": Stored({"w": a}, error=True)}) == one + both


def test_summarize_names_the_largest_sample_and_the_most_replies_held(mem) -> None:
    samples = [
        {"t": 0.0, "rss_mib": 600.0},
        {"t": 1.0, "rss_mib": 700.0, "ins": 3, "res": 60, "res_mib": 30.0},
        {"t": 2.0, "rss_mib": 900.0, "ins": 0, "res": 2, "res_mib": 1.0},
        {"t": 3.0, "rss_mib": 650.0, "ins": 0, "res": 0, "res_mib": 0.0},
    ]
    report = mem.summarize(samples, peak_rss_mib=905.0)
    assert report["peak_rss_mib"] == 905.0
    assert report["largest_sample"]["t"] == 2.0
    assert report["most_replies_held"]["t"] == 1.0
    assert report["replies_held_over_50"] == 1
    assert report["samples"] == 4


def test_growing_in_names_the_project_code_each_other_thread_runs(mem) -> None:
    started, release = threading.Event(), threading.Event()

    def busy_in_this_file() -> None:
        started.set()
        release.wait(10)

    worker = threading.Thread(target=busy_in_this_file)
    worker.start()
    started.wait(10)
    try:
        where = mem.growing_in(threading.get_ident())  # this thread is the sampler: left out
    finally:
        release.set()
        worker.join()
    ours = [w for w in where if w.startswith("unit/test_benchmark_server_memory.py:")]
    assert len(ours) == 1 and ours[0].endswith(" busy_in_this_file")
    assert not any("growing_in_names" in w for w in where)
