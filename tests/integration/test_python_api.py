"""The Python API (``from fedgo_flwr import load_experiment, run, load_model``): the example of
docs/running.md, run as it stands, and what the API refuses."""

from __future__ import annotations

import contextlib
import io
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from helpers import TINY_RUN

import fedgo_flwr
from fedgo_flwr.learning.task import load_bundle
from fedgo_flwr.learning.training import evaluate

ROOT = Path(__file__).resolve().parents[2]


def docs_example() -> str:
    """The Python block after ``<!-- python-api-example -->`` in docs/running.md."""
    text = (ROOT / "docs" / "running.md").read_text()
    found = re.search(r"<!-- python-api-example -->\n```python\n(.*?)```", text, re.S)
    assert found is not None, "docs/running.md lost its Python API example"
    return found.group(1)


def test_the_documented_example_runs_and_its_model_is_the_runs(tmp_path, monkeypatch):
    """The example writes its run below the current folder; the model ``load_model`` returns
    scores on the run's test split exactly what the run recorded for its last round."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FEDGO_WORKDIR", raising=False)
    out = io.StringIO()
    scope: dict = {}
    with contextlib.redirect_stdout(out):
        exec(compile(docs_example(), "docs/running.md", "exec"), scope)  # noqa: S102
    result = scope["result"]
    assert result.output_dir.parent == (tmp_path / "outputs" / "default").resolve()
    lines = out.getvalue().splitlines()
    assert lines[0] == f"{result.output_dir} {result.summary['final_accuracy']}"
    rows = result.metrics()
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert lines[1] == str([r["test_accuracy"] for r in rows])
    assert lines[-1] == "torch.Size([1, 10])"

    model = fedgo_flwr.load_model(result.output_dir)
    assert not model.training
    bundle = load_bundle(result.config.data)
    _, accuracy = evaluate(model, bundle.test, result.config.eval.batch_size, torch.device("cpu"))
    assert accuracy == rows[-1]["test_accuracy"] == result.summary["final_accuracy"]


def test_the_api_refuses_bad_input_with_one_error_naming_it(tmp_path):
    with pytest.raises(fedgo_flwr.ConfigError, match=r"strategy.name = 'fedgoo': unknown"):
        fedgo_flwr.load_experiment("conf/default.yaml", {"strategy.name": "fedgoo"})
    cfg = fedgo_flwr.load_experiment(None, [*TINY_RUN, f"output_dir={tmp_path / 'run'}"])
    with pytest.raises(TypeError, match="overrides apply to a config file"):
        fedgo_flwr.run(cfg, {"rounds": 2})
    with pytest.raises(fedgo_flwr.ConfigError, match="no config.yaml: not a run folder"):
        fedgo_flwr.load_model(tmp_path)

    result = fedgo_flwr.run(cfg)
    assert result.output_dir == tmp_path / "run" and result.summary["rounds"] == 1
    broken = tmp_path / "broken"
    shutil.copytree(result.output_dir, broken)
    (broken / "model.pt").unlink()
    with pytest.raises(ValueError, match=r"model.pt: no such file \(the run has not finished\)"):
        fedgo_flwr.load_model(broken)
    shutil.copy(result.output_dir / "model.pt", broken / "model.pt")
    config = yaml.safe_load((broken / "config.yaml").read_text())
    config["model"]["name"] = "mlp"  # another architecture than the weights'
    (broken / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match=r"model.pt: does not fit model.name 'mlp'"):
        fedgo_flwr.load_model(broken)
    (broken / "model.pt").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="model file .*model.pt is unreadable"):
        fedgo_flwr.load_model(broken)
