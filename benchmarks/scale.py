"""Many simulated clients: round time, Flower's share of it and the server's memory (issue 18).

For every number of clients K (``--clients``, default 10 100 1000) and method (FedAvg, FedDF),
``conf/bench/scale-cifar10.yaml`` runs with ``data.num_clients=K`` and
``data.train_subset=50 K`` (25 images per client, 25 K server images; at most CIFAR-10's
50,000, so from K = 1,000 on the clients share 25,000 images: 2 or 3 each at K = 10,000) and,
with ``--per-round N``, ``fraction=N/K`` (the same N clients a round at every K; default: the
config's 10%), twice:

- ``sim``: through ``./run.sh`` (a real ``flwr run`` on Flower's simulation runtime, Ray, one
  simulated node per client unless ``--supernodes`` says otherwise);
- ``local``: the same code in one process (:func:`fedgo_app.inprocess.run_inprocess`), the
  clients one after another; its figures have no Flower runtime in them.

Per run it reports the median round time (rounds 2..R; round 1 separately), the start-up
(the wall time of the whole command minus the rounds' and the final write's time, the
summary's ``stage_times``, or, in a summary written before it had them, ``total_time``,
which then began after the set-up: Python, data loading and partitioning, and for ``sim``
the SuperLink, Ray and the workers), the round's compute
(clients' training spread over the workers that ran at once, plus the server's aggregation and
evaluation) and the rest of the round (Flower's runtime, messages, the clients' data loading),
and the server process's peak resident memory (``summary.json``: ``server_peak_rss_mb``; for
``local`` it includes the clients). Both modes must give the same accuracies (checked).

    .venv/bin/python -m benchmarks.scale [--clients 10 100 1000] [--methods fedavg feddf]
        [--modes sim local] [--tag scale-cifar10] [k=v ...]

Each finished run is kept in ``benchmarks/results/<tag>/`` (resumable); ``--table-only``
rebuilds ``table.md``. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from pathlib import Path

from benchmarks.overhead import round_compute
from benchmarks.sweep import (
    Kept,
    add_data_arguments,
    ensure_data,
    finished,
    keep_run,
    run_command,
    write_table,
)

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "conf/bench/scale-cifar10.yaml"
METHODS = {
    "fedavg": ["strategy.name=fedavg"],
    "feddf": ["strategy.name=feddf", "strategy.weighting=uniform"],
}


def run_name(mode: str, method: str, clients: int, supernodes: int = 0) -> str:
    """``sim-feddf-k1000``; ``sim-feddf-k1000-n20`` where 20 simulated nodes serve the clients."""
    nodes = f"-n{supernodes}" if mode == "sim" and 0 < supernodes < clients else ""
    return f"{mode}-{method}-k{clients}{nodes}"


RUN_NAME = re.compile(r"(?P<mode>sim|local)-(?P<method>\w+)-k(?P<k>\d+)(?:-n(?P<nodes>\d+))?")
TRAIN_IMAGES = 50_000  # CIFAR-10's training set


def overrides(
    method: str, clients: int, data: Path, extra: list[str], per_round: int = 0
) -> list[str]:
    """The run's keys: K clients on ``min(50 K, 50,000)`` training images, ``per_round``
    clients a round (``fraction = per_round / K``; 0: the config's fraction)."""
    if per_round > clients:
        raise SystemExit(f"--per-round {per_round} is more than the {clients} clients")
    fraction = [f"fraction={per_round / clients!r}"] if per_round else []
    return [
        f"data.path={data}",
        f"data.num_clients={clients}",
        f"data.train_subset={min(50 * clients, TRAIN_IMAGES)}",
        *fraction,
        *METHODS[method],
        *extra,
    ]


def run_one(mode: str, method: str, clients: int, args, data: Path) -> Path:
    """One run; returns its output folder (with ``wall.json``: the command's wall time)."""
    out = ROOT / "outputs" / "bench" / args.tag / run_name(mode, method, clients, args.supernodes)
    keys = [*overrides(method, clients, data, args.overrides, args.per_round), "overwrite=true"]
    env = dict(os.environ)
    if mode == "sim":
        cmd = [str(ROOT / "run.sh"), CONFIG, *keys, f"output_dir={out}"]
        if 0 < args.supernodes < clients:
            env["FEDGO_SUPERNODES"] = str(args.supernodes)
    else:
        cmd = [sys.executable, "-m", "fedgo_app.inprocess", CONFIG, *keys, f"output_dir={out}"]
    wall = run_command(cmd, out / "run.log", env=env)
    (out / "wall.json").write_text(json.dumps({"wall_seconds": wall}) + "\n")
    return out


def after_setup(summary: dict) -> float:
    """The seconds of a run after its set-up: its rounds and final write (``stage_times``);
    ``total_time`` in a summary written before ``stage_times`` existed (it began there)."""
    stages = summary.get("stage_times")
    if isinstance(stages, dict) and "rounds" in stages:
        return float(stages["rounds"]) + float(stages.get("finish", 0.0))
    return float(summary["total_time"])


def figures(kept: Kept, name: str, workers: int) -> dict:
    """The table's figures of one kept run."""
    summary = kept.json(name)
    rows = [json.loads(x) for x in kept.get(name, "metrics.jsonl").decode().splitlines()]
    wall = kept.json(name, "wall.json")["wall_seconds"]
    rounds = [r for r in rows if r["round"] > 0]
    later = rounds[1:] or rounds
    parallel = 1 if name.startswith("local") else workers

    median_round = statistics.median(r["round_time"] for r in later)
    median_compute = statistics.median(round_compute(r, parallel) for r in later)
    # In a simulation the server computes a reply's teacher logits while other clients still
    # train (aggregate_time overlaps the clients'): no sum of phases is the round's compute.
    overlaps = parallel > 1 and any(r.get("teacher_time") for r in later)
    return {
        "clients_per_round": rounds[0].get("clients_sampled"),
        "round1_s": rounds[0]["round_time"],
        "median_round_s": median_round,
        "median_compute_s": median_compute,
        "outside_share": None if overlaps else 1 - median_compute / median_round,
        "startup_s": wall - after_setup(summary),
        "wall_s": wall,
        "server_peak_rss_mb": summary.get("server_peak_rss_mb"),
        "accuracies": [r["test_accuracy"] for r in rows],
    }


def table(results: Path, workers: int) -> str:
    lines = [
        "| K | method | mode | nodes | clients/round | round 1 (s) | median round (s) "
        "| compute (s) | outside compute | sim / local round | start-up (s) "
        "| server peak RSS (MB) |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    kept = Kept(results)
    names = {name: RUN_NAME.fullmatch(name) for name in kept.names()}
    parts = {name: m.groupdict() for name, m in names.items() if m}
    order = sorted(parts, key=lambda n: (int(parts[n]["k"]), parts[n]["method"], n))
    found = {name: figures(kept, name, workers) for name in order}
    for name, f in found.items():
        mode, method, k = parts[name]["mode"], parts[name]["method"], parts[name]["k"]
        nodes = parts[name]["nodes"] or (k if mode == "sim" else "-")
        peak, outside = f["server_peak_rss_mb"], f["outside_share"]
        twin = f"local-{method}-k{k}"
        local = found.get(twin) if mode == "sim" else None
        ratio = f["median_round_s"] / local["median_round_s"] if local else None
        lines.append(
            f"| {k} | {method} | {mode} | {nodes} | {f['clients_per_round']} "
            f"| {f['round1_s']:.1f} "
            f"| {f['median_round_s']:.1f} | {f['median_compute_s']:.1f} "
            f"| {'-' if outside is None else f'{outside:.0%}'} "
            f"| {'' if ratio is None else f'{ratio:.2f}'} | {f['startup_s']:.1f} "
            f"| {'-' if peak is None else f'{peak:.0f}'} |"
        )
    same = []
    for name, f in found.items():
        twin = f"local-{parts[name]['method']}-k{parts[name]['k']}"
        if name.startswith("sim-") and twin in found:
            same.append(f"{name[4:]}: {f['accuracies'] == found[twin]['accuracies']}")
    if same:
        lines += ["", "Same accuracies in both modes: " + ", ".join(same) + "."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", nargs="+", type=int, default=[10, 100, 1000])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--modes", nargs="+", default=["sim", "local"], choices=["sim", "local"])
    parser.add_argument("--supernodes", type=int, default=0, help="simulated nodes (0: K)")
    parser.add_argument(
        "--per-round", type=int, default=0, help="clients a round at every K (0: the config's)"
    )
    parser.add_argument("--tag", default="scale-cifar10")
    parser.add_argument("--table-only", action="store_true")
    add_data_arguments(parser)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    results = ROOT / "benchmarks" / "results" / args.tag
    workers = os.cpu_count() or 1  # resources.client_cpus is 1: one Ray worker per core
    if not args.table_only:
        data = ensure_data(ROOT / args.data, args.archive)
        for k in args.clients:
            for method in args.methods:
                for mode in args.modes:
                    name = run_name(mode, method, k, args.supernodes)
                    if finished(results, name):
                        continue
                    out = run_one(mode, method, k, args, data)
                    keep_run(out, results, name, root=ROOT, extra=["wall.json"])
    write_table(results, table(results, workers))


if __name__ == "__main__":
    main()
