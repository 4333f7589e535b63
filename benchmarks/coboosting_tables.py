"""The Markdown tables of Co-Boosting's benchmark (:mod:`benchmarks.coboosting_table1`).

Dai et al., "Enhancing One-Shot Federated Learning Through Data and Ensemble Co-Boosting",
ICLR 2024 (paper 004): ``table.md`` from the runs kept in ``benchmarks/results/<tag>/``, with
the paper's Table 1 (the server model's test accuracy, per Dirichlet alpha), Table 2 (the
ensemble's under uniform, data-size, learned and FedGO-odds weights) and Table 7 (the ablation
of GHS, DHS and EE), the paper's rows under each alpha, the check that every method's clients
are oneshot's, wall times, and the server models' 95% t intervals and paired differences over
the seeds. The method grid comes from :mod:`benchmarks.coboosting_grid`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from benchmarks.coboosting_grid import (
    ABLATION,
    ABLATION_ALPHAS,
    ALL_METHODS,
    ALPHAS,
    COMPONENTS,
    DEFAULT_TAG,
    EXTRA_METHODS,
    ablation_name,
    base_methods,
    method_grid,
    method_name,
)
from benchmarks.sweep import (
    MISSING,
    Run,
    final_accuracy,
    fmt,
    load_runs,
    mean_ci,
    paired_cell,
    seed_note,
    seeds_of,
)

ANCHOR = (
    "Paper anchor (CIFAR-10, alpha 0.1, 10 clients, 5-layer CNN, full scale): server "
    "accuracy Co-Boosting 57.09, DENSE 47.80, FedDF 49.63, FedAvg 27.54; ensemble accuracy "
    "learned weights 59.86 vs uniform (FedENS) 49.99."
)

PAPER_TABLE1 = {  # paper Table 1, 10 clients: FedAvg, FedDF, DENSE, Co-Boosting
    "cifar10": {
        0.05: (17.49, 37.53, 38.37, 47.20),
        0.1: (27.54, 49.63, 47.80, 57.09),
        0.3: (46.39, 67.18, 66.77, 70.24),
    },
    "mnist": {
        0.05: (46.35, 80.73, 81.06, 93.93),
        0.1: (75.68, 87.91, 87.83, 94.44),
        0.3: (78.97, 97.66, 96.96, 97.25),
    },
}
PAPER_TABLE2 = {  # paper Tables 2 and 9: FedENS (uniform), DW-FedENS (not given), learned
    "cifar10": {0.05: (42.34, None, 48.75), 0.1: (49.99, None, 59.86), 0.3: (69.61, None, 72.67)},
    "mnist": {0.05: (81.52, None, 94.59), 0.1: (88.16, None, 94.47), 0.3: (97.75, None, 97.75)},
}
REFERENCE_NAMES = {"cifar10": "CIFAR-10", "mnist": "MNIST"}
TABLE1_COLUMNS = [  # (header, method, summary key)
    ("FedAvg", "oneshot", "final_accuracy"),
    ("FedDF", "feddf", "final_accuracy"),
    ("DENSE", "dense", "final_accuracy"),
    ("Co-Boosting", "coboosting", "final_accuracy"),
    ("Co-Boosting, sign step", "coboosting_sign", "final_accuracy"),
    ("Co-Boosting, uncapped", "coboosting_uncapped", "final_accuracy"),
    ("CB + FedGO odds x learned", "coboosting_fedgo", "final_accuracy"),
    ("CB + FedGO odds", "coboosting_fedgo_odds", "final_accuracy"),
    ("CB + FedGO exact odds x learned", "coboosting_fedgo_exact", "final_accuracy"),
    ("CB + FedGO exact odds", "coboosting_fedgo_exact_odds", "final_accuracy"),
]
TABLE2_COLUMNS = [
    ("uniform (FedENS)", "oneshot", "ensemble_accuracy_uniform"),
    ("data size (DW-FedENS)", "oneshot", "ensemble_accuracy_data_size"),
    ("learned (Co-Boosting)", "coboosting", "ensemble_accuracy_learned"),
    ("learned, uncapped", "coboosting_uncapped", "ensemble_accuracy_learned"),
    ("FedGO odds", "coboosting_fedgo", "ensemble_accuracy_fedgo"),
    ("odds x learned", "coboosting_fedgo", "ensemble_accuracy_learned"),
    ("exact odds", "coboosting_fedgo_exact", "ensemble_accuracy_fedgo"),
    ("exact odds x learned", "coboosting_fedgo_exact", "ensemble_accuracy_learned"),
]
SAME = 1e-7
"""Two test accuracies of the same models are equal up to float rounding (one test image of
10,000 is 1e-4)."""


def reference_of(dataset: str) -> str | None:
    """Which paper rows a preset's table shows: CIFAR-10 for the JPEG tree, MNIST for digits."""
    return {"imagefolder": "cifar10", "cifar10": "cifar10", "digits": "mnist"}.get(dataset)


def accuracies(runs: Iterable[Run], key: str) -> list[float]:
    """Summary ``key`` of each run that has it, in percent."""
    return [100.0 * float(r.summary[key]) for r in runs if r.summary.get(key) is not None]


def cell(runs: Sequence[Run], key: str, seeds: int) -> str:
    """``m ± sd`` of ``key`` in percent; ``(n=k)`` when only ``k`` of the row's ``seeds``
    have it; ``–`` when none has."""
    vals = accuracies(runs, key)
    text = fmt(vals, 2)
    return text + f" (n={len(vals)})" if vals and len(vals) < seeds else text


def seeds_at(alpha: float, runs: dict[str, list[Run]]) -> int:
    """How many seeds have any run at ``alpha`` (a row's full count)."""
    prefix = method_name(alpha, "")
    return len({r.seed for m, rs in runs.items() if m.startswith(prefix) for r in rs})


def accuracy_table(
    header: str,
    columns: list[tuple[str, str, str]],
    alphas: Sequence[float],
    runs: dict[str, list[Run]],
    paper: dict[float, tuple[float | None, ...]] | None,
    paper_name: str,
) -> list[str]:
    """Rows by alpha, one column per (method, key); a paper row under each alpha it has."""
    rows = [
        header,
        "",
        "| alpha | seeds | " + " | ".join(c[0] for c in columns) + " |",
        "|---" * (len(columns) + 2) + "|",
    ]
    for alpha in alphas:
        n = seeds_at(alpha, runs)
        cells = [cell(runs.get(method_name(alpha, m), []), key, n) for _, m, key in columns]
        rows.append(f"| {alpha:g} | {n} | " + " | ".join(cells) + " |")
        if paper and alpha in paper:
            ref = [MISSING if v is None else f"{v:.2f}" for v in paper[alpha]]
            ref += [MISSING] * (len(columns) - len(ref))
            rows.append(f"| {alpha:g} (paper, {paper_name}) | | " + " | ".join(ref) + " |")
    return rows


def last_metric(run: Run, key: str) -> float | None:
    """``key`` of the last ``metrics.jsonl`` row that has it."""
    for row in reversed(run.metrics):
        if row.get(key) is not None:
            return float(row[key])
    return None


def same_client_checks(alphas: Sequence[float], runs: dict[str, list[Run]]) -> list[str]:
    """Do the runs that train their own clients get the oneshot run's models? FedDF's
    initial parameter average must be one-shot FedAvg and its uniform ensemble FedENS;
    Co-Boosting + FedGO's FedENS must be oneshot's. Per (alpha, seed) with both runs."""
    checks = {  # name: (method, value of that run, oneshot's key)
        "FedDF initial average = one-shot FedAvg": (
            "feddf",
            lambda r: last_metric(r, "init_test_accuracy"),
            "final_accuracy",
        ),
        "FedDF ensemble = FedENS": (
            "feddf",
            lambda r: last_metric(r, "ensemble_test_accuracy"),
            "ensemble_accuracy_uniform",
        ),
        "CB + FedGO FedENS = FedENS": (
            "coboosting_fedgo",
            lambda r: r.summary.get("ensemble_accuracy_uniform"),
            "ensemble_accuracy_uniform",
        ),
    }
    out = []
    for name, (method, value, key) in checks.items():
        equal, differ = 0, []
        for alpha in alphas:
            base = {r.seed: r.summary.get(key) for r in runs.get(method_name(alpha, "oneshot"), [])}
            for r in runs.get(method_name(alpha, method), []):
                mine, theirs = value(r), base.get(r.seed)
                if mine is None or theirs is None:
                    continue
                if abs(mine - float(theirs)) <= SAME:
                    equal += 1
                else:
                    differ.append(f"{alpha:g}/{r.seed}: {100 * mine:.2f} vs {100 * theirs:.2f}")
        text = f"- {name}: {equal} of {equal + len(differ)} (alpha, seed) pairs"
        out.append(text + (f"; differ: {', '.join(differ)}" if differ else ""))
    return out


def ablation_rows(ablation_alphas: Sequence[float], runs: dict[str, list[Run]]) -> list[str]:
    """Table 7's shape: a check mark per component on, server accuracy per alpha."""
    rows = [
        "Ablation (paper Table 7; server test accuracy %; all three on is the Co-Boosting run; "
        "GHS: hardness-weighted generator loss, `strategy.synthesis.hardness` 1 vs 0; DHS: "
        "diversified pool samples, `strategy.boost.diversify`; EE: learned ensemble weights, "
        "`strategy.boost.reweight`). Paper, CIFAR-10 Dir(0.05), full scale: none 39.72, all "
        "three 47.20 (which of its six middle rows is which subset is lost in the text).",
        "",
        "| "
        + " | ".join(COMPONENTS)
        + " | "
        + " | ".join(f"alpha {a:g}" for a in ablation_alphas)
        + " |",
        "|---" * (len(COMPONENTS) + len(ablation_alphas)) + "|",
    ]
    for flags in ABLATION:
        marks = ["✓" if on else "" for on in flags]
        cells = [
            cell(
                runs.get(method_name(a, ablation_name(*flags)), []),
                "final_accuracy",
                seeds_at(a, runs),
            )
            for a in ablation_alphas
        ]
        rows.append("| " + " | ".join(marks + cells) + " |")
    return rows


SIGN_NOTE = (
    " Co-Boosting's diversification (eq. 10): an L2-normalised step in its columns "
    "(`strategy.boost.variant: paper`, the default), the authors' code's signed step in "
    '"sign step" (`variant: code`).'
)
"""Said under the table when it has the sign-step column (issue 36: which step the table uses)."""

UNCAPPED_NOTE = (
    " Co-Boosting's learned weights: no client's share above its mean-share cap (the "
    'default, not in the paper); "uncapped": eq. 12 as published (`strategy.share_cap: false`).'
)
"""Said under the table when it has the uncapped columns."""

PAIRS = (  # (variant, baseline): the paper's claims on Table 1, and what this project adds
    ("coboosting", "dense"),
    ("coboosting", "feddf"),
    ("coboosting", "oneshot"),
    ("dense", "oneshot"),
    ("coboosting_sign", "coboosting"),
    ("coboosting_uncapped", "coboosting"),
    ("coboosting_uncapped", "dense"),
    ("coboosting_fedgo_odds", "coboosting"),
    ("coboosting_fedgo", "coboosting"),
    ("coboosting_fedgo_exact_odds", "coboosting"),
    ("coboosting_fedgo_exact", "coboosting"),
    ("coboosting_fedgo_exact", "coboosting_fedgo"),
)
NAMES = {m: header for header, m, _ in TABLE1_COLUMNS}


def interval_rows(alphas: Sequence[float], runs: dict[str, list[Run]]) -> list[str]:
    """The server models' accuracies with 95% t intervals over seeds and the paired
    differences of :data:`PAIRS` (runs of one seed share their clients' models), under the
    seed set's note (:func:`benchmarks.sweep.seed_note`: only report seeds back a claim)."""
    seeds = seeds_of(runs)
    if not seeds:
        return []
    rows = [
        "Server model, test accuracy % with the half-width of its 95% t interval over seeds, "
        "and paired differences (variant minus baseline, on the seeds both ran: mean [95% CI], "
        f"two-sided paired t-test): {seed_note(seeds)}.",
        "",
        "| alpha | method | mean ± 95% CI | per seed |",
        "|---|---|---|---|",
    ]
    for alpha in alphas:
        for header, method, key in TABLE1_COLUMNS:
            rs = runs.get(method_name(alpha, method), [])
            if not rs:
                continue
            values = [r.summary.get(key) for r in rs]
            each = ", ".join(
                f"{r.seed.removeprefix('seed')}: {100 * v:.2f}"
                for r, v in zip(rs, values, strict=True)
                if v is not None
            )
            kept = [v for v in values if v is not None]
            rows.append(f"| {alpha:g} | {header} | {mean_ci(kept)} | {each} |")
    rows += ["", "| alpha | variant - baseline (points) | difference |", "|---|---|---|"]
    for alpha in alphas:
        for variant, baseline in PAIRS:
            a = runs.get(method_name(alpha, variant), [])
            b = runs.get(method_name(alpha, baseline), [])
            cell = paired_cell(b, a, final_accuracy)
            if cell != "-":
                rows.append(f"| {alpha:g} | {NAMES[variant]} - {NAMES[baseline]} | {cell} |")
    return rows


def time_rows(
    alphas: Sequence[float], ablation_alphas: Sequence[float], runs: dict[str, list[Run]]
) -> list[str]:
    """Mean ± sd wall time per run (``total_time``), by method and alpha."""
    rows = [
        "Wall time per run (s, mean ± sd over seeds; a run that reuses uploads does not train "
        "the clients: their training is in oneshot's time, and the FedGO runs' in "
        "coboosting_fedgo's, with the discriminators):",
        "",
        "| method | " + " | ".join(f"alpha {a:g}" for a in alphas) + " |",
        "|---" * (len(alphas) + 1) + "|",
    ]
    total = 0.0
    for base in base_methods(bool(ablation_alphas), ALL_METHODS):
        if base in EXTRA_METHODS and not any(runs.get(method_name(a, base)) for a in alphas):
            continue
        cells = []
        for alpha in alphas:
            rs = runs.get(method_name(alpha, base), [])
            times = [float(r.summary["total_time"]) for r in rs if "total_time" in r.summary]
            total += sum(times)
            cells.append(fmt(times, 1))
        rows.append(f"| {base} | " + " | ".join(cells) + " |")
    rows += ["", f"All kept runs: {total:.0f} s ({total / 3600:.2f} h) of run time."]
    outside = sorted(
        r.name
        for a in alphas
        for r in runs.get(method_name(a, "oneshot"), [])
        if any(m.get("uploads_reused") for m in r.metrics)
    )
    if outside:  # --teachers: the clients trained in benchmarks.oneshot_teachers
        rows.append(
            f"The clients of {', '.join(outside)} were trained outside this table (their "
            "uploads reused, `strategy.teachers_from`): that training is in none of these times."
        )
    return rows


def table(
    results: Path,
    alphas: Sequence[float] = ALPHAS,
    ablation_alphas: Sequence[float] = ABLATION_ALPHAS,
    *,
    title: str = DEFAULT_TAG,
    reference: str | None = None,
) -> str:
    """``table.md`` from the finished runs kept in ``results`` (missing ones show ``–``)."""
    ablation_alphas = [a for a in ablation_alphas if a in alphas]
    runs = load_runs(results, method_grid(alphas, ablation_alphas, ALL_METHODS))
    name = REFERENCE_NAMES.get(reference or "", "")
    # A method run only on request (``--methods``) has a column where some run of it is kept.
    shown = {m for m in ALL_METHODS if any(runs.get(method_name(a, m)) for a in alphas)}
    table1, table2 = (
        [c for c in columns if c[1] not in EXTRA_METHODS or c[1] in shown]
        for columns in (TABLE1_COLUMNS, TABLE2_COLUMNS)
    )
    rows = [
        f"# Co-Boosting at CPU scale: {title} (benchmarks/coboosting_table1.py)",
        "",
        ANCHOR,
        "",
        "Test accuracy %, mean ± sd over seeds (sample sd); (n=k): only k of the row's seeds "
        "have that run; –: none has. Every server method of a seed starts from the same "
        "client models (those of oneshot; the FedGO runs' own, checked below)."
        + (SIGN_NOTE if "coboosting_sign" in shown else "")
        + (UNCAPPED_NOTE if "coboosting_uncapped" in shown else ""),
        "",
        *accuracy_table(
            "Server model (paper Table 1; FedAvg: the one-shot parameter average):",
            table1,
            alphas,
            runs,
            PAPER_TABLE1.get(reference or ""),
            name,
        ),
        "",
        *accuracy_table(
            "Ensemble of the client models (paper Table 2; the paper reports FedENS and "
            "learned only):",
            table2,
            alphas,
            runs,
            PAPER_TABLE2.get(reference or ""),
            name,
        ),
        "",
        "Same client models in the runs that train their own (FedDF, CB + FedGO) as in "
        "oneshot: equal test accuracies, per (alpha, seed) with both runs:",
        "",
        *same_client_checks(alphas, runs),
    ]
    if ablation_alphas:
        rows += ["", *ablation_rows(ablation_alphas, runs)]
    rows += ["", *time_rows(alphas, ablation_alphas, runs)]
    intervals = interval_rows(alphas, runs)
    if intervals:
        rows += ["", *intervals]
    return "\n".join(rows)
