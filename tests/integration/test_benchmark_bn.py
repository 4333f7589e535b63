"""``benchmarks/bn_recalibration.py``: re-estimated BatchNorm statistics, on a finished run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from benchmark_scripts import load_benchmark

from fedgo_app.inprocess import run_inprocess
from fedgo_flwr.models.classifiers import build_model
from strategies import load_experiment

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bn():
    return load_benchmark("bn_recalibration")


def test_statistics_become_those_of_the_images(bn):
    torch.manual_seed(0)
    model = build_model("cnn_bn", (1, 8, 8), 10)
    images = torch.randn(300, 1, 8, 8) * 3 + 2
    first = next(m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    conv = next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d))
    bn.recalibrated(model, images, batch_size=100)
    assert not model.training
    with torch.no_grad():
        out = conv(images)  # the first BatchNorm layer's input
    torch.testing.assert_close(first.running_mean, out.mean(dim=(0, 2, 3)), rtol=1e-4, atol=1e-4)


def test_a_model_without_batchnorm_is_refused(bn):
    with pytest.raises(ValueError, match="no BatchNorm"):
        bn.recalibrated(build_model("cnn", (1, 8, 8), 10), torch.zeros(2, 1, 8, 8))


def test_on_a_finished_run(bn, tmp_path):
    cfg = load_experiment(
        ROOT / "conf/default.yaml",
        ["rounds=1", "data.num_clients=4", "model.name=cnn_bn", f"output_dir={tmp_path}"],
    )
    run_inprocess(cfg)
    result = bn.main([str(tmp_path), "--images", "50"])
    assert result["images"] == 50
    assert 0 <= result["as_saved"] <= 1 and 0 <= result["recalibrated"] <= 1
    final = json.loads((tmp_path / "summary.json").read_text())["final_accuracy"]
    assert np.isclose(result["as_saved"], final)  # the saved model is the run's final one
