"""Framework overhead: a Flower-simulated round versus the same work in one plain process.

Runs one experiment twice with identical config and seed:

1. as a Flower simulation (``flwr.simulation.run_simulation``: Ray backend, message
   serialisation, one ClientApp per sampled node), reading per-round times from metrics.jsonl;
2. in one Python process through :class:`fedgo_app.inprocess.InProcessGrid`: the same
   ServerApp code and strategy, the same ClientApp handler called directly
   (``client_app(message, context)``) one node after another, no Ray and no SuperLink.

Both compute the same thing (same sampling, seeds, training), so their accuracies must agree;
the script checks that and prints the ratio of median round times (round 1, which includes data
loading in fresh Ray workers, is reported separately) and each mode's share of a round outside
the compute of its phases (:func:`round_compute`), split into the ClientApp's own set-up around
the training (:func:`setup_share`) and the rest, the runtime's (in the Flower mode: Flower's
share).

    .venv/bin/python -m benchmarks.overhead [CONFIG] [--supernodes N] [dotted.key=value ...]

``--supernodes N`` simulates N nodes for the K clients (each node serves the clients ``k`` with
``k mod N`` equal to its id, one after another: ``FEDGO_SUPERNODES``); default K.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from flwr.simulation import run_simulation

from fedgo_app.client_app import app as client_app
from fedgo_app.inprocess import run_inprocess
from fedgo_app.server_app import server_app_for
from fedgo_flwr.config.experiment import ExperimentConfig
from strategies import load_experiment

ROOT = Path(__file__).resolve().parent.parent


def round_compute(row: dict, parallel: int) -> float:
    """The compute of one round's phases (seconds): the clients' training spread over the
    ``parallel`` workers that ran at once (no more than the clients that replied), plus the
    server's aggregation and evaluation. A round's wall time minus this is the time outside
    compute: Flower's runtime, messages, waits and the clients' data loading."""
    clients = row.get("client_time_sum", 0.0) / min(parallel, row.get("clients_replied") or 1)
    return clients + row.get("aggregate_time", 0.0) + row.get("eval_time", 0.0)


def later_rounds(rows: list[dict]) -> list[dict]:
    """Rounds 2..R (round 1 loads the data), or round 1 alone."""
    return [r for r in rows if r["round"] > 0][1:] or [r for r in rows if r["round"] > 0]


def outside_share(rows: list[dict], parallel: int) -> float:
    """1 - median compute / median wall time over rounds 2..R."""
    later = later_rounds(rows)
    wall = statistics.median(r["round_time"] for r in later)
    return 1 - statistics.median(round_compute(r, parallel) for r in later) / wall


def setup_share(rows: list[dict], parallel: int) -> float | None:
    """The part of :func:`outside_share` spent in the clients' train handlers around their
    training (the ClientApp's own set-up and reply: ``client_handler_time_sum`` minus
    ``client_time_sum``, spread over the workers), as a share of the median round; the rest
    is the runtime's (Flower's, or the in-process grid's). ``None`` without handler times."""
    later = later_rounds(rows)
    if not all("client_handler_time_sum" in r for r in later):
        return None
    wall = statistics.median(r["round_time"] for r in later)
    spread = [
        (r["client_handler_time_sum"] - r.get("client_time_sum", 0.0))
        / min(parallel, r.get("clients_replied") or 1)
        for r in later
    ]
    return statistics.median(spread) / wall


def run_flower(
    cfg: ExperimentConfig, supernodes: int = 0, init_args: dict | None = None
) -> list[dict]:
    """``cfg`` as a Flower simulation (Ray backend); its metrics rows. ``init_args`` go to
    ``ray.init`` (e.g. ``num_cpus``: how many CPUs Ray may give out, so how many clients run
    at once)."""
    backend: dict = {
        "client_resources": {
            "num_cpus": cfg.resources.client_cpus,
            "num_gpus": cfg.resources.client_gpus,
        }
    }
    if init_args:
        backend["init_args"] = dict(init_args)
    run_simulation(
        server_app=server_app_for(cfg),
        client_app=client_app,
        num_supernodes=supernodes or cfg.data.num_clients,
        backend_config=backend,
    )
    lines = (Path(cfg.output_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def run_plain(cfg: ExperimentConfig) -> list[dict]:
    """The same rounds without Flower's runtime: one process, clients one after another."""
    run_inprocess(cfg)
    lines = (Path(cfg.output_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def main(argv: list[str]) -> None:
    supernodes = 0
    if "--supernodes" in argv:
        at = argv.index("--supernodes")
        supernodes = int(argv[at + 1])
        argv = [*argv[:at], *argv[at + 2 :]]
    config = argv[0] if argv and "=" not in argv[0] else str(ROOT / "conf/default.yaml")
    overrides = [a for a in argv if "=" in a]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        modes = (("flower", lambda c: run_flower(c, supernodes)), ("plain", run_plain))
        for mode, fn in modes:
            cfg = load_experiment(config, [*overrides, f"output_dir={tmp}/{mode}"])
            t0 = time.perf_counter()
            rows = fn(cfg)
            results[mode] = {"rows": rows, "total": time.perf_counter() - t0}
    report = {}
    workers = max(1, (os.cpu_count() or 1) // cfg.resources.client_cpus)  # Ray workers at once
    for mode, res in results.items():
        times = [r["round_time"] for r in res["rows"] if r["round"] > 0]
        parallel = workers if mode == "flower" else 1
        outside = outside_share(res["rows"], parallel)
        setup = setup_share(res["rows"], parallel)
        report[mode] = {
            "total_s": round(res["total"], 2),
            "round1_s": round(times[0], 3),
            "median_round_s": round(statistics.median(times[1:] or times), 3),
            "outside_compute_share": round(outside, 3),
            "client_setup_share": None if setup is None else round(setup, 3),
            "runtime_share": None if setup is None else round(outside - setup, 3),
            "final_accuracy": res["rows"][-1]["test_accuracy"],
        }
    report["ratio_median_round"] = round(
        report["flower"]["median_round_s"] / report["plain"]["median_round_s"], 2
    )
    report["ratio_total"] = round(report["flower"]["total_s"] / report["plain"]["total_s"], 2)
    accs = [[r["test_accuracy"] for r in results[m]["rows"]] for m in ("flower", "plain")]
    report["same_accuracies"] = accs[0] == accs[1]
    report["simulated_nodes"] = supernodes or cfg.data.num_clients
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
