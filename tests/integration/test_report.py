"""What a user sees of finished runs: traffic and rounds-to-target in the records, the report."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import numpy as np
import pytest
from helpers import SMALL_GAN, TINY_RUN
from PIL import Image

from fedgo_app.inprocess import run_inprocess
from fedgo_flwr.records.report import main as report_main
from strategies import load_experiment

ROOT = Path(__file__).resolve().parents[2]
TINY = [*TINY_RUN, "rounds=2"]


def run(out: Path, *overrides: str, conf: str = "default.yaml") -> list[dict]:
    cfg = load_experiment(ROOT / "conf" / conf, [*TINY, f"output_dir={out}", *overrides])
    run_inprocess(cfg)
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def model_bytes(out: Path) -> int:
    import torch

    state = torch.load(out / "model.pt")
    return sum(v.numel() * v.element_size() for v in state.values())


def test_rounds_record_the_bytes_each_way(tmp_path):
    fedavg = run(tmp_path / "fedavg")
    size = model_bytes(tmp_path / "fedavg")
    assert fedavg[0]["bytes_down"] == fedavg[0]["bytes_up"] == 0  # nothing before round 1
    for row in fedavg[1:]:
        # two clients a round, the model each way (plus each array's small header)
        assert 2 * size <= row["bytes_down"] < 2 * size * 1.05
        assert row["bytes_up"] == row["bytes_down"]
    scaffold = run(tmp_path / "scaffold", "strategy.name=scaffold")
    assert scaffold[1]["bytes_down"] > 1.9 * fedavg[1]["bytes_down"]  # control variates too
    summary = json.loads((tmp_path / "fedavg" / "summary.json").read_text())
    assert summary["bytes_down"] == sum(r["bytes_down"] for r in fedavg)


def test_the_pre_fl_stage_is_round_zeros_traffic(tmp_path):
    rows = run(
        tmp_path,
        "strategy.generator.steps=5",
        "strategy.discriminator.epochs=1",
        "strategy.distill.epochs=1",
        *SMALL_GAN,
        conf="fedgo.yaml",
    )
    assert rows[0]["bytes_down"] > 0 and rows[0]["bytes_up"] > 0  # generator down, discs up


def test_summary_reports_the_rounds_to_the_target(tmp_path):
    rows = run(tmp_path / "a", "eval.target_accuracy=0.01")
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["rounds_to_target"] == 1 and summary["target_accuracy"] == 0.01
    run(tmp_path / "b", "eval.target_accuracy=1.0")
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["rounds_to_target"] is None
    assert rows[1]["round"] == 1


def image_ok(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        pixels = np.asarray(im.convert("RGB"))
    assert pixels.shape[0] > 200 and pixels.shape[1] > 200
    assert pixels.std() > 10  # drawn on, not a blank canvas
    return pixels


def test_report_of_several_strategies_and_seeds(tmp_path, capsys):
    runs = tmp_path / "runs"
    for seed in (0, 1):
        run(runs / f"fedavg-seed{seed}", f"seed={seed}")
        run(
            runs / f"feddf-seed{seed}",
            f"seed={seed}",
            "strategy.distill.epochs=1",
            conf="feddf.yaml",
        )
    out = tmp_path / "report"
    assert report_main([str(runs), "--out", str(out), "--target", "0.05"]) == 0
    assert {p.name for p in out.iterdir()} >= {
        "accuracy.png",
        "metrics.csv",
        "table.md",
        "table.csv",
        "partition-fedavg-seed0.png",
    }
    image_ok(out / "accuracy.png")
    image_ok(out / "partition-fedavg-seed0.png")
    with open(out / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 4 * 3 and {r["label"] for r in rows} == {"fedavg", "feddf"}
    table = {r["label"]: r for r in csv.DictReader(open(out / "table.csv"))}
    finals = [
        json.loads((runs / f"fedavg-seed{s}" / "summary.json").read_text())["final_accuracy"]
        for s in (0, 1)
    ]
    assert float(table["fedavg"]["final_mean"]) == pytest.approx(statistics.fmean(finals))
    assert float(table["fedavg"]["final_sd"]) == pytest.approx(statistics.stdev(finals))
    assert table["feddf"]["n"] == "2" and table["feddf"]["reached"] == "2"
    assert table["fedavg"]["seeds"] == "0 1" and table["fedavg"]["wall_s_from"] == "total_time"
    walls = [
        json.loads((runs / f"fedavg-seed{s}" / "summary.json").read_text())["total_time"]
        for s in (0, 1)
    ]
    assert float(table["fedavg"]["wall_s_mean"]) == pytest.approx(statistics.fmean(walls))
    env = json.loads((runs / "fedavg-seed0" / "env.json").read_text())
    assert table["fedavg"]["config_fingerprint"] == env["config_fingerprint"]
    assert table["fedavg"]["commits"].startswith((env["git"]["commit"] or "no git")[:10])
    text = (out / "table.md").read_text()
    assert "| fedavg | 2 | 0, 1 |" in text and "rounds to 5%" in text
    assert "## Provenance" in text and "## Not averaged together" not in text
    assert str(out / "accuracy.png") in capsys.readouterr().out


def test_report_names_a_folder_that_holds_no_runs(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert report_main([str(tmp_path / "empty")]) == 2
    assert "neither a run folder nor a folder of runs" in capsys.readouterr().err


# -- runs and report folders someone else wrote into (issue 49) -------------------------------

REPORT_FILES = ("accuracy.png", "metrics.csv", "table.md", "table.csv", "partition-a-seed0.png")


def fake_run(folder: Path, **files: str) -> Path:
    """A run folder written by hand: two rounds, a 2 x 2 partition; ``files`` replace any."""
    folder.mkdir(parents=True)
    rows = [{"round": r, "test_accuracy": 0.1 * r, "elapsed": float(r)} for r in (0, 1)]
    defaults = {
        "metrics.jsonl": "".join(json.dumps(r) + "\n" for r in rows),
        "summary.json": json.dumps({"strategy": "fedavg", "final_accuracy": 0.1}),
        "partition.json": json.dumps({"class_histogram": [[3, 1], [0, 4]]}),
        "config.yaml": "seed: 0\nstrategy: {name: fedavg}\n",
    }
    for name, text in {**defaults, **files}.items():
        (folder / name.replace("_", ".")).write_text(text)
    return folder


def test_the_report_replaces_a_planted_link_and_never_writes_through_it(tmp_path, capsys):
    """A link at any output name in --out is replaced by the file; its target keeps its bytes."""
    run_dir = fake_run(tmp_path / "runs" / "a-seed0")
    out, victims = tmp_path / "report", tmp_path / "victims"
    out.mkdir()
    victims.mkdir()
    for name in REPORT_FILES:
        (victims / name).write_text(f"precious {name}\n")
        (out / name).symlink_to(victims / name)
    assert report_main([str(run_dir), "--out", str(out)]) == 0
    for name in REPORT_FILES:
        assert (victims / name).read_text() == f"precious {name}\n"
        assert (out / name).is_file() and not (out / name).is_symlink()
    assert "| a | 1 | 0 | 10.0 | 10.0 | 10.0 (last 1) |" in (out / "table.md").read_text()
    image_ok(out / "accuracy.png")
    assert sorted(p.name for p in out.iterdir()) == sorted(REPORT_FILES)  # no temp file left
    assert str(out / "table.md") in capsys.readouterr().out


@pytest.mark.parametrize(
    ("file", "text", "problem"),
    [
        ("summary.json", "[1, 2]", "summary.json: a JSON array, not an object"),
        ("summary.json", '"done"', "summary.json: a JSON string, not an object"),
        ("summary.json", "{bad", "summary.json: not JSON"),
        ("metrics.jsonl", '{"round": 0}\n[1]\n', "metrics.jsonl:2: a JSON array, not an object"),
        ("metrics.jsonl", '"x"\n', "metrics.jsonl:1: a JSON string, not an object"),
        ("metrics.jsonl", '{"test_accuracy": 0.5}\n', "metrics.jsonl:1: no integer 'round'"),
        ("metrics.jsonl", '{"round": "1"}\n', "metrics.jsonl:1: no integer 'round'"),
        ("partition.json", "[]", "partition.json: a JSON array, not an object"),
        ("partition.json", '{"class_histogram": [[1], [1, 2]]}', "not a table of numbers"),
        ("partition.json", '{"class_histogram": [["a"]]}', "not a table of numbers"),
        ("config.yaml", "- a\n- b\n", "config.yaml: a YAML array, not a mapping"),
        ("config.yaml", "a: [\n", "config.yaml:2: not YAML"),
        ("config.yaml", "seed: abc\n", "config.yaml: seed 'abc' is not an integer"),
        ("config.yaml", "strategy: fedavg\nseed: 0\n", None),  # no mapping: the name is "?"
        ("env.json", "[]", "env.json: a JSON array, not an object"),
        ("env.json", "{bad", "env.json: not JSON"),
        ("env.json", '{"git": "x", "packages": [1]}', None),  # shown as unknown
    ],
)
def test_a_bad_run_file_is_one_error_naming_it(tmp_path, capsys, file, text, problem):
    """Exit 2 and one line naming the file (and line), no traceback, nothing written."""
    good = fake_run(tmp_path / "runs" / "a-seed0")
    fake_run(tmp_path / "runs" / "b-seed0", **{file.replace(".", "_"): text})
    out = tmp_path / "report"
    code = report_main([str(good.parent), "--out", str(out)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if problem is None:
        assert code == 0
        return
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert str(tmp_path / "runs" / "b-seed0" / file) in err and problem in err
    assert not out.exists()


def test_an_output_that_cannot_be_written_is_one_line(tmp_path, capsys):
    """A run folder named with 250 bytes makes partition-<run>.png too long a file name."""
    run_dir = fake_run(tmp_path / ("r" * 250))
    assert report_main([str(run_dir), "--out", str(tmp_path / "report")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("fedgo-flwr report: ") and "too long" in err


def test_report_of_one_experiment_run_with_other_rounds_and_a_seed_again(tmp_path, capsys):
    """``outputs/default`` as a user leaves it: two seeds of 2 rounds, one run of 1 round, and
    seed 0 of 2 rounds run again. Two rows, named by the key that differs; seed 0 counted
    once (the newer run); the 1-round row one seed without an interval."""
    parent = tmp_path / "outputs" / "default"
    stamps = [f"2026-01-01_00-00-0{i}" for i in range(4)]
    finals = {}
    for stamp, overrides in zip(
        stamps, (["seed=0"], ["seed=1"], ["seed=0", "rounds=1"], ["seed=0"]), strict=True
    ):
        rows = run(parent / stamp, *overrides)
        finals[stamp] = rows[-1]["test_accuracy"]
    out = tmp_path / "report"
    assert report_main([str(parent), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    table = {r["label"]: r for r in csv.DictReader(open(out / "table.csv"))}
    assert set(table) == {"default (rounds=2)", "default (rounds=1)"}
    two, one = table["default (rounds=2)"], table["default (rounds=1)"]
    assert (two["n"], two["seeds"]) == ("2", "0 1")
    kept = [finals[stamps[3]], finals[stamps[1]]]  # seed 0's newer run, seed 1
    assert float(two["final_mean"]) == pytest.approx(statistics.fmean(kept))
    assert (one["n"], one["final_sd"], one["last_k"]) == ("1", "", "1")
    assert "(they differ in rounds)" in err
    assert f"{parent / stamps[0]}: left out: seed 0 again in 'default (rounds=2)'" in err
