"""What the report averages together, and what it says about it (issue 50): run folders
written by hand, one test per case a user met (different rounds under one name, a sweep's
``<variant>/seed<N>`` folders, one seed run twice, a short run's last-k, one seed, runs of
different commits, an unfinished run's wall time)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from fedgo_flwr.records.report import load_run
from fedgo_flwr.records.report import main as report_main
from fedgo_flwr.records.report_groups import arrange, commits, versions

COMMIT_A = "a" * 40
COMMIT_B = "b" * 40


def config(seed: int = 0, rounds: int = 3, strategy: str = "fedavg", **strategy_keys) -> dict:
    return {
        "name": "default",
        "seed": seed,
        "rounds": rounds,
        "output_dir": None,
        "data": {"dataset": "digits", "alpha": 0.1},
        "strategy": {"name": strategy, **strategy_keys},
    }


def make_run(
    folder: Path,
    accs: list[float],
    cfg: dict | None = None,
    commit: str | None = COMMIT_A,
    started: str = "2026-12-01T10:00:00+00:00",
    total_time: float | None = 100.0,
    env: dict | None = None,
) -> Path:
    """A run folder: ``accs[r]`` is round r's test accuracy (round 0 first), ``elapsed`` r
    seconds; ``summary.json`` (finished) when ``total_time`` is not ``None``; ``env.json``
    with ``commit`` unless ``commit`` is ``None`` (no env.json) or ``env`` replaces it."""
    folder.mkdir(parents=True)
    cfg = config() if cfg is None else cfg
    rows = [{"round": r, "test_accuracy": a, "elapsed": float(r)} for r, a in enumerate(accs)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "config.yaml").write_text(json.dumps(cfg))  # JSON is YAML
    if total_time is not None:
        summary = {"strategy": cfg["strategy"]["name"], "total_time": total_time}
        (folder / "summary.json").write_text(json.dumps(summary))
    if env is None and commit is not None:
        env = {
            "started": started,
            "git": {"commit": commit, "dirty": False},
            "python": "3.11.7",
            "packages": {"torch": "2.14.1", "flwr": "1.42.0", "ray": "2.55.1", "numpy": "2.4.6"},
        }
    if env is not None:
        (folder / "env.json").write_text(json.dumps(env))
    return folder


def report(tmp_path: Path, capsys, *args: str) -> tuple[dict[str, dict], str, str]:
    """Run the report; its table.csv rows by label, table.md and stderr."""
    out = tmp_path / "report"
    assert report_main([*args, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    with open(out / "table.csv") as fh:
        rows = {r["label"]: r for r in csv.DictReader(fh)}
    return rows, (out / "table.md").read_text(), err


def table_line(md: str, label: str) -> str:
    return next(line for line in md.splitlines() if line.startswith(f"| {label} |"))


def test_runs_of_different_rounds_under_one_name_are_separate_rows(tmp_path, capsys):
    """``outputs/default`` with two 10-round runs and one 3-round run: two rows, never one."""
    parent = tmp_path / "outputs" / "default"
    make_run(parent / "2026-12-01_10-00-00", [0.1] + [0.5] * 10, config(0, rounds=10))
    make_run(parent / "2026-12-01_11-00-00", [0.1] + [0.7] * 10, config(1, rounds=10))
    make_run(parent / "2026-12-01_12-00-00", [0.1, 0.2, 0.3, 0.4], config(0, rounds=3))
    rows, md, err = report(tmp_path, capsys, str(parent))
    assert set(rows) == {"default (rounds=10)", "default (rounds=3)"}
    long, short = rows["default (rounds=10)"], rows["default (rounds=3)"]
    assert (long["n"], long["seeds"]) == ("2", "0 1")
    assert float(long["final_mean"]) == pytest.approx(0.6)  # (0.5 + 0.7) / 2
    assert (short["n"], short["seeds"], float(short["final_mean"])) == ("1", "0", 0.4)
    assert long["config_fingerprint"] != short["config_fingerprint"]
    assert "'default' holds runs of 2 configurations, not averaged together" in err
    assert "(they differ in rounds)" in err
    assert "## Not averaged together" in md and "differ in `rounds`" in md


def test_a_sweeps_variants_are_its_groups(tmp_path, capsys):
    """``<out>/fedavg/seed<N>`` and ``<out>/feddf/seed<N>``: one row per variant, by the variant's
    name, whether the variant folders or the sweep's folder is given."""
    out = tmp_path / "sweep"
    finals = {"fedavg": [0.3, 0.4, 0.5], "feddf": [0.6, 0.7, 0.8]}
    for variant, values in finals.items():
        for seed, final in enumerate(values):
            cfg = config(seed, rounds=1, strategy=variant)
            make_run(out / variant / f"seed{seed}", [0.1, final], cfg)
    (out / "table.md").write_text("the sweep's own table\n")
    by_variant, _, err = report(tmp_path, capsys, str(out / "fedavg"), str(out / "feddf"))
    whole, _, _ = report(tmp_path, capsys, str(out))
    assert by_variant == whole
    assert set(whole) == {"fedavg", "feddf"} and err == ""
    for variant, values in finals.items():
        row = whole[variant]
        assert (row["n"], row["seeds"], row["strategy"]) == ("3", "0 1 2", variant)
        assert float(row["final_mean"]) == pytest.approx(sum(values) / 3)
        assert float(row["final_sd"]) == pytest.approx(0.1)


def test_one_seed_run_twice_counts_once_the_newest_kept(tmp_path, capsys):
    parent = tmp_path / "outputs" / "default"
    old = make_run(parent / "2026-12-01_10-00-00", [0.1, 0.4], started="2026-12-01T10:00:00Z")
    new = make_run(parent / "2026-12-01_11-00-00", [0.1, 0.6], started="2026-12-01T11:00:00Z")
    rows, md, err = report(tmp_path, capsys, str(parent))
    row = rows["default"]
    assert (row["n"], row["seeds"], float(row["final_mean"]), row["final_sd"]) == (
        "1",
        "0",
        0.6,
        "",
    )
    assert "| default | 1 | 0 | 60.0 | 60.0 | 60.0 (last 1) |" in md  # no "± 0.0"
    assert f"{old}: seed 0 again in 'default'; kept {new}" in md
    assert f"{old}: left out: seed 0 again" in err
    with open(tmp_path / "report" / "metrics.csv") as fh:
        left = {r["run"]: r["left_out"] for r in csv.DictReader(fh)}
    assert left[new.name] == "" and left[old.name].startswith("seed 0 again")


def test_a_finished_run_is_kept_before_a_newer_unfinished_one(tmp_path):
    parent = tmp_path / "runs"
    done = make_run(parent / "a-seed0", [0.1, 0.5], started="2026-12-01T10:00:00Z")
    make_run(parent / "b-seed0", [0.1], started="2026-12-02T10:00:00Z", total_time=None)
    runs = [load_run(p, "strategy") for p in (parent / "a-seed0", parent / "b-seed0")]
    arranged = arrange(runs)
    assert [r.path for r in arranged.groups["fedavg"]] == [done]
    assert [r.path.name for r, _ in arranged.left_out] == ["b-seed0"]


def test_a_short_runs_last_k_and_one_seeds_row(tmp_path, capsys):
    """3 rounds: last-3 over rounds 1-3, round 0 (the untrained model) never in it; best
    neither. One seed: values without an interval."""
    make_run(tmp_path / "short-seed0", [0.95, 0.5, 0.6, 0.7])
    rows, md, _ = report(tmp_path, capsys, str(tmp_path / "short-seed0"))
    row = rows["short"]
    assert float(row["last10_mean"]) == pytest.approx(0.6) and row["last_k"] == "3"
    assert float(row["best_mean"]) == pytest.approx(0.7)  # not round 0's 0.95
    assert "| short | 1 | 0 | 70.0 | 70.0 | 60.0 (last 3) | 100 |" in md
    assert "±" not in table_line(md, "short")


def test_last_10_of_a_long_run(tmp_path, capsys):
    make_run(tmp_path / "long-seed0", [0.0] + [0.1 * (r % 10) for r in range(1, 13)])
    rows, md, _ = report(tmp_path, capsys, str(tmp_path / "long-seed0"))
    # rounds 3..12: 0.3 .. 0.9, 0.0, 0.1, 0.2
    expected = sum(0.1 * (r % 10) for r in range(3, 13)) / 10
    assert float(rows["long"]["last10_mean"]) == pytest.approx(expected)
    assert rows["long"]["last_k"] == "10" and "(last" not in table_line(md, "long")


def test_wall_time_is_the_whole_run_and_says_where_it_comes_from(tmp_path, capsys):
    """summary.json's total_time (every stage), not the last round's elapsed; an unfinished
    run (no summary.json) falls back to its last elapsed, marked."""
    make_run(tmp_path / "runs" / "x-seed0", [0.1, 0.5, 0.6], total_time=300.0)
    make_run(tmp_path / "runs" / "x-seed1", [0.1, 0.5], config(1), total_time=None)
    rows, md, _ = report(tmp_path, capsys, str(tmp_path / "runs"))
    row = rows["x"]
    assert float(row["wall_s_mean"]) == pytest.approx((300.0 + 1.0) / 2)
    assert row["wall_s_from"] == "last round's elapsed (1 unfinished of 2)"
    assert "150 ± 211 *" in table_line(md, "x") and "* a run without it (unfinished)" in md


def test_provenance_names_the_commits_and_a_group_of_several(tmp_path, capsys):
    runs = tmp_path / "runs"
    make_run(runs / "x-seed0", [0.1, 0.5], config(0), commit=COMMIT_A)
    make_run(runs / "x-seed1", [0.1, 0.5], config(1), commit=COMMIT_B)
    make_run(runs / "y-seed0", [0.1, 0.5], config(0), commit=None)  # no env.json
    rows, md, err = report(tmp_path, capsys, str(runs))
    assert rows["x"]["commits"] == "2 commits: aaaaaaaaaa (seed 0); bbbbbbbbbb (seed 1)"
    assert (
        rows["x"]["versions"] == "python 3.11.7, torch 2.14.1, flwr 1.42.0, ray 2.55.1, numpy 2.4.6"
    )
    assert rows["y"]["commits"] == rows["y"]["versions"] == "unknown"
    assert rows["x"]["config_fingerprint"] == rows["y"]["config_fingerprint"]
    assert "'x': its runs used 2 commits" in err and "'y'" not in err
    assert "## Provenance" in md and "| y | " in md.split("## Provenance")[1]


def test_a_resumed_run_on_another_commit_used_both(tmp_path):
    env = {
        "git": {"commit": COMMIT_B, "dirty": True},
        "earlier": [{"git": {"commit": COMMIT_A, "dirty": False}}],
    }
    run = load_run(make_run(tmp_path / "r-seed0", [0.1, 0.5], env=env))
    assert commits(run) == ["aaaaaaaaaa", "bbbbbbbbbb+dirty"]
    assert versions(run) == [
        "python unknown, torch unknown, flwr unknown, ray unknown, numpy unknown"
    ]


def test_env_fields_a_run_does_not_write_are_unknown_and_cells_stay_cells(tmp_path, capsys):
    env = {"git": {"commit": "abc|\n| forged | row |"}, "python": ["x"], "packages": "torch"}
    make_run(tmp_path / "runs" / "a|b-seed0", [0.1, 0.5], env=env)
    _, md, _ = report(tmp_path, capsys, str(tmp_path / "runs"))
    assert "forged" not in md
    assert "| a\\|b | 1 | 0 |" in md
    provenance = md.split("## Provenance")[1]
    assert "| a\\|b | " in provenance and "| unknown | python unknown, torch unknown" in provenance


def test_label_strategy_pools_one_config_across_folders_and_splits_the_rest(tmp_path, capsys):
    runs = tmp_path / "runs"
    make_run(runs / "first-seed0", [0.1, 0.4], config(0))
    make_run(runs / "second-seed1", [0.1, 0.6], config(1))
    make_run(runs / "third-seed0", [0.1, 0.9], config(0, mu=0.1))
    rows, _, err = report(tmp_path, capsys, str(runs), "--label", "strategy")
    assert set(rows) == {"fedavg (strategy.mu=unset)", "fedavg (strategy.mu=0.1)"}
    assert rows["fedavg (strategy.mu=unset)"]["seeds"] == "0 1"
    assert "(they differ in strategy.mu)" in err


def test_strategies_under_one_name_are_named_by_strategy(tmp_path, capsys):
    parent = tmp_path / "outputs" / "default"
    make_run(parent / "2026-12-01_10-00-00", [0.1, 0.4], config(0))
    make_run(parent / "2026-12-01_11-00-00", [0.1, 0.6], config(0, strategy="feddf", temp=2))
    rows, _, _ = report(tmp_path, capsys, str(parent))
    assert set(rows) == {"default (strategy=fedavg)", "default (strategy=feddf)"}


def test_many_differing_keys_are_cut_in_the_label_but_named_in_the_note(tmp_path, capsys):
    keys = {f"k{i}": i for i in range(5)}
    make_run(tmp_path / "runs" / "x-seed0", [0.1, 0.4], config(0))
    make_run(tmp_path / "runs" / "x-seed1", [0.1, 0.6], config(1, **keys))
    rows, _, err = report(tmp_path, capsys, str(tmp_path / "runs"))
    assert "x (strategy.k0=0, strategy.k1=1, strategy.k2=2, +2 more keys)" in rows
    assert "strategy.k4" in err


def test_a_path_naming_the_runs_own_seed_is_the_same_input_for_every_seed(tmp_path, capsys):
    """Co-Boosting's seed k distils the teachers of oneshot's seed k: one experiment."""
    runs = tmp_path / "runs"
    for seed in (0, 1):
        teachers = f"out/x/a0.1-oneshot-seed{seed}"
        cfg = config(seed, strategy="coboosting", teachers_from=teachers)
        make_run(runs / f"cb-seed{seed}", [0.1, 0.5 + 0.1 * seed], cfg)
    other = config(2, strategy="coboosting", teachers_from="out/x/a0.1-oneshot-seed0")
    make_run(runs / "cb-seed2", [0.1, 0.9], other)  # seed 2 with seed 0's teachers
    rows, _, err = report(tmp_path, capsys, str(runs))
    label = "cb (strategy.teachers_from=out/x/a0.1-oneshot-seed{})"
    assert rows[label.format("<N>")]["seeds"] == "0 1"
    assert rows[label.format("0")]["seeds"] == "2"
    assert "(they differ in strategy.teachers_from)" in err


def test_a_core_key_added_since_counts_as_its_default(tmp_path, capsys):
    """A run written before ``data.partition`` existed ran with what is now its default."""
    from fedgo_flwr.config.experiment import ExperimentConfig

    full = ExperimentConfig().to_dict(strategy_params=False)
    older = json.loads(json.dumps(full))
    del older["data"]["partition"]
    changed = json.loads(json.dumps(full))
    changed["data"]["partition"] = "shards"
    runs = tmp_path / "runs"
    make_run(runs / "x-seed0", [0.1, 0.4], {**older, "seed": 0})
    make_run(runs / "x-seed1", [0.1, 0.6], {**full, "seed": 1})
    make_run(runs / "x-seed2", [0.1, 0.8], {**changed, "seed": 2})
    rows, _, _ = report(tmp_path, capsys, str(runs))
    default = full["data"]["partition"]
    assert rows[f"x (data.partition={default})"]["seeds"] == "0 1"
    assert rows["x (data.partition=shards)"]["seeds"] == "2"
    # the row's fingerprints are each run's own (as in its env.json), here two
    assert "alike but for" in rows[f"x (data.partition={default})"]["config_fingerprint"]


def test_each_partition_has_a_file_of_its_own(tmp_path, capsys):
    """Two variants' ``seed0`` folders with different partitions: two files, named by variant."""
    out = tmp_path / "sweep"
    for variant, hist in (("a", [[3, 1], [0, 4]]), ("b", [[1, 1], [2, 2]])):
        folder = make_run(out / variant / "seed0", [0.1, 0.5], config(0, alpha=variant))
        (folder / "partition.json").write_text(json.dumps({"class_histogram": hist}))
    report(tmp_path, capsys, str(out))
    names = sorted(p.name for p in (tmp_path / "report").glob("partition-*.png"))
    assert names == ["partition-a-seed0.png", "partition-b-seed0.png"]


def test_a_long_value_in_a_label_keeps_its_end(tmp_path, capsys):
    path = "outputs/bench/some-long-benchmark-name/fedgo-seed0/generator.pt"
    make_run(tmp_path / "runs" / "x-seed0", [0.1, 0.4], config(0, generator=path))
    make_run(tmp_path / "runs" / "x-seed1", [0.1, 0.6], config(1, generator=None))
    rows, _, _ = report(tmp_path, capsys, str(tmp_path / "runs"))
    assert set(rows) == {
        "x (strategy.generator=…name/fedgo-seed<N>/generator.pt)",
        "x (strategy.generator=null)",
    }
