"""The sweep's statistics, seed sets, command-line words and table (``fedgo_app.sweep``).

Worked examples with published numbers: a t interval by hand, and Student's sleep data (R's
``t.test(extra ~ group, data = sleep, paired = TRUE)``: t = -4.0621, df = 9, p = 0.002833,
95% CI -2.4598858 .. -0.7001142). A normal instead of a t quantile, a population sd, an
unpaired test or a NaN that leaks into a mean must fail here.
"""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path

import pytest

from fedgo_app.sweep.seeds import REPORT_SEEDS, TUNING_SEEDS, classify, parse_seeds
from fedgo_app.sweep.stats import paired, summarize
from fedgo_app.sweep.table import build_table, markdown, write_table
from fedgo_app.sweep.variants import SweepArgumentError, Variant, parse_words

ROOT = Path(__file__).resolve().parents[2]

# Student (1908) / Cushny & Peebles: extra hours of sleep under two drugs, ten patients.
SLEEP_1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
SLEEP_2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]


def test_the_interval_is_students_t_with_the_sample_sd() -> None:
    from scipy import stats as scipy_stats

    s = summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    # by hand: mean 3, sample sd sqrt(10/4), t(0.975, 4) = 2.7764451 (tables: 2.776)
    half = 2.7764451 * math.sqrt(2.5) / math.sqrt(5)
    assert (s.n, s.mean, s.n_nan) == (5, 3.0, 0)
    assert s.sd == pytest.approx(math.sqrt(2.5))
    assert (s.ci_low, s.ci_high) == pytest.approx((3 - half, 3 + half), abs=1e-6)
    assert s.half_width == pytest.approx(1.9632432, abs=1e-6)  # 1.96 * sd/sqrt(n) is 1.386
    low, high = scipy_stats.t.interval(0.95, 4, loc=3.0, scale=scipy_stats.sem([1, 2, 3, 4, 5]))
    assert (s.ci_low, s.ci_high) == pytest.approx((low, high))


def test_the_paired_test_reproduces_students_sleep_data() -> None:
    from scipy import stats as scipy_stats

    seeds = range(10)
    result = paired(dict(zip(seeds, SLEEP_2, strict=True)), dict(zip(seeds, SLEEP_1, strict=True)))
    assert result.seeds == list(seeds)
    assert result.diff.mean == pytest.approx(-1.58)
    assert result.t == pytest.approx(-4.0621, abs=1e-4)
    assert result.p_value == pytest.approx(0.002833, abs=1e-6)
    assert (result.diff.ci_low, result.diff.ci_high) == pytest.approx(
        (-2.4598858, -0.7001142), abs=1e-6
    )
    reference = scipy_stats.ttest_rel(SLEEP_1, SLEEP_2)
    assert result.p_value == pytest.approx(reference.pvalue)
    assert result.t == pytest.approx(reference.statistic)
    # unpaired, the same numbers are not significant: the pairing is what the test uses
    assert scipy_stats.ttest_ind(SLEEP_1, SLEEP_2).pvalue > 0.05


def test_one_value_has_a_mean_and_no_interval_and_none_has_nothing() -> None:
    one = summarize([0.42])
    assert (one.n, one.mean, one.sd, one.ci_low, one.ci_high) == (1, 0.42, None, None, None)
    assert one.half_width is None
    none = summarize([])
    assert (none.n, none.mean, none.sd, none.ci_low) == (0, None, None, None)


def test_nan_and_missing_values_are_left_out_and_counted() -> None:
    s = summarize([0.5, float("nan"), None, 0.7, float("inf")])
    assert (s.n, s.n_nan) == (2, 3)
    assert s.mean == pytest.approx(0.6)
    assert summarize([float("nan")]).n == 0


def test_pairs_are_the_seeds_both_finished_with_a_finite_value() -> None:
    from scipy import stats as scipy_stats

    base = {0: 0.50, 1: 0.60, 2: 0.55, 3: 0.70, 4: float("nan")}
    other = {0: 0.55, 1: 0.62, 3: 0.71, 4: 0.9, 5: 0.8}  # 2 missing, 4 NaN in base, 5 extra
    result = paired(base, other)
    assert result.seeds == [0, 1, 3]
    assert result.diffs == pytest.approx([0.05, 0.02, 0.01])
    assert result.p_value == pytest.approx(
        scipy_stats.ttest_rel([0.55, 0.62, 0.71], [0.5, 0.6, 0.7]).pvalue
    )
    one = paired({0: 0.5, 1: 0.6}, {1: 0.7})
    assert (one.diff.n, one.t, one.p_value, one.diff.ci_low) == (1, None, None, None)
    assert one.diffs == pytest.approx([0.1])
    same = paired({0: 0.5, 1: 0.6}, {0: 0.6, 1: 0.7})  # equal differences: no test
    assert same.p_value is None and same.diff.sd == 0
    assert (same.diff.ci_low, same.diff.ci_high) == pytest.approx((0.1, 0.1))
    assert paired({0: 0.5}, {1: 0.5}).diff.n == 0


def test_seed_sets_are_named_and_a_tuning_seed_makes_a_set_tuning() -> None:
    assert not set(TUNING_SEEDS) & set(REPORT_SEEDS) and len(REPORT_SEEDS) == 5
    assert parse_seeds("tuning").seeds == TUNING_SEEDS
    assert parse_seeds("report").seeds == REPORT_SEEDS and parse_seeds("report").for_claims
    assert parse_seeds("0,1").name == "tuning" and "not for claims" in parse_seeds("0,1").note
    assert parse_seeds("100,103").name == "report"
    assert classify((1, 100)).name == "tuning"
    assert classify((7, 8)).name == "custom" and not classify((7, 8)).for_claims
    for bad in ("", "a,b", "1,1", "-1", "tunning"):
        with pytest.raises(ValueError):
            parse_seeds(bad)


def test_variants_are_named_yaml_words_with_overrides_of_their_own() -> None:
    variants, common = parse_words(
        [
            "conf/fedavg.yaml",
            "rounds=5",
            "feddf=conf/default.yaml strategy.name=feddf 'faults=[]'",
            "fg.x=conf/default.yml",
        ]
    )
    assert variants == [
        Variant("fedavg", "conf/fedavg.yaml"),
        Variant("feddf", "conf/default.yaml", ("strategy.name=feddf", "faults=[]")),
        Variant("fg.x", "conf/default.yml"),
    ]
    assert common == ["rounds=5"]
    for words in (
        ["conf/a.yaml", "conf/a.yaml"],  # two variants named a
        ["rounds=5"],  # no variant
        ["conf/a.yaml", "seed=3"],  # the sweep sets the seed
        ["a=conf/a.yaml output_dir=x"],
        ["a b=conf/a.yaml"],
        ["conf/a.yaml", "notanoverride"],
    ):
        with pytest.raises(SweepArgumentError):
            parse_words(words)


def _run(out: Path, variant: str, seed: int, accs: list[float | None]) -> None:
    folder = out / variant / f"seed{seed}"
    folder.mkdir(parents=True)
    rows = [{"round": r, "test_accuracy": a} for r, a in enumerate(accs)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "summary.json").write_text(json.dumps({"final_accuracy": accs[-1]}))


def test_the_table_says_which_seeds_and_leaves_out_what_is_missing(tmp_path) -> None:
    a, b, c = (
        Variant("a", "x.yaml"),
        Variant("b", "x.yaml", ("train.lr=0.1",)),
        Variant("c", "y.yaml"),
    )
    _run(tmp_path, "a", 0, [0.1, 0.5])
    _run(tmp_path, "a", 1, [0.1, 0.6])
    _run(tmp_path, "a", 2, [0.1, 0.7])
    _run(tmp_path, "b", 0, [0.1, 0.6])
    _run(tmp_path, "b", 1, [0.1, None])  # a NaN final accuracy
    _run(tmp_path, "b", 2, [0.1, 0.9])  # excluded below (stale)
    _run(tmp_path, "c", 1, [0.2, 0.4])  # c: one seed only
    table = build_table(
        tmp_path, [a, b, c], parse_seeds("tuning"), "a", excluded={("b", 2): "stale"}
    )
    by = {v["name"]: v for v in table["variants"]}
    assert by["a"]["n"] == 3 and by["a"]["mean"] == pytest.approx(0.6)
    assert by["a"]["ci_low"] == pytest.approx(0.6 - 4.3026527 * 0.1 / math.sqrt(3), abs=1e-6)
    assert by["b"]["per_seed"] == {"0": 0.6, "1": None}
    assert (by["b"]["n"], by["b"]["n_nan"], by["b"]["seeds_missing"]) == (1, 1, [2])
    assert by["c"]["seeds_missing"] == [0, 2] and by["c"]["ci_low"] is None
    pairs = {p["variant"]: p for p in table["paired"]}
    assert pairs["b"]["seeds"] == [0] and pairs["b"]["diffs"] == pytest.approx([0.1])
    assert pairs["c"]["diffs"] == pytest.approx([-0.2]) and pairs["c"]["p_value"] is None
    assert {(x["variant"], x["seed"]) for x in table["left_out"]} == {("b", 2), ("c", 0), ("c", 2)}
    assert table["curves"]["a"]["round"] == [0, 1] and table["curves"]["a"]["n"] == [3, 3]
    text = markdown(table)
    assert "tuning seeds: not for claims" in text.splitlines()[2]
    assert "no CI (n=1)" in text and "no test (n=1)" in text and "1 NaN" in text
    assert "c seed 0: not finished" in text and "b seed 2: stale" in text
    paths = write_table(table, tmp_path)
    assert json.loads(paths["json"].read_text()) == table
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_table_of_report_seeds_makes_no_tuning_caveat(tmp_path) -> None:
    a = Variant("a", "x.yaml")
    for seed in REPORT_SEEDS:
        _run(tmp_path, "a", seed, [0.1, 0.5 + seed / 1000])
    table = build_table(tmp_path, [a], parse_seeds("report"), "a")
    assert table["seed_set"]["for_claims"] and table["paired"] == []
    assert "not for claims" not in markdown(table) and "report seeds" in markdown(table)


@pytest.fixture(scope="module")
def bench_sweep():
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ROOT / "benchmarks"))
        return importlib.import_module("sweep")


def test_the_drivers_cells_use_the_same_statistics(bench_sweep) -> None:
    assert bench_sweep.mean_ci([0.01, 0.02, 0.03, 0.04, 0.05]) == "3.0 ± 2.0"
    assert bench_sweep.mean_ci([0.42]) == "42.0 (n=1, no CI)"
    assert bench_sweep.mean_sd([0.3, float("nan"), 0.5]) == "40.0 ± 14.1 (1 NaN)"
    runs_1 = [
        bench_sweep.Run(f"x-seed{i}", "x", f"seed{i}", {"v": v / 10}, [])
        for i, v in enumerate(SLEEP_1)
    ]
    runs_2 = [
        bench_sweep.Run(f"y-seed{i}", "y", f"seed{i}", {"v": v / 10}, [])
        for i, v in enumerate(SLEEP_2)
    ]
    cell = bench_sweep.paired_cell(runs_2, runs_1, lambda r: r.summary["v"], scale=10)
    assert cell == "-1.6 [-2.5, -0.7] p=0.0028 (n=10)"
    assert "not for claims" in bench_sweep.seed_note([0, 1, 2])
    assert bench_sweep.seed_note(bench_sweep.REPORT_SEEDS).startswith("report seeds")


def test_a_ratio_cell_is_the_geometric_mean_with_its_log_scale_interval(bench_sweep) -> None:
    # By hand: log 1, log 3, log 1.2 = 0, 1.0986, 0.1823; mean 0.4270 (exp: 1.533), sd 0.5888,
    # half-width t(0.975, 2) 4.3027 x 0.5888 / sqrt(3) = 1.4626: exp(-1.0356) = 0.355,
    # exp(1.8896) = 6.616. The arithmetic mean, 1.73, is not what the cell says.
    assert bench_sweep.ratio_cell([1.0, 3.0, 1.2]) == "1.53x [0.36, 6.62] (n=3)"
    # A ratio and its inverse: the cell of the inverses is the inverse cell.
    assert bench_sweep.ratio_cell([1.0, 1 / 3.0, 1 / 1.2]) == "0.65x [0.15, 2.82] (n=3)"
    assert bench_sweep.ratio_cell([2.0, 2.0]) == "2.00x [2.00, 2.00] (n=2)"
    assert bench_sweep.ratio_cell([1.25]) == "1.25x (n=1, no CI)"
    assert bench_sweep.ratio_cell([]) == "-"
    # not finite or not positive: left out and counted, never averaged in
    assert bench_sweep.ratio_cell([None, float("nan"), 0.0, 1.25]) == (
        "1.25x (n=1, no CI) (3 left out)"
    )


def test_ratio_summary_is_a_geometric_mean_with_a_log_scale_interval():
    # The CPFL speed-ups of the digits report seeds: arithmetic mean 1.38, geometric 1.18.
    from fedgo_app.sweep.stats import ratio_summary

    s = ratio_summary([2.35, 0.58, 1.20])
    assert s.gmean == pytest.approx((2.35 * 0.58 * 1.20) ** (1 / 3))
    assert (s.ci_low, s.ci_high) == pytest.approx((0.2072, 6.7012), abs=1e-3)
    assert s.holds_one()
    inverse = ratio_summary([1 / 2.35, 1 / 0.58, 1 / 1.20])
    assert inverse.gmean == pytest.approx(1 / s.gmean)
    assert (inverse.ci_low, inverse.ci_high) == pytest.approx((1 / s.ci_high, 1 / s.ci_low))
    clear = ratio_summary([1.9, 2.0, 2.1])
    assert not clear.holds_one() and clear.ci_low > 1
    odd = ratio_summary([None, float("nan"), 0.0, -1.0, 2.0])
    assert (odd.n, odd.n_left_out, odd.gmean, odd.ci_low) == (1, 4, 2.0, None)
