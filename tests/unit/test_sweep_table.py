"""The sweep table's provenance: the commits and versions each variant's runs used, from their
``env.json`` (``fedgo_app.sweep.table``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedgo_app.sweep.seeds import SeedSet
from fedgo_app.sweep.table import build_table, markdown
from fedgo_app.sweep.variants import Variant


def finished(folder: Path, final: float, env: dict | str | None) -> None:
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text(json.dumps({"round": 1, "test_accuracy": final}) + "\n")
    (folder / "summary.json").write_text("{}")
    if env is not None:
        (folder / "env.json").write_text(env if isinstance(env, str) else json.dumps(env))


def env(commit: str, dirty: bool = False) -> dict:
    packages = {"torch": "2.14.1", "flwr": "1.42.0", "ray": "2.55.1", "numpy": "2.4.6"}
    return {"git": {"commit": commit, "dirty": dirty}, "python": "3.11.7", "packages": packages}


def test_each_variant_names_its_commits_and_a_variant_of_two_says_so(tmp_path):
    finished(tmp_path / "a" / "seed0", 0.5, env("1" * 40))
    finished(tmp_path / "a" / "seed1", 0.6, env("1" * 40))
    finished(tmp_path / "b" / "seed0", 0.7, env("2" * 40))
    finished(tmp_path / "b" / "seed1", 0.8, env("3" * 40, dirty=True))
    variants = [Variant("a", "conf/default.yaml"), Variant("b", "conf/default.yaml")]
    table = build_table(tmp_path, variants, SeedSet("custom", (0, 1)), "a")
    by = {v["name"]: v for v in table["variants"]}
    assert by["a"]["commits"] == {"1111111111": [0, 1]}
    assert by["b"]["commits"] == {"2222222222": [0], "3333333333+dirty": [1]}
    versions = "python 3.11.7, torch 2.14.1, flwr 1.42.0, ray 2.55.1, numpy 2.4.6"
    assert by["a"]["versions"] == {versions: [0, 1]}
    text = markdown(table)
    assert f"| a | 1111111111 | {versions} |" in text
    assert "| b | **2 commits**: 2222222222 (seed 0); 3333333333+dirty (seed 1) |" in text


def test_a_run_without_a_readable_env_json_is_unknown(tmp_path):
    finished(tmp_path / "a" / "seed0", 0.5, None)
    finished(tmp_path / "a" / "seed1", 0.6, "{not json")
    table = build_table(tmp_path, [Variant("a", "x.yaml")], SeedSet("custom", (0, 1)), "a")
    (entry,) = table["variants"]
    assert entry["commits"] == {"unknown": [0, 1]} and entry["n"] == 2
    assert "| a | unknown | unknown |" in markdown(table)


def test_wall_time_ratios_are_geometric_means_seed_by_seed(tmp_path):
    def run(variant: str, seed: int, summary: str) -> None:
        folder = tmp_path / variant / f"seed{seed}"
        finished(folder, 0.5, None)
        (folder / "summary.json").write_text(summary)

    for seed, (a, b) in enumerate([(10.0, 20.0), (10.0, 10.0), (20.0, 30.0)]):
        run("a", seed, json.dumps({"total_time": a}))
        run("b", seed, json.dumps({"total_time": b}))
    run("c", 0, json.dumps({"total_time": 5.0}))  # one pair: no interval
    run("c", 1, "{}")  # no wall time: left out of the ratios
    run("c", 2, "not json")
    run("d", 0, "{}")  # no pair at all: no row
    variants = [Variant(v, "conf/default.yaml") for v in "abcd"]
    table = build_table(tmp_path, variants, SeedSet("custom", (0, 1, 2)), "a")
    by = {t["variant"]: t for t in table["time_ratios"]}
    assert set(by) == {"b", "c"} and by["b"]["seeds"] == ["0", "1", "2"]
    # By hand: ratios 2, 1, 1.5; logs 0.6931, 0, 0.4055, mean 0.3662 (exp: 1.442), sd 0.3482,
    # half-width 4.3027 x 0.3482 / sqrt(3) = 0.8651: exp(-0.4989) = 0.607, exp(1.2313) = 3.425.
    assert by["b"]["gmean"] == pytest.approx(3 ** (1 / 3))
    text = markdown(table)
    assert "## Wall time: variant / `a`, same seed" in text
    assert "| b | 3 | 1.44x | [0.61, 3.43] | 0: 2.00, 1: 1.00, 2: 1.50 |" in text
    assert "| c | 1 | 0.50x | no CI (n=1) | 0: 0.50 |" in text
    assert "| d |" not in text.split("## Wall time")[1].split("## Provenance")[0]
    # and without any wall time (older summaries) the section is not there
    other = tmp_path / "other"
    finished(other / "a" / "seed0", 0.5, None)
    finished(other / "b" / "seed0", 0.6, None)
    two = [Variant("a", "x.yaml"), Variant("b", "x.yaml")]
    assert "Wall time" not in markdown(build_table(other, two, SeedSet("custom", (0,)), "a"))
