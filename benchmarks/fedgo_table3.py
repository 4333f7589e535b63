"""The shape of FedGO's Table 3 / Fig. 2 at CPU scale on the shared CIFAR-10 JPEGs.

For every seed, the methods below run through ``./run.sh`` on ONE partition and ONE client
sampling sequence (both depend only on the seed): FedAvg, FedDF (uniform), n_k-only,
variance (Fed-ET), entropy (FedHKT/FedDS), domain-aware (DaFKD weighting) and FedGO. FedGO runs
first and trains the generator and the discriminators; the domain-aware run reuses them
(``strategy.generator.path`` / ``strategy.discriminator.path``), so both see the same ones.

Runs are resumable: a run whose ``summary.json`` exists is skipped, and an interrupted run
continues from its last per-round checkpoint (``resume=true``). Each finished run's summary
and per-round metrics are copied to ``benchmarks/results/<tag>/`` (committed), and the table is
rebuilt from there, so a long benchmark can be spread over several sessions.

    .venv/bin/python benchmarks/fedgo_table3.py --seeds 0 1 2 [--tag cifar10-cpu] [k=v ...]
    .venv/bin/python benchmarks/fedgo_table3.py --table-only [--tag cifar10-cpu]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHIVE = ROOT.parent / "shared" / "data" / "cifar10-jpg.tar.gz"
DATA = ROOT / ".cache" / "cifar10-jpg"

METHODS: dict[str, list[str]] = {
    "fedavg": ["strategy.name=fedavg"],
    "feddf": ["strategy.name=feddf", "strategy.weighting=uniform"],
    "data_size": ["strategy.name=feddf", "strategy.weighting=data_size"],
    "variance": ["strategy.name=feddf", "strategy.weighting=variance"],
    "entropy": ["strategy.name=feddf", "strategy.weighting=entropy"],
    "fedgo": ["strategy.name=fedgo", "strategy.weighting=fedgo"],
    "domain": ["strategy.name=fedgo", "strategy.weighting=domain"],
}
DIAGNOSTICS = [
    "uniform",
    "data_size",
    "variance",
    "entropy",
    "domain",
    "fedgo",
    "fedgo_sigmoid",
    "oracle",
]


def ensure_data() -> Path:
    if (DATA / "train").is_dir():
        return DATA
    if not ARCHIVE.is_file():
        sys.exit(f"CIFAR-10 JPEGs not found: neither {DATA} nor {ARCHIVE}")
    DATA.mkdir(parents=True, exist_ok=True)
    print(f"unpacking {ARCHIVE} -> {DATA}", file=sys.stderr)
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(DATA, filter="data")
    inner = [p for p in DATA.iterdir() if p.is_dir() and (p / "train").is_dir()]
    if not (DATA / "train").is_dir() and inner:
        for child in inner[0].iterdir():
            child.rename(DATA / child.name)
    return DATA


def run_one(method: str, seed: int, args: argparse.Namespace, results: Path) -> None:
    run_dir = ROOT / "outputs" / "bench" / args.tag / f"{method}-seed{seed}"
    keep = results / f"{method}-seed{seed}"
    if (keep / "summary.json").exists():
        return
    extra = []
    if method == "domain":
        fedgo_dir = ROOT / "outputs" / "bench" / args.tag / f"fedgo-seed{seed}"
        if (fedgo_dir / "discriminators.pt").exists():
            extra = [
                f"strategy.generator.path={fedgo_dir / 'generator.pt'}",
                f"strategy.discriminator.path={fedgo_dir / 'discriminators.pt'}",
            ]
        else:  # only the FedGO run's summary was kept: train them again (same seed and data)
            note = f"note: {fedgo_dir} has no discriminators; domain trains its own"
            print(note, file=sys.stderr)
    cmd = [
        str(ROOT / "run.sh"),
        args.config,
        f"data.path={DATA}",
        f"seed={seed}",
        "resume=true",  # an interrupted run continues from its last checkpoint
        *args.overrides,
        *METHODS[method],
        *extra,
        f"output_dir={run_dir}",
    ]
    print("$", " ".join(cmd[1:]), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    (run_dir / "run.log").parent.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"run failed ({run_dir / 'run.log'}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    keep.mkdir(parents=True, exist_ok=True)
    for name in ("summary.json", "metrics.jsonl", "config.yaml", "prefl.json"):
        if (run_dir / name).exists():
            shutil.copy(run_dir / name, keep / name)


def mean_sd(values: list[float], scale: float = 100.0) -> str:
    if not values:
        return "-"
    m = statistics.mean(values) * scale
    sd = statistics.stdev(values) * scale if len(values) > 1 else 0.0
    return f"{m:.1f} ± {sd:.1f}"


def seed_of(run_folder: Path) -> str:
    """``"seed0"`` for a run folder ``<method>-seed0``."""
    return run_folder.name.split("-")[-1]


def finished_runs(results: Path) -> dict[str, list[tuple[str, dict, list[dict]]]]:
    """Every finished run, read once: method -> [(seed folder suffix, summary, metric rows)]."""
    runs: dict[str, list[tuple[str, dict, list[dict]]]] = {}
    for method in METHODS:
        for summary_path in sorted(results.glob(f"{method}-seed*/summary.json")):
            summary = json.loads(summary_path.read_text())
            lines = (summary_path.parent / "metrics.jsonl").read_text().splitlines()
            seed = seed_of(summary_path.parent)
            runs.setdefault(method, []).append((seed, summary, [json.loads(x) for x in lines]))
    return runs


def table(results: Path) -> str:
    runs = finished_runs(results)
    rows = []
    header = (
        "| method | seeds | server acc final | server acc best | ensemble acc (last) "
        "| avg-param acc (last) | server s/round (median of seeds) |"
    )
    rows += [header, "|---|---|---|---|---|---|---|"]
    diag: dict[str, list[float]] = {d: [] for d in DIAGNOSTICS}
    server_time: dict[str, dict[str, float]] = {}  # method -> seed folder -> s/round
    for method, method_runs in runs.items():
        finals, bests, ens, avg = [], [], [], []
        times = server_time.setdefault(method, {})
        for seed, summary, metrics in method_runs:
            finals.append(summary["final_accuracy"])
            bests.append(summary["best_accuracy"])
            last = metrics[-1]
            if "ensemble_test_accuracy" in last:
                ens.append(last["ensemble_test_accuracy"])
                avg.append(last["init_test_accuracy"])
            # Server work per round: aggregation incl. teacher logits, weights and distillation
            # (aggregate_time), without the diagnostic ensemble evaluation on the test split.
            per_round = [
                r.get("aggregate_time", 0) - r.get("ensemble_eval_time", 0) for r in metrics[1:]
            ]
            times[seed] = statistics.mean(per_round) if per_round else 0.0
            if method in ("feddf", "fedgo"):
                for d in DIAGNOSTICS:
                    vals = [r[f"pl_acc_{d}"] for r in metrics[1:] if f"pl_acc_{d}" in r]
                    if vals:
                        diag[d].append(statistics.mean(vals))
        rows.append(
            f"| {method} | {len(method_runs)} | {mean_sd(finals)} | {mean_sd(bests)} "
            f"| {mean_sd(ens)} | {mean_sd(avg)} | {statistics.median(times.values()):.2f} |"
        )
    rows += [
        "",
        "Mean pseudo-label accuracy on the server set over rounds (FedDF and FedGO runs):",
        "",
        "| weighting | accuracy (%) |",
        "|---|---|",
    ]
    rows += [f"| {d} | {mean_sd(v)} |" for d, v in diag.items() if v]
    rows += ["", *figure2(runs)]
    fedgo, feddf = server_time.get("fedgo", {}), server_time.get("feddf", {})
    both = [seed for seed in fedgo if feddf.get(seed)]
    if both:  # per seed: a run that shared the cores shows up as an outlier
        ratio = {seed: fedgo[seed] / feddf[seed] for seed in both}
        by_seed = ", ".join(f"{seed} {r:.2f}" for seed, r in ratio.items())
        rows += [
            "",
            f"FedGO / FedDF server time per round, by seed: {by_seed} "
            f"(median {statistics.median(ratio.values()):.2f})",
        ]
    rows += separation_rows(results)
    return "\n".join(rows)


def separation_rows(results: Path) -> list[str]:
    """The FedGO runs' discriminator-separation reports (``discriminator_separation.py --save``)."""
    reports = sorted(results.glob("fedgo-seed*/separation.json"))
    if not reports:
        return []
    rows = [
        "",
        "Do the FedGO runs' discriminators tell clients apart? (`discriminator_separation.py`; "
        "weight on the clients that hold the image's class, %)",
        "",
        "| seed | AUC own vs unseen class (min-max) | n_k | FedGO | FedGO single sigmoid "
        "| oracle | mean sigmoid | sigmoid > 0.99 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for path in reports:
        r = json.loads(path.read_text())
        auc, w = r["auc_own_vs_unseen"], r["weight_on_knowing_clients_pct"]
        rows.append(
            f"| {seed_of(path.parent)} | {auc['mean']:.3f} ({auc['min']:.3f}-"
            f"{auc['max']:.3f}) | {w['data_size']} | {w['fedgo_double_sigmoid']} "
            f"| {w['fedgo_single_sigmoid']} | {w['oracle']} | {r['mean_sigmoid']:.3f} "
            f"| {100 * r['share_sigmoid_above_0.99']:.1f}% |"
        )
    return rows


def figure2(runs: dict[str, list[tuple[str, dict, list[dict]]]]) -> list[str]:
    """The shape of FedGO's Fig. 2: accuracy of each weighting's ensemble, round by round.

    Two views: the ensemble test accuracy each distillation run reports on its own round's
    client models (the paper's figure; each run has its own trajectory), and the pseudo-label
    accuracy on the server set of every weighting on the SAME client models (the FedGO runs'
    diagnostics: no trajectory noise between methods).
    """
    ens: dict[str, dict[int, list[float]]] = {}
    for method, method_runs in runs.items():
        for _, _, metrics in method_runs:
            for row in metrics:
                if "ensemble_test_accuracy" in row:
                    per = ens.setdefault(method, {}).setdefault(row["round"], [])
                    per.append(row["ensemble_test_accuracy"])
    out: list[str] = []
    if ens:
        rounds = sorted({r for per in ens.values() for r in per})
        out += [
            "Ensemble test accuracy (%) by round, each run's own client models (Fig. 2):",
            "",
            "| method | " + " | ".join(f"round {r}" for r in rounds) + " |",
            "|---|" + "---|" * len(rounds),
        ]
        for method, per in ens.items():
            cells = [mean_sd(per[r]) if r in per else "-" for r in rounds]
            out.append(f"| {method} | " + " | ".join(cells) + " |")
        out.append("")
    same: dict[str, dict[int, list[float]]] = {}
    for _, _, metrics in runs.get("fedgo", []):
        for row in metrics[1:]:
            for d in DIAGNOSTICS:
                if f"pl_acc_{d}" in row:
                    same.setdefault(d, {}).setdefault(row["round"], []).append(row[f"pl_acc_{d}"])
    if same:
        rounds = sorted({r for per in same.values() for r in per})
        out += [
            "Pseudo-label accuracy (%) on the server set by round, every weighting on the same "
            "client models (the FedGO runs):",
            "",
            "| weighting | " + " | ".join(f"r{r}" for r in rounds) + " |",
            "|---|" + "---|" * len(rounds),
        ]
        for d, per in same.items():
            cells = [f"{100 * statistics.mean(per[r]):.1f}" if r in per else "-" for r in rounds]
            out.append(f"| {d} | " + " | ".join(cells) + " |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="conf/bench/cifar10-cpu.yaml")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--tag", default="cifar10-cpu")
    parser.add_argument("--table-only", action="store_true")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    results = ROOT / "benchmarks" / "results" / args.tag
    if not args.table_only:
        ensure_data()
        order = ["fedgo"] + [m for m in args.methods if m != "fedgo"]
        for seed in args.seeds:
            for method in order:
                if method in args.methods or (method == "fedgo" and "domain" in args.methods):
                    run_one(method, seed, args, results)
    text = table(results)
    results.mkdir(parents=True, exist_ok=True)
    (results / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
