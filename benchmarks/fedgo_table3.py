"""The shape of FedGO's Table 3 / Fig. 2 at CPU scale on CIFAR-10 JPEGs.

For every seed, the methods below run through ``./run.sh`` on ONE partition and ONE client
sampling sequence (both depend only on the seed): FedAvg, FedDF (uniform), n_k-only,
variance (Fed-ET), entropy (FedHKT/FedDS), domain-aware (DaFKD weighting) and FedGO. FedGO runs
first and trains the generator and the discriminators; the domain-aware run reuses them
(``strategy.generator.path`` / ``strategy.discriminator.path``), so both see the same ones.

The benchmark is the spec :data:`SPEC` (:mod:`benchmarks.spec`; runs through ``./run.sh``).
Runs are resumable: a run whose ``summary.json`` is kept is skipped, and an interrupted run
continues from its last per-round checkpoint (``resume=true``). Each finished run's summary,
per-round metrics, config and pre-FL record are kept as ``<method>-seed<N>/...`` in
``benchmarks/results/<tag>/runs.tar.xz`` (committed); the table is rebuilt from there, so a long
benchmark can be spread over several sessions. With ``--jobs N``, a run that reuses another's
generator and discriminators starts once that run of its seed is over.

The CIFAR-10 JPEG tree (``train/``, ``test/``) is ``--data`` (default: ``$FEDGO_CIFAR10``, else
``.cache/cifar10-jpg`` in the repository); if it is missing, ``--archive`` (default:
``$FEDGO_CIFAR10_ARCHIVE``), a ``.tar.gz`` of that tree, is unpacked there first.

    .venv/bin/python -m benchmarks run fedgo_table3 --seeds 0 1 2 [--tag cifar10-cpu] \
        [--methods ...] [k=v ...]
    .venv/bin/python -m benchmarks table fedgo_table3 [--tag cifar10-cpu]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from benchmarks.pooling import split_unlike
from benchmarks.spec import Bench, Spec
from benchmarks.sweep import (
    Kept,
    Run,
    column,
    load_runs,
    mean_sd,
    paired_cell,
    ratio_cell,
    run_name,
    seed_note,
    seed_of,
    seeds_of,
)

SERVER_REFERENCED = [
    "strategy.name=fedgo",
    "strategy.weighting=fedgo",
    "strategy.discriminator.reference=server",
    "strategy.discriminator.epochs=30",
    "strategy.discriminator.spectral_norm=true",
]
CLIPPED = "strategy.weighting_params={fedgo: {disc_mode: sigmoid, clip: 1}}"
G3 = [
    "strategy.name=fedgo",
    "data.server_fraction=0",
    "strategy.generator.steps=0",
    "strategy.generator.federated_rounds=5",
    "strategy.generator.local_epochs=3",
    "strategy.distill_data=generated",
    "strategy.generated_size=5000",
]
METHODS: dict[str, list[str]] = {
    "fedavg": ["strategy.name=fedavg"],
    "feddf": ["strategy.name=feddf", "strategy.weighting=uniform"],
    "data_size": ["strategy.name=feddf", "strategy.weighting=data_size"],
    "variance": ["strategy.name=feddf", "strategy.weighting=variance"],
    "entropy": ["strategy.name=feddf", "strategy.weighting=entropy"],
    "fedgo": ["strategy.name=fedgo", "strategy.weighting=fedgo"],
    "domain": ["strategy.name=fedgo", "strategy.weighting=domain"],
    # Beyond the paper (issue 15, part 2; benchmarks/discriminator_variants.py): discriminators
    # trained against the server's own images, 30 epochs with spectral norm, exact odds.
    "fedgo_server": [*SERVER_REFERENCED, "strategy.weighting_params={fedgo: {disc_mode: sigmoid}}"],
    # Data-free (G3 + D2): every image is a client's; FedGAN at the clients (T' = 5, 3 local
    # epochs), distillation on 5,000 generated images; FedDF's uniform weights on the same ones.
    "fedgo_g3": [*G3, "strategy.weighting=fedgo"],
    "uniform_g3": [*G3, "strategy.weighting=uniform"],
    # Byzantine discriminators (App. F.8): 25% and 50% of the 20 clients, on the discriminators
    # of the run named in REUSE; the server-referenced ones with the log-odds clip defence.
    "fedgo_byz25": ["strategy.name=fedgo", "strategy.weighting=fedgo", "strategy.byzantine=5"],
    "fedgo_byz50": ["strategy.name=fedgo", "strategy.weighting=fedgo", "strategy.byzantine=10"],
    # The defence the variants' Byzantine analysis found best for the exact odds: clip 1.
    "fedgo_server_byz25": [*SERVER_REFERENCED, CLIPPED, "strategy.byzantine=5"],
    "fedgo_server_byz50": [*SERVER_REFERENCED, CLIPPED, "strategy.byzantine=10"],
    # The rest of FedGO's Table 3 (issue 16), FedGO App. E.2's values (the strategies'
    # defaults) on the same partitions and client sampling.
    "fedgkd_plus": ["strategy.name=fedgkd_plus", "strategy.weighting=uniform"],
    # DaFKD's own training with the authors' code's GAN schedule (discriminator terms in rounds
    # 1-3, generator in rounds 1-5, both in the first 5 local epochs): every round and epoch
    # would cost about 5x FedAvg's client time here. Its own weights, D_k / sum_i D_i (the
    # config's base strategy is FedGO's, whose weighting it would otherwise inherit).
    "dafkd": [
        "strategy.name=dafkd",
        "strategy.weighting=domain",
        "strategy.generator.steps=0",
        "strategy.generator.lr=0.0001",
        "strategy.distill_size=1280",
        "strategy.disc_rounds=3",
        "strategy.generator_rounds=5",
        "strategy.gan_epochs=5",
        "strategy.gan_schedule=rounds",
    ],
    "feddisco": ["strategy.name=feddisco"],
    "feduv": ["strategy.name=feduv"],
    "fedtgp": ["strategy.name=fedtgp"],
    # One model on the 5k client images; 8 epochs a round is what the 8 sampled clients'
    # 20 local epochs over about 250 images each cost in a round.
    "central": ["strategy.name=central", "strategy.epochs_per_round=8"],
    # FedDF Alg. 3: clients k = 0, 1, 2 (mod 3) train ResNet-8, the small BN CNN and the
    # VGG-style conv-pool CNN; the server model is the ResNet-8 prototype.
    "feddf_mixed": [
        "strategy.name=feddf",
        "strategy.weighting=uniform",
        "model.client_models=[resnet8, cnn_bn, cnn5]",
    ],
}
REUSE: dict[str, str] = {
    "domain": "fedgo",
    "fedgo_byz25": "fedgo",
    "fedgo_byz50": "fedgo",
    "uniform_g3": "fedgo_g3",
    "fedgo_server_byz25": "fedgo_server",
    "fedgo_server_byz50": "fedgo_server",
}
"""Methods that load the generator and discriminators of another method's run (same seed)."""
DIAGNOSTICS = [
    "uniform",
    "data_size",
    "variance",
    "entropy",
    "domain",
    "fedgo",
    "fedgo_sigmoid",
    "fedgo_double_sigmoid",
    "oracle",
]
DIAGNOSED = ("feddf", "fedgo", "fedgo_server")
"""Methods whose runs report the paired pseudo-label diagnostics that the table shows."""
BYZANTINE: dict[str, tuple[str, str, str]] = {
    "FedGO at CPU scale (double sigmoid, no defence)": ("fedgo", "fedgo_byz25", "fedgo_byz50"),
    "server-referenced, exact odds (liars' rows: log-odds clipped at 1)": (
        "fedgo_server",
        "fedgo_server_byz25",
        "fedgo_server_byz50",
    ),
}
"""App. F.8's rows: the clean run, then 5 and 10 of the 20 clients Byzantine."""


def reuse_source(method: str, seed: int, scratch: Path) -> Path:
    """The run folder (under ``scratch``) whose generator and discriminators ``method`` loads
    for ``seed``.

    That is ``REUSE[method]``'s run; when its outputs are gone (only its summary was kept), a
    sibling that trained the same ones is used instead: a method with the same ``REUSE``
    source whose pre-FL stage finished (``prefl.json`` is written after the discriminators).
    The Byzantine rows corrupt the discriminators' logits on the server, after loading, so
    ``fedgo_byz50`` can load what ``fedgo_byz25`` trained for the same seed.
    """
    base = REUSE[method]
    source = scratch / run_name(base, seed)
    if (source / "discriminators.pt").exists():
        return source
    for sibling in (m for m, b in REUSE.items() if b == base and m != method):
        run = scratch / run_name(sibling, seed)
        if (run / "prefl.json").exists() and (run / "discriminators.pt").exists():
            return run
    return source


def reuse(bench: Bench, method: str, seed: int) -> list[str]:
    """The overrides that load the generator and discriminators of ``method``'s source run
    (none for a method that trains its own, or when the source's files are gone)."""
    if method not in REUSE:
        return []
    source = reuse_source(method, seed, bench.scratch)
    if not (source / "discriminators.pt").exists():
        # only the source run's summary was kept: train them again (same seed and data)
        print(f"note: {source} has no discriminators; {method} trains its own", file=sys.stderr)
        return []
    return [
        f"strategy.generator.path={source / 'generator.pt'}",
        f"strategy.discriminator.path={source / 'discriminators.pt'}",
        "strategy.generator.federated_rounds=0",  # loaded, not trained again
    ]


def round_mean(run: Run, key: str) -> float | None:
    """Mean of ``key`` over the run's rounds 1..R that have it (``None`` if none has)."""
    vals = [r[key] for r in run.metrics[1:] if key in r]
    return statistics.mean(vals) if vals else None


def last_round(run: Run, key: str) -> float | None:
    """``key`` of the run's last metrics row (``None`` if that row has none)."""
    return run.metrics[-1].get(key) if run.metrics else None


def table(results: Path) -> str:
    """``table.md`` from the finished runs kept in ``results``; a method's runs whose configs
    differ beyond the seed are rows of their own (:func:`benchmarks.pooling.split_unlike`)."""
    runs, unlike = split_unlike(load_runs(results, METHODS), results)
    rows = []
    header = (
        "| method | seeds | server acc final | server acc best | ensemble acc (last) "
        "| avg-param acc (last) | server s/round (median of seeds) |"
    )
    rows += [header, "|---|---|---|---|---|---|---|"]
    diag: dict[str, dict[str, list[float]]] = {}  # method -> weighting -> per-seed means
    server_time: dict[str, dict[str, float]] = {}  # method -> seed folder -> s/round
    for method, method_runs in runs.items():
        times = server_time.setdefault(method, {})
        for run in method_runs:
            metrics = run.metrics
            # Server work per round: aggregation incl. teacher logits, weights and distillation
            # (aggregate_time), without the diagnostic ensemble evaluation on the test split.
            per_round = [
                r.get("aggregate_time", 0) - r.get("ensemble_eval_time", 0) for r in metrics[1:]
            ]
            times[run.seed] = statistics.mean(per_round) if per_round else 0.0
            if run.method in DIAGNOSED:
                for d in DIAGNOSTICS:
                    mean = round_mean(run, f"pl_acc_{d}")
                    if mean is not None:
                        diag.setdefault(method, {}).setdefault(d, []).append(mean)
        rows.append(
            f"| {method} | {len(method_runs)} "
            f"| {column(method_runs, lambda r: r.summary['final_accuracy'])} "
            f"| {column(method_runs, lambda r: r.summary['best_accuracy'])} "
            f"| {column(method_runs, lambda r: last_round(r, 'ensemble_test_accuracy'))} "
            f"| {column(method_runs, lambda r: last_round(r, 'init_test_accuracy'))} "
            f"| {statistics.median(times.values()):.2f} |"
        )
    rows += unlike
    rows += paired_rows(runs)
    rows += diagnostics_rows(diag)
    rows += ["", *figure2(runs)]
    fedgo, feddf = server_time.get("fedgo", {}), server_time.get("feddf", {})
    both = [seed for seed in fedgo if feddf.get(seed)]
    if both:  # per seed: a run that shared the cores shows up as an outlier
        ratio = {seed: fedgo[seed] / feddf[seed] for seed in both}
        by_seed = ", ".join(f"{seed} {r:.2f}" for seed, r in ratio.items())
        rows += [
            "",
            f"FedGO / FedDF server time per round, by seed: {by_seed} "
            f"(geometric mean {ratio_cell(ratio.values())}; "
            f"median {statistics.median(ratio.values()):.2f})",
        ]
    rows += byzantine_rows(runs)
    rows += separation_rows(results)
    return "\n".join(rows)


def paired_rows(runs: dict[str, list[Run]], baseline: str = "feddf") -> list[str]:
    """Final server accuracy of every method minus ``baseline``'s on the same seed: the mean
    difference with its 95% t interval and the paired t-test (:func:`paired_cell`), under the
    seed set's note (tuning seeds: not for claims)."""
    base = runs.get(baseline)
    others = [m for m in runs if m != baseline]
    if not base or not others:
        return []
    rows = [
        "",
        f"Final server accuracy minus {baseline}'s, same seed (points; mean [95% t interval], "
        f"two-sided paired t-test; an interval that holds 0: no detectable difference): "
        f"{seed_note(seeds_of(runs))}.",
        "",
        f"| method | minus {baseline} |",
        "|---|---|",
    ]
    rows += [
        f"| {m} | {paired_cell(base, runs[m], lambda r: r.summary.get('final_accuracy'))} |"
        for m in others
    ]
    return rows


def byzantine_rows(runs: dict[str, list[Run]]) -> list[str]:
    """FedGO App. F.8 at this scale: final accuracy and mean pseudo-label accuracy (over the
    rounds, on each run's own client models) of the run's own weights, uniform, n_k and the
    undefended exact odds, with 0, 5 and 10 Byzantine discriminators of 20."""
    if not any(runs.get(m) for family in BYZANTINE.values() for m in family[1:]):
        return []
    rows = [
        "",
        "Byzantine discriminators (FedGO App. F.8: a liar's discriminator outputs its maximum "
        "everywhere). Pseudo-label accuracy (%): mean over the rounds, every weighting on the "
        "same client models of each run:",
        "",
        "| discriminators | liars of 20 | seeds | server acc final | PL: own weights | PL: uniform "
        "| PL: n_k | PL: exact odds, no clip |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def pl(method_runs: list[Run], key: str) -> str:
        return column(method_runs, lambda r: round_mean(r, key))

    for family, methods in BYZANTINE.items():
        for liars, method in zip(("0", "5", "10"), methods, strict=True):
            method_runs = runs.get(method, [])
            if not method_runs:
                continue
            rows.append(
                f"| {family} | {liars} | {len(method_runs)} "
                f"| {column(method_runs, lambda r: r.summary['final_accuracy'])} "
                f"| {pl(method_runs, 'pl_acc_fedgo')} | {pl(method_runs, 'pl_acc_uniform')} "
                f"| {pl(method_runs, 'pl_acc_data_size')} "
                f"| {pl(method_runs, 'pl_acc_fedgo_sigmoid')} |"
            )
    return rows


def diagnostics_rows(diag: dict[str, dict[str, list[float]]]) -> list[str]:
    """Mean pseudo-label accuracy over the rounds, every weighting on each run's own client
    models, by method (mean ± sd over seeds), and the share of the uniform -> oracle gap that
    the run's own FedGO weights close."""
    if not diag:
        return []
    methods = list(diag)
    rows = [
        "",
        "Mean pseudo-label accuracy (%) on the server set over the rounds, every weighting on "
        "the same client models of each run (the runs of the column's method):",
        "",
        "| weighting | " + " | ".join(methods) + " |",
        "|---|" + "---|" * len(methods),
    ]
    for d in DIAGNOSTICS:
        cells = [mean_sd(diag[m].get(d, [])) if diag[m].get(d) else "-" for m in methods]
        rows.append(f"| {d} | " + " | ".join(cells) + " |")
    gaps = []
    for m in methods:
        per = diag[m]
        if all(per.get(k) for k in ("uniform", "fedgo", "oracle")):
            closed = [
                100 * (f - u) / (o - u)
                for u, f, o in zip(per["uniform"], per["fedgo"], per["oracle"], strict=True)
            ]
            gaps.append(
                f"{m} {statistics.mean(closed):.1f}% ({', '.join(f'{c:.1f}' for c in closed)})"
            )
    if gaps:
        rows += [
            "",
            "Share of the uniform -> oracle gap closed by the run's own FedGO weights "
            "(mean, per seed): " + "; ".join(gaps),
        ]
    return rows


def separation_rows(results: Path) -> list[str]:
    """The FedGO runs' discriminator-separation reports (``discriminator_separation.py --save``)."""
    kept = Kept(results)
    reports = kept.names("separation.json", pattern="fedgo-seed*")
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
    for name in reports:
        r = kept.json(name, "separation.json")
        auc, w = r["auc_own_vs_unseen"], r["weight_on_knowing_clients_pct"]
        rows.append(
            f"| {seed_of(name)} | {auc['mean']:.3f} ({auc['min']:.3f}-"
            f"{auc['max']:.3f}) | {w['data_size']} | {w['fedgo_double_sigmoid']} "
            f"| {w['fedgo_single_sigmoid']} | {w['oracle']} | {r['mean_sigmoid']:.3f} "
            f"| {100 * r['share_sigmoid_above_0.99']:.1f}% |"
        )
    return rows


def figure2(runs: dict[str, list[Run]]) -> list[str]:
    """The shape of FedGO's Fig. 2: accuracy of each weighting's ensemble, round by round.

    Two views: the ensemble test accuracy each distillation run reports on its own round's
    client models (the paper's figure; each run has its own trajectory), and the pseudo-label
    accuracy on the server set of every weighting on the SAME client models (the FedGO runs'
    diagnostics: no trajectory noise between methods).
    """
    ens: dict[str, dict[int, list[float]]] = {}
    for method, method_runs in runs.items():
        for run in method_runs:
            for row in run.metrics:
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
    for run in runs.get("fedgo", []):
        for row in run.metrics[1:]:
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


def run_order(args: argparse.Namespace) -> list[str]:
    """The methods asked for and the sources they reuse, the sources first."""
    wanted = set(args.methods) | {REUSE[m] for m in args.methods if m in REUSE}
    sources = [m for m in METHODS if m in set(REUSE.values())]
    order = [*sources, *(m for m in METHODS if m not in sources)]
    return [m for m in order if m in wanted]


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))


SPEC = Spec(
    name="fedgo_table3",
    summary="FedGO's Table 3 / Fig. 2 at CPU scale on CIFAR-10 JPEGs, every method per seed",
    config="conf/bench/cifar10-cpu.yaml",
    tag="cifar10-cpu",
    methods=run_order,
    overrides=lambda method: METHODS[method],
    table=lambda bench: table(bench.results),
    runner="run.sh",
    options=options,
    after=REUSE.get,
    reuse=reuse,
)


if __name__ == "__main__":  # the command before the specs: say what replaced it
    raise SystemExit(f"{__spec__.name} is a spec: python -m benchmarks run|table fedgo_table3")
