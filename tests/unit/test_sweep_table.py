"""The sweep table's provenance: the commits and versions each variant's runs used, from their
``env.json`` (``fedgo_flwr.app.sweep.table``)."""

from __future__ import annotations

import json
from pathlib import Path

from fedgo_flwr.app.sweep.seeds import SeedSet
from fedgo_flwr.app.sweep.table import build_table, markdown
from fedgo_flwr.app.sweep.variants import Variant


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
