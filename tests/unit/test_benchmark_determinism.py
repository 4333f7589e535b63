"""benchmarks/determinism.py: whether a pair of runs repeats, and its table."""

from __future__ import annotations

import json

import pytest

from benchmarks import determinism


def _run(folder, rows):
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_a_pair_repeats_when_only_wall_clock_keys_differ(tmp_path):
    row = {"round": 1, "test_accuracy": 0.5, "test_loss": 1.25}
    a = _run(tmp_path / "a", [{**row, "elapsed": 3}])
    b = _run(tmp_path / "b", [{**row, "round_time": 9}])
    assert determinism.compare(a, b) == {"repeats": True, "test_accuracy": 0, "test_loss": 0}


def test_a_pair_that_differs_gives_its_largest_differences(tmp_path):
    a = _run(tmp_path / "a", [{"test_accuracy": 0.5, "test_loss": 1.0}, {"test_accuracy": 0.6}])
    b = _run(tmp_path / "b", [{"test_accuracy": 0.5, "test_loss": 1.5}, {"test_accuracy": 0.4}])
    got = determinism.compare(a, b)
    assert not got["repeats"]
    assert got["test_accuracy"] == pytest.approx(0.2) and got["test_loss"] == pytest.approx(0.5)
    assert determinism.largest_difference([{}], [{}], "test_loss") is None


def test_the_warned_operations_are_read_from_pytorchs_message():
    text = (
        "UserWarning: adaptive_avg_pool2d_backward_cuda does not have a deterministic "
        "implementation, but you set 'torch.use_deterministic_algorithms(True, warn_only=True)'"
    )
    assert determinism.WARNING.findall(text) == ["adaptive_avg_pool2d_backward_cuda"]


def test_main_runs_each_setting_twice_and_writes_the_table(tmp_path, monkeypatch):
    calls = []

    def run_once(config, overrides, out):
        calls.append(overrides[-1])
        on = overrides[-1].endswith("true")
        second = out.name.endswith("2")
        acc = 0.5 if on or not second else 0.55  # off: the second run drifts
        _run(out, [{"test_accuracy": acc, "test_loss": 1.0}])
        warned = ["adaptive_avg_pool2d_backward_cuda"] if on else []
        return {"wall_s": 2.0 if on else 1.0, "final_accuracy": acc, "warned": warned}

    monkeypatch.setattr(determinism, "SCRATCH", tmp_path / "scratch")
    monkeypatch.setattr(determinism, "run_once", run_once)
    assert determinism.main(["--out", str(tmp_path / "out"), "seed=0"]) == 0
    assert calls == ["resources.deterministic=false"] * 2 + ["resources.deterministic=true"] * 2
    text = (tmp_path / "out" / "table.md").read_text()
    assert "| false | no | 0.05 | 0 | 1.0, 1.0 | - |" in text
    assert "| true | yes | 0 | 0 | 2.0, 2.0 | adaptive_avg_pool2d_backward_cuda |" in text
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["overrides"] == ["seed=0"] and summary["true"]["compare"]["repeats"]


def test_the_switch_itself_is_not_an_override(capsys):
    with pytest.raises(SystemExit):
        determinism.main(["resources.deterministic=true"])
    assert "what this compares" in capsys.readouterr().err
