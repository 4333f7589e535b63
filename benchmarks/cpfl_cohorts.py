"""CPFL's CIFAR-10 grid at CPU scale: accuracy, simulated time, CPU-hours and bytes against n.

Dhasade et al., "Harnessing Increased Client Participation with Cohort-Parallel Federated
Learning", EuroMLSys 2025 (paper 003): Fig. 3/4 (time to convergence and CPU-hours as the
number of cohorts n grows), Table 1 (the mean cohort model against the distilled student) and
Fig. 5 (when the cohorts finish). For every seed, every (alpha, n) of the grid runs once,
``alpha`` in {0.1, 1} (the paper's high and low label skew) and ``n`` in {1, 2, 4, 8, 16, 200}
(200: one client per cohort, one-shot FedKD); methods are named ``a<alpha>-n<n>``. All runs of
a seed share its partition and device profiles (both depend only on the seed and alpha).

The benchmark is the spec :data:`SPEC` (:mod:`benchmarks.spec`). Each run is
:func:`fedgo_app.inprocess.run_inprocess` in a subprocess of its own (the spec's default
runner): CPFL's times are simulated, so Flower's engine would change nothing but add ~20 s of
start-up per run; a subprocess returns the run's memory, and a run that crashes is reported
without ending the sweep. Runs write to ``outputs/bench/<tag>/<method>-seed<N>/``; each finished
run's summary, ``metrics.jsonl`` and ``config.yaml`` are kept as ``<method>-seed<N>/...`` in
``benchmarks/results/<tag>/runs.tar.xz``, and runs already kept are skipped, so the sweep
resumes where it stopped (a seed's methods all run before the next seed's, so a partial sweep
has whole seeds). ``--jobs N`` runs N at once: the simulated times and CPU-hours do not depend
on it, the distillation wall times do (runs share the machine).

The CIFAR-10 JPEG tree is ``--data`` (default ``$FEDGO_CIFAR10``, else ``.cache/cifar10-jpg``),
unpacked from ``--archive`` first if missing; a config whose dataset is not ``imagefolder``
(the digits smoke run) needs neither.

    .venv/bin/python -m benchmarks run cpfl_cohorts [--seeds 0 1 2] [--alphas 0.1 1] \
        [--cohorts 1 2 4 8 16 200] [--tag cpfl-cifar10-cpu] [--jobs N] [k=v ...]
    .venv/bin/python -m benchmarks table cpfl_cohorts [--tag cpfl-cifar10-cpu] [--alphas ...]
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path

from benchmarks.spec import Spec
from benchmarks.sweep import (
    MISSING,
    Run,
    column,
    final_accuracy,
    fmt,
    load_runs,
    mean_ci,
    paired_cell,
    seed_note,
    seeds_of,
)
from fedgo_app.sweep.stats import ratio_summary

DEFAULT_CONFIG = "conf/bench/cpfl-cifar10-cpu.yaml"
DEFAULT_TAG = "cpfl-cifar10-cpu"
ALPHAS = (0.1, 1.0)
COHORTS = (1, 2, 4, 8, 16, 200)
ANCHOR = (
    "Paper anchor (CPFL, CIFAR-10, alpha 0.1, 5 seeds, full scale): student accuracy "
    "70.4% (n = 1) -> 69.8% (n = 4), 1.9x less time to convergence, 1.3x fewer CPU-hours."
)


# -- the grid --------------------------------------------------------------------------------


def method_name(alpha: float, n: int) -> str:
    """``a0.1-n4`` for alpha 0.1 and 4 cohorts."""
    return f"a{alpha:g}-n{n}"


def parse_method(method: str) -> tuple[float, int]:
    """``(alpha, n)`` of a method name (``ValueError`` for another name)."""
    a, sep, n = method.partition("-n")
    if not (a.startswith("a") and sep):
        raise ValueError(f"method {method!r} is not named a<alpha>-n<cohorts>")
    return float(a[1:]), int(n)


def method_grid(alphas: Iterable[float], cohorts: Iterable[int]) -> list[str]:
    """Every (alpha, n), alpha-major: the order a seed's runs go in."""
    cohorts = list(cohorts)
    return [method_name(a, n) for a in alphas for n in cohorts]


def method_overrides(method: str) -> list[str]:
    """The config overrides that make ``method`` of the base config."""
    alpha, n = parse_method(method)
    return [f"data.alpha={alpha:g}", f"strategy.cohorts={n}"]


# -- the tables ------------------------------------------------------------------------------


def accuracy_cell(runs: Sequence[Run], key: str) -> str:
    """:func:`benchmarks.sweep.column` of a summary accuracy in percent (``–`` if none has one)."""
    cell = column(runs, lambda r: r.summary.get(key))
    return MISSING if cell == "-" else cell


def values(runs: Iterable[Run], key: str) -> list[float]:
    return [float(r.summary[key]) for r in runs if r.summary.get(key) is not None]


def per_seed_ratios(base: Sequence[Run], runs: Sequence[Run], key: str) -> list[float]:
    """``base / run`` of summary ``key`` for each seed that has both (a speed-up or a saving
    factor against n = 1; the tables report their geometric mean, :func:`ratio_cell`)."""
    ref = {r.seed: r.summary.get(key) for r in base}
    out = []
    for r in runs:
        num, den = ref.get(r.seed), r.summary.get(key)
        if num is not None and den:
            out.append(float(num) / float(den))
    return out


def ratio_cell(ratios: Sequence[float]) -> str:
    """``"1.18x [0.21, 6.70]"``: the geometric mean of per-seed ratios and the 95% t interval
    of their mean log-ratio, mapped back (:func:`fedgo_app.sweep.stats.ratio_summary`; a
    ratio and its inverse summarise to inverses); ``(n=1)`` for one seed, ``–`` for none."""
    r = ratio_summary(ratios)
    if r.gmean is None:
        return MISSING
    if r.ci_low is None:
        return f"{r.gmean:.2f}x (n={r.n})"
    return f"{r.gmean:.2f}x [{r.ci_low:.2f}, {r.ci_high:.2f}]"


def student_gaps(runs: Sequence[Run]) -> list[float]:
    """Per run, the student's accuracy minus its ensemble's (the distillation target's):
    what stage 2 loses of what the teachers together know."""
    return [
        r.summary["final_accuracy"] - r.summary["ensemble_accuracy"]
        for r in runs
        if r.summary.get("final_accuracy") is not None
        and r.summary.get("ensemble_accuracy") is not None
    ]


def bytes_cell(runs: Sequence[Run]) -> str:
    """Mean ± sd of ``bytes_total`` in GB (10^9) if the mean reaches 1 GB, else in MB."""
    vals = values(runs, "bytes_total")
    if not vals:
        return MISSING
    if statistics.mean(vals) >= 1e9:
        return fmt(vals, 2, 1e-9) + " GB"
    return fmt(vals, 1, 1e-6) + " MB"


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q`` quantile with linear interpolation between order statistics (numpy's
    default; ``statistics.quantiles(method='inclusive')``)."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def finish_stats(runs: Sequence[Run]) -> dict | None:
    """Cohort finish hours pooled over the runs: quantiles, the share of cohorts finished by
    half their run's time to convergence, and how many stopped at the round cap."""
    pooled, early, capped = [], 0, 0
    for r in runs:
        total = r.summary.get("sim_time_to_convergence_h")
        statuses = r.summary.get("cohort_status") or []
        for i, h in enumerate(r.summary.get("cohort_finish_h") or []):
            if h is None:  # an empty cohort: it never ran
                continue
            pooled.append(float(h))
            early += total is not None and h <= total / 2 + 1e-12
            capped += i < len(statuses) and statuses[i] == "max_rounds"
    if not pooled:
        return None
    pooled.sort()
    return {
        "cohorts": len(pooled),
        "quantiles": [quantile(pooled, q) for q in (0.0, 0.25, 0.5, 0.75, 1.0)],
        "share_by_half": early / len(pooled),
        "capped": capped,
    }


def main_rows(alpha: float, cohorts: Sequence[int], runs: dict[str, list[Run]]) -> list[str]:
    """Table (1) of one alpha: accuracy, time, CPU-hours, bytes and distillation time by n."""
    base = runs.get(method_name(alpha, 1), [])
    rows = [
        f"alpha = {alpha:g}",
        "",
        "| n | seeds | student acc (%) | sim. time to convergence (h) | speed-up vs n=1 "
        "| CPU-hours | CPU-hours ratio vs n=1 | bytes | distillation wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n in cohorts:
        rs = runs.get(method_name(alpha, n), [])
        rows.append(
            f"| {n} | {len(rs)} | {accuracy_cell(rs, 'final_accuracy')} "
            f"| {fmt(values(rs, 'sim_time_to_convergence_h'))} "
            f"| {ratio_cell(per_seed_ratios(base, rs, 'sim_time_to_convergence_h'))} "
            f"| {fmt(values(rs, 'cpu_hours'), 1)} "
            f"| {ratio_cell(per_seed_ratios(base, rs, 'cpu_hours'))} "
            f"| {bytes_cell(rs)} | {fmt(values(rs, 'distill_time_s'), 1)} |"
        )
    return rows


def teacher_rows(
    alphas: Sequence[float], cohorts: Sequence[int], runs: dict[str, list[Run]]
) -> list[str]:
    """Table (2), paper Table 1: the mean cohort model (teacher) against the student."""
    rows = [
        "Teacher vs student (paper Table 1; n > 1, test accuracy %; mean teacher: the mean "
        "of a run's cohort models; delta: student minus mean teacher, per seed, then mean ± sd; "
        "ensemble: the cohorts' label-weighted logits, the distillation target; student - "
        "ensemble: per seed, mean with its 95% t interval; steps: the distillation's Adam steps, "
        "public: its public images):",
        "",
        "| alpha | n | seeds | mean teacher | student | delta (points) | ensemble "
        "| student - ensemble (points) | steps | public |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for alpha in alphas:
        for n in cohorts:
            if n == 1:  # no distillation: the student is the one cohort's model
                continue
            rs = runs.get(method_name(alpha, n), [])
            deltas = [
                r.summary["final_accuracy"] - r.summary["teacher_accuracy_mean"]
                for r in rs
                if r.summary.get("final_accuracy") is not None
                and r.summary.get("teacher_accuracy_mean") is not None
            ]
            rows.append(
                f"| {alpha:g} | {n} | {len(rs)} | {accuracy_cell(rs, 'teacher_accuracy_mean')} "
                f"| {accuracy_cell(rs, 'final_accuracy')} | {fmt(deltas, 1, 100.0)} "
                f"| {accuracy_cell(rs, 'ensemble_accuracy')} | {mean_ci(student_gaps(rs))} "
                f"| {distinct(rs, 'distill_steps')} | {distinct(rs, 'public_size')} |"
            )
    return rows


def distinct(runs: Sequence[Run], key: str) -> str:
    """The values of summary ``key`` over the runs, each once (``–`` for none)."""
    found = sorted({r.summary[key] for r in runs if r.summary.get(key) is not None})
    return ", ".join(map(str, found)) or MISSING


def finish_rows(
    alphas: Sequence[float], cohorts: Sequence[int], runs: dict[str, list[Run]]
) -> list[str]:
    """Table (3), paper Fig. 5: when the cohorts finish, pooled over seeds."""
    rows = [
        "Cohort finish times (paper Fig. 5; simulated hours, every cohort of every seed pooled; "
        "by T/2: share of cohorts finished by half their run's time to convergence T; capped: "
        "cohorts stopped by the round cap, not by their stopping rule):",
        "",
        "| alpha | n | seeds | cohorts | min | 25% | 50% | 75% | max | by T/2 | capped |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for alpha in alphas:
        for n in cohorts:
            rs = runs.get(method_name(alpha, n), [])
            stats = finish_stats(rs)
            if stats is None:
                cells = [MISSING] * 8
            else:
                cells = [
                    str(stats["cohorts"]),
                    *(f"{q:.2f}" for q in stats["quantiles"]),
                    f"{100 * stats['share_by_half']:.0f}%",
                    str(stats["capped"]),
                ]
            rows.append(f"| {alpha:g} | {n} | {len(rs)} | " + " | ".join(cells) + " |")
    return rows


def capped(run: Run) -> bool:
    """Whether any cohort of the run stopped at the round cap instead of by its rule: its time
    to convergence is then a lower bound, and a ratio with it on either side only a bound
    (the n = 1 row's count says whether the baseline of every ratio is)."""
    return "max_rounds" in (run.summary.get("cohort_status") or [])


def interval_rows(
    alphas: Sequence[float], cohorts: Sequence[int], runs: dict[str, list[Run]]
) -> list[str]:
    """Table (4): the student's accuracy with its 95% t interval over seeds, its paired
    difference from n = 1, and the speed-up and CPU-hours ratio against n = 1 with their
    intervals (per-seed ratios, their geometric mean: :func:`ratio_cell`), with how many runs
    had a cohort stopped by the cap,
    under the seed set's note (:func:`benchmarks.sweep.seed_note`)."""
    seeds = seeds_of(runs)
    if not seeds:
        return []
    rows = [
        "With 95% t intervals over seeds (mean ± half-width; against n = 1 seed by seed: the "
        "accuracy difference with a paired t-test, the ratios' geometric mean with the "
        "interval of their mean log-ratio; capped: runs with a "
        f"cohort stopped by the round cap, whose ratios are bounds): {seed_note(seeds)}.",
        "",
        "| alpha | n | student acc (%) | acc - n=1 (points) | speed-up vs n=1 "
        "| CPU-hours ratio vs n=1 | capped |",
        "|---|---|---|---|---|---|---|",
    ]
    for alpha in alphas:
        base = runs.get(method_name(alpha, 1), [])
        for n in cohorts:
            rs = runs.get(method_name(alpha, n), [])
            if not rs:
                continue
            acc = [a for a in map(final_accuracy, rs) if a is not None]
            diff = "" if n == 1 else paired_cell(base, rs, final_accuracy)
            speed = per_seed_ratios(base, rs, "sim_time_to_convergence_h")
            cpu = per_seed_ratios(base, rs, "cpu_hours")
            ratios = ("", "") if n == 1 else (ratio_cell(speed), ratio_cell(cpu))
            rows.append(
                f"| {alpha:g} | {n} | {mean_ci(acc)} | {diff} | {ratios[0]} | {ratios[1]} "
                f"| {sum(map(capped, rs))} of {len(rs)} |"
            )
    return rows


def table(results: Path, alphas: Sequence[float] = ALPHAS, cohorts: Sequence[int] = COHORTS) -> str:
    """``table.md`` from the finished runs kept in ``results`` (missing ones show ``–``)."""
    runs = load_runs(results, method_grid(alphas, cohorts))
    rows = [
        "# CPFL cohorts at CPU scale (benchmarks/cpfl_cohorts.py)",
        "",
        ANCHOR,
        "",
        "Mean ± sd over seeds (sample sd). Speed-up and CPU-hours ratio: n = 1's value over "
        "n's, computed per seed (seeds with both runs), then their geometric mean with the 95% "
        "t interval of the mean log-ratio (an interval holding 1 shows no detectable "
        "difference). Times and CPU-hours are "
        "simulated (synthetic devices); distillation is excluded from the time and reported as "
        "measured wall time.",
    ]
    for alpha in alphas:
        rows += ["", *main_rows(alpha, cohorts, runs)]
    rows += ["", *teacher_rows(alphas, cohorts, runs)]
    rows += ["", *finish_rows(alphas, cohorts, runs)]
    intervals = interval_rows(alphas, cohorts, runs)
    if intervals:
        rows += ["", *intervals]
    return "\n".join(rows)


# -- the spec --------------------------------------------------------------------------------


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--alphas", nargs="+", type=float, default=list(ALPHAS))
    parser.add_argument("--cohorts", nargs="+", type=int, default=list(COHORTS))


SPEC = Spec(
    name="cpfl_cohorts",
    summary="CPFL's grid (alpha x cohorts n): accuracy, simulated time, CPU-hours, bytes against n",
    config=DEFAULT_CONFIG,
    tag=DEFAULT_TAG,
    methods=lambda args: method_grid(args.alphas, args.cohorts),
    overrides=method_overrides,
    table=lambda bench: table(bench.results, bench.args.alphas, bench.args.cohorts),
    options=options,
)


if __name__ == "__main__":  # the command before the specs: say what replaced it
    raise SystemExit(f"{__spec__.name} is a spec: python -m benchmarks run|table cpfl_cohorts")
