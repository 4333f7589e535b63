"""A sweep's table and curves, built from the run folders ``<out>/<variant>/seed<N>/``.

``table.json`` and ``table.md`` (:func:`build_table`, :func:`markdown`): the header names the
metric and the seed set (a tuning set says "tuning seeds: not for claims"); per variant the
seeds it finished, the final metric per seed (its value in the last round that has it), n,
mean, the 95% t interval and the sample sd (:func:`fedgo_app.sweep.stats.summarize`); per
variant other than the baseline the paired differences against it on the seeds both finished
(:func:`fedgo_app.sweep.stats.paired`); per variant other than the baseline its wall time
over the baseline's, seed by seed (each run's ``total_time`` in its summary), as a geometric
mean with its 95% log-scale interval (:func:`fedgo_app.sweep.stats.ratio_summary`; runs
side by side or beside other work make it a cost indication, not a timing); and the runs left
out: missing (not finished),
failed, or finished under another configuration (``excluded``); and the commits and package
versions the runs used, per variant, from each run's ``env.json``
(:mod:`fedgo_flwr.records.provenance`; ``unknown`` without one), a variant whose runs used
several commits named as such. ``curves.png``
(:func:`fedgo_flwr.records.plots.plot_curves`): the metric's mean per round with its 95%
band, one line per variant, titled with the runs' setting.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace

from fedgo_app.sweep.seeds import SeedSet
from fedgo_app.sweep.stats import LEVEL, finite, paired, ratio_summary, summarize
from fedgo_app.sweep.variants import Variant
from fedgo_flwr.records.plots import plot_curves
from fedgo_flwr.records.provenance import ENV_FILE
from fedgo_flwr.records.report_groups import cell, commits, versions
from fedgo_flwr.runtime.fileio import atomic_write_text

SUMMARY = "summary.json"
METRICS = "metrics.jsonl"


def run_dir(out: Path, variant: str, seed: int) -> Path:
    return out / variant / f"seed{seed}"


def read_rows(path: Path) -> list[dict]:
    """The rows of a ``metrics.jsonl`` (``[]`` if there is none)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def final_value(rows: Sequence[Mapping], metric: str) -> float | None:
    """``metric`` in the last row that has it (NaN where that row holds ``null``, JSON's NaN);
    ``None`` if no row has it."""
    for row in reversed(rows):
        if metric in row:
            value = row[metric]
            return float(value) if finite(value) else math.nan
    return None


def total_time(folder: Path) -> float | None:
    """The run's wall time, ``total_time`` in its ``summary.json`` (``None`` without a finite
    one, or a summary that is not a JSON object)."""
    try:
        summary = json.loads((folder / SUMMARY).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    value = summary.get("total_time") if isinstance(summary, dict) else None
    return float(value) if finite(value) else None


def curve(rows: Sequence[Mapping], metric: str) -> dict[int, float]:
    """``{round: value}`` of the rows with a finite ``metric``."""
    return {
        int(r["round"]): float(r[metric]) for r in rows if "round" in r and finite(r.get(metric))
    }


def provenance(folder: Path) -> tuple[list[str], list[str]]:
    """The commits and the package versions a run's starts used, from its ``env.json``
    (``["unknown"]`` each when it has none, or one that is not a JSON object)."""
    try:
        env = json.loads((folder / ENV_FILE).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        env = None
    run = SimpleNamespace(env=env if isinstance(env, dict) else None)
    return commits(run), versions(run)


def _by_seed(per_seed: Mapping[int, Sequence[str]]) -> dict[str, list[int]]:
    """``{seed: [value, ...]}`` as ``{value: [seed, ...]}``, in first-seen order."""
    out: dict[str, list[int]] = {}
    for seed, values in per_seed.items():
        for value in values:
            out.setdefault(value, []).append(seed)
    return out


def _clean(value):
    """JSON-safe: NaN and infinities as ``None``, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def build_table(
    out: Path,
    variants: Sequence[Variant],
    seed_set: SeedSet,
    baseline: str,
    metric: str = "test_accuracy",
    excluded: Mapping[tuple[str, int], str] | None = None,
    common: Sequence[str] = (),
) -> dict:
    """The table of the finished runs in ``out`` (see the module); ``excluded`` maps
    ``(variant, seed)`` to why that run is left out although its folder may hold a summary."""
    excluded = dict(excluded or {})
    rows_of: dict[str, dict[int, list[dict]]] = {}
    entries, left_out = [], []
    for v in variants:
        per_seed: dict[int, float | None] = {}
        times: dict[int, float | None] = {}
        used: dict[int, tuple[list[str], list[str]]] = {}
        rows_of[v.name] = {}
        for seed in seed_set.seeds:
            folder = run_dir(out, v.name, seed)
            if (v.name, seed) in excluded:
                left_out.append({"variant": v.name, "seed": seed, "why": excluded[v.name, seed]})
                continue
            if not (folder / SUMMARY).is_file():
                left_out.append({"variant": v.name, "seed": seed, "why": "not finished"})
                continue
            rows = read_rows(folder / METRICS)
            rows_of[v.name][seed] = rows
            per_seed[seed] = final_value(rows, metric)
            times[seed] = total_time(folder)
            used[seed] = provenance(folder)
        s = summarize(per_seed.values())
        entries.append(
            {
                **v.to_dict(),
                "seeds_finished": list(per_seed),
                "seeds_missing": [x for x in seed_set.seeds if x not in per_seed],
                "seeds_not_finite": [x for x, y in per_seed.items() if not finite(y)],
                "per_seed": {str(k): y for k, y in per_seed.items()},
                "total_time": {str(k): y for k, y in times.items()},
                "commits": _by_seed({k: c for k, (c, _) in used.items()}),
                "versions": _by_seed({k: vs for k, (_, vs) in used.items()}),
                **s.to_dict(),
            }
        )
    base = next(e for e in entries if e["name"] == baseline)
    base_values = {int(k): y for k, y in base["per_seed"].items()}
    comparisons = []
    for e in entries:
        if e["name"] == baseline:
            continue
        result = paired(base_values, {int(k): y for k, y in e["per_seed"].items()})
        comparisons.append({"variant": e["name"], "baseline": baseline, **result.to_dict()})
    time_ratios = [_time_ratio(base, e) for e in entries if e["name"] != baseline]
    table = {
        "metric": metric,
        "value": f"{metric} in each run's last round that has it",
        "level": LEVEL,
        "interval": "mean ± t(0.975, n-1) · sd / sqrt(n), sample sd",
        "seed_set": {
            "name": seed_set.name,
            "seeds": list(seed_set.seeds),
            "for_claims": seed_set.for_claims,
            "note": seed_set.note,
        },
        "common_overrides": list(common),
        "baseline": baseline,
        "variants": entries,
        "paired": comparisons,
        "time_ratios": [t for t in time_ratios if t["ratios"]],
        "left_out": left_out,
        "curves": {v.name: _curve_band(rows_of[v.name], metric) for v in variants},
    }
    return _clean(table)


def _time_ratio(base: Mapping, entry: Mapping) -> dict:
    """``entry``'s wall time over ``base``'s on each seed both have one for, summarised on the
    log scale (:func:`ratio_summary`)."""
    seeds = [k for k, t in base["total_time"].items() if t and entry["total_time"].get(k)]
    ratios = [entry["total_time"][k] / base["total_time"][k] for k in seeds]
    summary = ratio_summary(ratios)
    return {"variant": entry["name"], "baseline": base["name"], "seeds": seeds, **summary.to_dict()}


def _curve_band(runs: Mapping[int, list[dict]], metric: str) -> dict[str, list]:
    curves = [curve(rows, metric) for rows in runs.values()]
    rounds = sorted(set().union(*curves)) if curves else []
    band: dict[str, list] = {"round": rounds, "n": [], "mean": [], "ci_low": [], "ci_high": []}
    for r in rounds:
        s = summarize(c[r] for c in curves if r in c)
        band["n"].append(s.n)
        band["mean"].append(s.mean)
        band["ci_low"].append(s.ci_low)
        band["ci_high"].append(s.ci_high)
    return band


def _num(x: float | None, digits: int = 4) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _signed(x: float | None, digits: int = 4) -> str:
    return "–" if x is None else f"{x:+.{digits}f}"


def _interval(lo: float | None, hi: float | None, n: int, signed: bool = False) -> str:
    if lo is None:
        return "no CI (n=1)" if n == 1 else "–"
    f = _signed if signed else _num
    return f"[{f(lo)}, {f(hi)}]"


def _p(p: float | None, n: int, sd: float | None) -> str:
    if p is not None:
        return f"{p:.3g}"
    if n < 2:
        return f"no test (n={n})"
    return "no test (equal diffs)" if sd == 0 else "–"


def markdown(table: Mapping) -> str:
    """``table.md``: the header, the per-variant table, the paired differences, left-out runs."""
    seeds = table["seed_set"]
    metric = table["metric"]
    pct = int(round(100 * table["level"]))
    lines = [
        f"# Sweep: final `{metric}`, {len(seeds['seeds'])} {seeds['name']} seeds",
        "",
    ]
    if seeds["name"] == "tuning":
        lines += [f"**{seeds['note']}.**", ""]
    else:
        lines += [f"Seeds: {seeds['note']}.", ""]
    if table["common_overrides"]:
        lines += [f"Overrides for every variant: `{' '.join(table['common_overrides'])}`", ""]
    lines += [
        f"Final value: {table['value']}. {pct}% CI: {table['interval']}.",
        "",
        f"| variant | config | n | mean | {pct}% CI | sd | per seed |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in table["variants"]:
        config = " ".join([e["config"], *e["overrides"]])
        per = ", ".join(
            f"{k}: {_num(v)}" if v is not None else f"{k}: NaN" for k, v in e["per_seed"].items()
        )
        n = f"{e['n']}/{len(seeds['seeds'])}"
        if e["n_nan"]:
            n += f" ({e['n_nan']} NaN)"
        lines.append(
            f"| {e['name']} | `{config}` | {n} | {_num(e['mean'])} "
            f"| {_interval(e['ci_low'], e['ci_high'], e['n'])} | {_num(e['sd'])} | {per or '–'} |"
        )
    if table["paired"]:
        lines += [
            "",
            f"## Paired differences: variant − `{table['baseline']}`, same seed",
            "",
            "On the seeds both finished with a finite value; two-sided paired t-test.",
            "",
            f"| variant | pairs | mean diff | {pct}% CI | p | per-seed diffs |",
            "|---|---|---|---|---|---|",
        ]
        for c in table["paired"]:
            per = ", ".join(
                f"{s}: {_signed(d)}" for s, d in zip(c["seeds"], c["diffs"], strict=True)
            )
            lines.append(
                f"| {c['variant']} | {c['diff_n']} | {_signed(c['diff_mean'])} "
                f"| {_interval(c['diff_ci_low'], c['diff_ci_high'], c['diff_n'], signed=True)} "
                f"| {_p(c['p_value'], c['diff_n'], c['diff_sd'])} | {per or '–'} |"
            )
    lines += _time_ratio_lines(table.get("time_ratios", []), table["baseline"], pct)
    if table["left_out"]:
        lines += ["", "## Runs left out", ""]
        lines += [f"- {x['variant']} seed {x['seed']}: {x['why']}" for x in table["left_out"]]
    lines += _provenance_lines(table["variants"])
    return "\n".join(lines) + "\n"


def _time_ratio_lines(ratios: Sequence[Mapping], baseline: str, pct: int) -> list[str]:
    """The wall-time ratios' section: per variant the geometric mean of its per-seed ratios to
    ``baseline`` and the interval; nothing when no pair of runs has a wall time."""
    if not ratios:
        return []
    lines = [
        "",
        f"## Wall time: variant / `{baseline}`, same seed",
        "",
        "Each run's `total_time` (its summary) over the baseline's on the same seed; geometric "
        f"mean and its {pct}% t interval on the log scale. Runs side by side or beside other "
        "work make this a cost indication, not a timing; an interval that holds 1 shows neither "
        "faster nor slower.",
        "",
        f"| variant | pairs | geometric mean | {pct}% CI | per-seed ratios |",
        "|---|---|---|---|---|",
    ]
    for t in ratios:
        interval = (
            "no CI (n=1)" if t["ci_low"] is None else f"[{t['ci_low']:.2f}, {t['ci_high']:.2f}]"
        )
        per = ", ".join(f"{s}: {r:.2f}" for s, r in zip(t["seeds"], t["ratios"], strict=True))
        lines.append(f"| {t['variant']} | {t['n']} | {t['gmean']:.2f}x | {interval} | {per} |")
    return lines


def _used(by_value: Mapping[str, Sequence[int]], kind: str) -> str:
    """One value, or ``N commits: a (seeds 0, 1); b (seed 2)``."""
    if len(by_value) == 1:
        return cell(next(iter(by_value)))
    return f"**{len(by_value)} {kind}**: " + "; ".join(
        f"{cell(value)} (seed {', '.join(map(str, seeds))})" for value, seeds in by_value.items()
    )


def _provenance_lines(entries: Sequence[Mapping]) -> list[str]:
    """The Provenance section: per variant the commits and versions its finished runs used
    (from their ``env.json``); a variant of several commits says so."""
    entries = [e for e in entries if e.get("commits")]
    if not entries:
        return []
    lines = [
        "",
        "## Provenance",
        "",
        "From each finished run's env.json (unknown: a run without one; +dirty: uncommitted "
        "changes).",
        "",
        "| variant | commit | versions |",
        "|---|---|---|",
    ]
    for e in entries:
        lines.append(
            f"| {e['name']} | {_used(e['commits'], 'commits')} "
            f"| {_used(e['versions'], 'sets of versions')} |"
        )
    return lines


def write_table(table: Mapping, out: Path) -> dict[str, Path]:
    """Write ``table.json``, ``table.md`` and ``curves.png`` into ``out``; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "table.json", "md": out / "table.md", "png": out / "curves.png"}
    # atomic writes: a link planted at one of these names is replaced, never written through
    atomic_write_text(paths["json"], json.dumps(table, indent=1, allow_nan=False) + "\n")
    atomic_write_text(paths["md"], markdown(table))
    plot_curves(table, paths["png"], runs_dir=out)
    return paths
