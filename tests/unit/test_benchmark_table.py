"""The Table-3 driver's table is built from the committed run records, so check its arithmetic.

``python -m benchmarks table fedgo_table3`` turns ``summary.json`` / ``metrics.jsonl`` of finished
runs (and the FedGO runs' ``separation.json``) into ``table.md``; these tests build such records
by hand and check the figures the table reports. The committed results keep ``metrics.jsonl`` in
one ``runs.tar.xz`` per results folder (``benchmarks/sweep.py``); the table must not depend on
where they are.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from benchmark_scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def table3():
    return load_benchmark("fedgo_table3")


def _run(results: Path, name: str, final: float, server_s: list[float], extra: dict) -> None:
    run = results / name
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"final_accuracy": final, "best_accuracy": final}))
    rows = [{"round": 0, "test_accuracy": 0.1}]
    rows += [{"round": i + 1, "aggregate_time": t, **extra} for i, t in enumerate(server_s)]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_table_reports_means_per_seed_ratios_and_separation(table3, tmp_path: Path) -> None:
    ens = {"ensemble_test_accuracy": 0.40, "init_test_accuracy": 0.30, "pl_acc_oracle": 0.7}
    for seed, (feddf_s, fedgo_s) in enumerate([(20.0, 20.0), (20.0, 60.0), (10.0, 12.0)]):
        _run(tmp_path, f"feddf-seed{seed}", 0.30 + 0.01 * seed, [feddf_s, feddf_s], ens)
        # ensemble_eval_time is diagnostics, not server work: it must be left out
        extra = {**ens, "ensemble_eval_time": 5.0, "pl_acc_fedgo": 0.2 + 0.1 * seed}
        _run(tmp_path, f"fedgo-seed{seed}", 0.33, [fedgo_s + 5.0, fedgo_s + 5.0], extra)
    sep = {
        "auc_own_vs_unseen": {"mean": 0.6, "min": 0.5, "max": 0.7, "clients": 20},
        "weight_on_knowing_clients_pct": {
            "data_size": 50.0,
            "fedgo_double_sigmoid": 51.0,
            "fedgo_single_sigmoid": 57.0,
            "oracle": 100.0,
        },
        "mean_sigmoid": 0.8,
        "share_sigmoid_above_0.99": 0.25,
    }
    (tmp_path / "fedgo-seed1" / "separation.json").write_text(json.dumps(sep))

    text = table3.table(tmp_path).splitlines()
    main_table = text[: text.index("")]  # the first table: one row per method
    row = {line.split(" | ")[0].strip("| "): line for line in main_table[2:]}
    assert "| feddf | 3 | 31.0 ± 1.0 |" in row["feddf"]
    # median of 20, 60 and 12 s: the seed that shared the cores does not count
    assert row["fedgo"].endswith("| 20.00 |")
    assert "| 40.0 ± 0.0 | 30.0 ± 0.0 |" in row["fedgo"]
    # Mean pseudo-label accuracy over seeds 0.2, 0.3, 0.4, in the FedGO runs' column (FedDF
    # runs have no discriminators, so no FedGO weighting of their own client models).
    assert "| weighting | feddf | fedgo |" in text
    assert "| fedgo | - | 30.0 ± 10.0 |" in text
    assert "| oracle | 70.0 ± 0.0 | 70.0 ± 0.0 |" in text
    # paired against FedDF: 33 - 30, 33 - 31, 33 - 32 = +3, +2, +1 points; sd 1, half-width
    # t(0.975, 2) 4.303 / sqrt(3) = 2.48: [-0.5, +4.5], an interval that holds 0
    assert "| fedgo | +2.0 [-0.5, +4.5] p=0.074 (n=3) |" in text
    start = text.index("| method | minus feddf |")
    section = text[start : text.index("", start)]
    assert [line.split(" | ")[0] for line in section[2:]] == ["| fedgo"]  # not feddf itself
    assert any("minus feddf's" in line and "not for claims" in line for line in text)
    ratio = next(line for line in text if line.startswith("FedGO / FedDF"))
    # geometric mean of 1, 3, 1.2 (exp of the mean log 0.4270) with its log-scale t interval,
    # exp(0.4270 -+ 4.3027 x 0.5888 / sqrt(3)); the median beside it
    assert ratio.endswith(
        "seed0 1.00, seed1 3.00, seed2 1.20 (geometric mean 1.53x [0.36, 6.62] (n=3); median 1.20)"
    )
    assert "| seed1 | 0.600 (0.500-0.700) | 50.0 | 51.0 | 57.0 | 100.0 | 0.800 | 25.0% |" in text


def test_table_without_separation_reports_has_no_separation_section(table3, tmp_path: Path) -> None:
    _run(tmp_path, "fedavg-seed0", 0.3, [0.01], {})
    text = table3.table(tmp_path)
    assert "| fedavg | 1 | 30.0 ± 0.0 |" in text
    assert "discriminators" not in text


def test_table_reads_metrics_from_the_archive_as_from_loose_files(table3, tmp_path: Path) -> None:
    ens = {"ensemble_test_accuracy": 0.40, "init_test_accuracy": 0.30, "pl_acc_uniform": 0.5}
    for seed in (0, 1):
        _run(tmp_path, f"feddf-seed{seed}", 0.3 + 0.02 * seed, [20.0, 22.0], ens)
        _run(tmp_path, f"fedavg-seed{seed}", 0.3, [0.01], {})
    loose = table3.table(tmp_path)
    sweep = load_benchmark("sweep")
    files = {}
    for path in sorted(tmp_path.glob("*/metrics.jsonl")):
        files[f"{path.parent.name}/metrics.jsonl"] = path.read_bytes()
        path.unlink()
    sweep.write_archive(tmp_path / sweep.ARCHIVE, files)
    assert table3.table(tmp_path) == loose
    assert "| feddf | 2 | 31.0 ± 1.4 |" in loose


def test_byzantine_rows_put_each_liar_count_beside_its_clean_run(table3, tmp_path: Path) -> None:
    pl = {"pl_acc_uniform": 0.3, "pl_acc_data_size": 0.28, "pl_acc_fedgo_sigmoid": 0.2}
    for seed in (0, 1):
        _run(tmp_path, f"fedgo-seed{seed}", 0.30, [1.0], {**pl, "pl_acc_fedgo": 0.29})
        # own weights 0.25 then 0.35 over the two rounds: the run's mean is 0.30
        run = tmp_path / f"fedgo_byz50-seed{seed}"
        _run(tmp_path, run.name, 0.20 + 0.1 * seed, [1.0, 1.0], pl)
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        rows[1]["pl_acc_fedgo"], rows[2]["pl_acc_fedgo"] = 0.25, 0.35
        (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    text = table3.table(tmp_path).splitlines()
    byz = [line for line in text if line.startswith("| FedGO at CPU scale")]
    assert byz == [
        "| FedGO at CPU scale (double sigmoid, no defence) | 0 | 2 | 30.0 ± 0.0 | 29.0 ± 0.0 "
        "| 30.0 ± 0.0 | 28.0 ± 0.0 | 20.0 ± 0.0 |",
        "| FedGO at CPU scale (double sigmoid, no defence) | 10 | 2 | 25.0 ± 7.1 | 30.0 ± 0.0 "
        "| 30.0 ± 0.0 | 28.0 ± 0.0 | 20.0 ± 0.0 |",
    ]
    # No liars' run: no Byzantine section.
    for seed in (0, 1):
        for f in (tmp_path / f"fedgo_byz50-seed{seed}").iterdir():
            f.unlink()
        (tmp_path / f"fedgo_byz50-seed{seed}").rmdir()
    assert not any("Byzantine" in line for line in table3.table(tmp_path).splitlines())


def test_every_weighted_method_names_its_weighting(table3) -> None:
    """The benchmark config sets FedGO's weighting; a method of another strategy that weights
    its ensemble must name its own, or it silently runs FedGO's (DaFKD's first seed-0 run did)."""
    import dataclasses

    from strategies import strategy_class

    for method, overrides in table3.METHODS.items():
        name = next(o.split("=", 1)[1] for o in overrides if o.startswith("strategy.name="))
        config = strategy_class(name).Config
        if any(f.name == "weighting" for f in dataclasses.fields(config)):
            assert any(o.startswith("strategy.weighting=") for o in overrides), method
    assert "strategy.weighting=domain" in table3.METHODS["dafkd"]


def _config(results: Path, name: str, **strategy) -> None:
    """A kept ``config.yaml`` of run ``name`` (its seed and folder in it, as runs write them)."""
    seed = int(name.rsplit("seed", 1)[1])
    config = {
        "seed": seed,
        "output_dir": f"outputs/bench/t/{name}",
        "eval": {"batch_size": 1000},
        "strategy": {"name": "feddf", "weighting": "uniform", **strategy},
    }
    (results / name / "config.yaml").write_text(yaml.safe_dump(config))


def test_runs_whose_configs_differ_beyond_the_seed_are_not_pooled(table3, tmp_path: Path) -> None:
    """Never pool unlike runs: seed 2's distillation epochs differ, so it is a row of its own
    and the note names the key with both values; its own seed in a path, and a key one run
    lacks while the other has it at its default, do not split."""

    def config(seed: int, **strategy) -> None:
        path = f"outputs/bench/t/feddf-seed{seed}/generator.pt"
        _config(tmp_path, f"feddf-seed{seed}", path=path, **strategy)

    for seed, final in enumerate((0.30, 0.31, 0.40)):
        _run(tmp_path, f"feddf-seed{seed}", final, [1.0], {})
        distill = {"epochs": 3 if seed == 2 else 2}
        if seed != 1:  # seed 1's config predates bn_stats: read as its default, auto
            distill["bn_stats"] = "auto"
        config(seed, distill=distill)
    text = table3.table(tmp_path).splitlines()
    main_table = text[: text.index("")]
    assert [line.split(" | ")[:2] for line in main_table[2:]] == [
        ["| feddf", "2"],
        ["| feddf [seed2]", "1"],
    ]
    assert main_table[2].startswith("| feddf | 2 | 30.5 ± 0.7 |")
    assert main_table[3].startswith("| feddf [seed2] | 1 | 40.0 ± 0.0 |")
    note = "- feddf [seed2] vs feddf (seed0, seed1): "
    assert f"{note}strategy.distill.epochs: 3 vs 2" in text

    # A key that one run lacks and that has no default (a removed parameter) splits too.
    config(2, distill={"epochs": 2}, entropy_temperature=1.0)
    assert f"{note}strategy.entropy_temperature: 1.0 vs absent" in table3.table(tmp_path)
    # Like configs: one row, no note.
    config(2, distill={"epochs": 2})
    text = table3.table(tmp_path)
    assert "| feddf | 3 | 33.7 ± 5.5 |" in text
    assert "not pooled" not in text and "[seed" not in text


def test_an_unreadable_kept_config_is_one_error_naming_it(table3, tmp_path: Path) -> None:
    _run(tmp_path, "feddf-seed0", 0.3, [1.0], {})
    (tmp_path / "feddf-seed0" / "config.yaml").write_text("- a list, not a mapping\n")
    with pytest.raises(ValueError, match=r"^feddf-seed0/config.yaml: not a mapping of keys$"):
        table3.table(tmp_path)
