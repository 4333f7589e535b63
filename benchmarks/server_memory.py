"""What the simulated server holds at its memory peak: Flower's message store against the clients.

``benchmarks.scale`` found the simulated server's peak resident memory higher at 10,000
clients than at 1,000 (the same 100 clients a round), while the same round in one process did
not grow with K. This script runs one simulation (``benchmarks.overhead.run_flower``:
Flower's ``run_simulation`` with the ServerApp, Flower's simulation engine and its in-memory
message store in this process, the clients in Ray workers) of
``conf/bench/scale-cifar10.yaml`` with the scale benchmark's keys,
and samples, every ``--every`` seconds, the process's resident memory and how many messages
Flower's store holds: instructions not yet taken by a worker (``message_ins_store``) and
replies not yet pulled by the ServerApp (``message_res_store``), with the bytes of the replies'
arrays. It prints the peak, the most replies held at once and what the store held at the
peak, so a growth of the peak can be set against the replies that wait for the server.

    .venv/bin/python -m benchmarks.server_memory --clients 1000 [--method fedavg] \
        [--per-round 100] [--supernodes 20] [--every 0.02] [--out FILE.json] [k=v ...]

Memory, not time: the sampled counts depend on how fast the clients' workers run against the
server, so run it alone on the machine.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.overhead import run_flower
from benchmarks.scale import CONFIG, METHODS, overrides
from benchmarks.sweep import add_data_arguments, ensure_data
from fedgo_flwr.runtime.messages import array_bytes
from strategies import load_experiment

ROOT = Path(__file__).resolve().parent.parent
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mib() -> float:
    """This process's resident memory now (MiB, as ``summary.json``'s ``server_peak_rss_mb``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def find_store():
    """Flower's in-memory message store of this process, once the simulation made it."""
    module = sys.modules.get("flwr.server.superlink.linkstate.in_memory_linkstate")
    if module is None:
        return None
    cls = module.InMemoryLinkState
    return next((o for o in gc.get_objects() if isinstance(o, cls)), None)


def held_bytes(store: dict) -> int:
    """Bytes of the arrays in the messages of one of the store's dicts (a snapshot)."""
    total = 0
    for msg in list(store.values()):
        if not msg.has_error():
            total += array_bytes(msg.content)
    return total


GROWTH_MIB = 4.0  # a sample this much above the one before names the code that runs


def growing_in(sampler: int | None) -> list[str]:
    """Where every other thread is: its innermost frame of this project (or its innermost
    frame), as ``file:line function``."""
    where = []
    for ident, frame in sys._current_frames().items():
        if ident == sampler:
            continue
        inner, own = frame, None
        while frame is not None:
            name = frame.f_code.co_filename
            if own is None and str(ROOT) in name and "/.venv/" not in name:
                own = frame
            frame = frame.f_back
        at = own or inner
        file = Path(at.f_code.co_filename)
        where.append(f"{file.parent.name}/{file.name}:{at.f_lineno} {at.f_code.co_name}")
    return sorted(where)


class Sampler(threading.Thread):
    """Samples memory and the store's counts until stopped; keeps the peak and the maxima."""

    def __init__(self, every: float) -> None:
        super().__init__(daemon=True)
        self.every = every
        self.stop = threading.Event()
        self.samples: list[dict] = []
        self.state = None

    def run(self) -> None:
        t0 = time.monotonic()
        last_look = -1.0
        while not self.stop.is_set():
            now = time.monotonic() - t0
            if self.state is None and now - last_look >= 1.0:
                last_look = now
                self.state = find_store()
            row = {"t": round(now, 3), "rss_mib": round(rss_mib(), 1)}
            if self.state is not None:
                row["ins"] = len(self.state.message_ins_store)
                row["res"] = len(self.state.message_res_store)
                row["res_mib"] = round(held_bytes(self.state.message_res_store) / 2**20, 1)
            if self.samples and row["rss_mib"] - self.samples[-1]["rss_mib"] >= GROWTH_MIB:
                row["growing_in"] = growing_in(self.ident)
            self.samples.append(row)
            self.stop.wait(self.every)


def summarize(samples: list[dict], peak_rss_mib: float) -> dict:
    """The peak (``ru_maxrss`` and the largest sample), the most replies held at once, and
    what the store held at the largest sample."""
    top = max(samples, key=lambda r: r["rss_mib"])
    most = max(samples, key=lambda r: r.get("res", 0))
    return {
        "peak_rss_mib": round(peak_rss_mib, 1),
        "largest_sample": top,
        "most_replies_held": most,
        "replies_held_over_50": sum(r.get("res", 0) > 50 for r in samples),
        "samples": len(samples),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--method", default="fedavg", choices=list(METHODS))
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--supernodes", type=int, default=20)
    parser.add_argument("--every", type=float, default=0.02)
    parser.add_argument("--out", help="write the summary and every sample here (JSON)")
    add_data_arguments(parser)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    data = ensure_data((ROOT / args.data).resolve(), args.archive)
    keys = overrides(args.method, args.clients, data, args.overrides, args.per_round)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_experiment(str(ROOT / CONFIG), [*keys, "rounds=3", f"output_dir={tmp}/run"])
        sampler = Sampler(args.every)
        sampler.start()
        run_flower(cfg, args.supernodes)
        sampler.stop.set()
        sampler.join()
        summary = json.loads((Path(tmp) / "run" / "summary.json").read_text())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10  # KiB on Linux
    report = summarize(sampler.samples, peak)
    report["server_peak_rss_mib_at_the_end_of_the_rounds"] = summary.get("server_peak_rss_mb")
    report["final_accuracy"] = summary.get("final_accuracy")
    print(json.dumps(report, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps({**report, "all": sampler.samples}) + "\n")


if __name__ == "__main__":
    main()
