"""Strict JSON everywhere: no ``NaN``/``Infinity`` in what the project writes
(:func:`fedgo_flwr.runtime.fileio.strict_json`), a WARNING naming what was written ``null``."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import rows_of
from test_tampered_replies import FEDGO, config, set_metric, tamper

from fedgo_app.inprocess import run_inprocess
from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.protocol.fedgo import DISCRIMINATOR_MESSAGE
from fedgo_flwr.records.recorder import json_line
from fedgo_flwr.runtime.fileio import NAMED_PATHS, strict_json

NOTE = "non-finite values written as null"


def strict_loads(text: str):
    """``json.loads`` that refuses ``NaN``, ``Infinity`` and ``-Infinity`` (not JSON)."""

    def refuse(name: str):
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def notes(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and NOTE in r.getMessage()
    ]


def assert_strict_files(folder: Path) -> list[Path]:
    """Every ``*.json`` and ``*.jsonl`` file under ``folder`` parses as strict JSON."""
    files = sorted([*folder.rglob("*.json"), *folder.rglob("*.jsonl")])
    for path in files:
        text = path.read_text()
        if path.suffix == ".jsonl":
            for line in text.splitlines():
                strict_loads(line)
        else:
            strict_loads(text)
    return files


# -- the helper ---------------------------------------------------------------------------------
def test_non_finite_values_become_null_and_one_warning_names_their_paths(flwr_log):
    doc = {
        "a": 1.5,
        "n": np.int64(3),
        "ok": np.float32(0.25),
        "b": [1, float("nan"), np.float32(np.inf), (2.0, -math.inf)],
        "c": {"d": np.float64(-np.inf), "e": np.array(np.nan), "f": {"g": [None, "x", True]}},
        3: float("inf"),
    }
    text = strict_json(doc, name="doc.json", indent=2)
    assert strict_loads(text) == {
        "a": 1.5,
        "n": 3,
        "ok": 0.25,
        "b": [1, None, None, [2.0, None]],
        "c": {"d": None, "e": None, "f": {"g": [None, "x", True]}},
        "3": None,
    }
    [note] = notes(flwr_log)
    assert note == f"doc.json: {NOTE} at b.1, b.2, b.3.1, c.d, c.e, 3"


def test_a_finite_document_is_written_as_json_dumps_writes_it(flwr_log):
    doc = {
        "z": 1,
        "a": [0.1, 1e-300, 2.5e300, -0.0],
        "s": "ä\n",
        "t": (1, 2),
        "f32": np.float32(0.1),
        "i64": np.int64(7),
        "nested": {"k": [{"x": None, "y": False}]},
    }
    for kwargs in (
        {"indent": 2, "default": float},
        {"indent": 1, "default": float, "sort_keys": True},
        {"separators": (",", ":"), "default": float},
    ):
        assert strict_json(doc, **kwargs) == json.dumps(doc, **kwargs)
    plain = {k: v for k, v in doc.items() if k not in ("f32", "i64")}
    assert strict_json(plain) == json.dumps(plain)
    assert notes(flwr_log) == []


def test_default_results_are_checked_too(flwr_log):
    doc = {"t": torch.tensor(float("inf")), "u": torch.tensor(2.0)}
    assert strict_loads(strict_json(doc, name="t.json", default=float)) == {"t": None, "u": 2.0}
    assert notes(flwr_log) == [f"t.json: {NOTE} at t"]


def test_what_json_cannot_write_still_raises():
    with pytest.raises(TypeError):
        strict_json({"s": {1, 2}})
    with pytest.raises(TypeError):
        strict_json({"a": np.zeros(2)})


def test_a_top_level_non_finite_float_and_many_paths(flwr_log):
    assert strict_json(float("nan"), name="x") == "null"
    assert notes(flwr_log) == [f"x: {NOTE} at (the top level)"]
    flwr_log.clear()
    many = [math.inf] * (NAMED_PATHS + 3)
    assert strict_loads(strict_json(many, name="many")) == [None] * len(many)
    [note] = notes(flwr_log)
    assert note.endswith(f"at {', '.join(str(i) for i in range(NAMED_PATHS))} and 3 more")


def test_nan_as_missing_is_quiet_but_an_infinity_warns(flwr_log):
    doc = {"test_accuracy": math.nan, "train_loss": math.inf}
    text = strict_json(doc, name="rows", nan_is_missing=True)
    assert text == '{"test_accuracy": null, "train_loss": null}'
    assert notes(flwr_log) == [f"rows: {NOTE} at train_loss"]


def test_metrics_lines_write_null_and_warn_only_for_infinities(flwr_log):
    line = json_line({"round": 3, "test_accuracy": math.nan, "train_loss": -math.inf})
    assert line == '{"round": 3, "test_accuracy": null, "train_loss": null}\n'
    assert notes(flwr_log) == [f"metrics.jsonl round 3: {NOTE} at train_loss"]


def test_the_messages_config_json_is_strict(tmp_path):
    cfg = config(tmp_path)
    assert ExperimentConfig.from_json(cfg.to_json()).to_json() == cfg.to_json()
    cfg.train.lr = math.nan  # past the checks: the server would send it
    with pytest.raises(ValueError, match="not JSON compliant"):
        cfg.to_json()


# -- runs ---------------------------------------------------------------------------------------
def test_an_infinite_discriminator_metric_leaves_prefl_json_strict(tmp_path, monkeypatch, flwr_log):
    tamper(
        monkeypatch,
        set_metric("disc_loss", math.inf),
        pid=2,
        message_type=DISCRIMINATOR_MESSAGE,
        server_round=0,
    )
    run_inprocess(config(tmp_path, *FEDGO))
    prefl = strict_loads((tmp_path / "prefl.json").read_text())
    # The intake refuses a metric that is no finite number: the reply is dropped, named, and
    # nothing non-finite reaches the file.
    assert "2" not in prefl["discriminators"] and prefl["missing_discriminators"] == [2]
    dropped = [r.getMessage() for r in flwr_log.records if "client 2 (node 4)" in r.getMessage()]
    assert any("metric 'disc_loss'" in m for m in dropped), dropped
    assert "prefl.json" in {p.name for p in assert_strict_files(tmp_path)}


def test_every_json_file_of_a_fedavg_run_is_strict(tmp_path, flwr_log):
    """A clean run (round 1 not evaluated: its accuracy is NaN, written ``null``)."""
    run_inprocess(config(tmp_path, "strategy.name=fedavg", "rounds=2", "eval.every=2"))
    names = {p.name for p in assert_strict_files(tmp_path)}
    assert {"metrics.jsonl", "summary.json", "partition.json"} <= names
    rows = rows_of(tmp_path)
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert rows[1]["test_accuracy"] is None and rows[2]["test_accuracy"] is not None
    assert notes(flwr_log) == []  # NaN as "not evaluated" is no warning
