"""The kernel switches of fedgo_flwr.runtime.kernels: channels-last (resources.channels_last),
bfloat16 autocast (resources.precision) and deterministic kernels (resources.deterministic)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord
from torch import nn

from fedgo_flwr.config.experiment import TrainConfig
from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.learning.distill import predict_views
from fedgo_flwr.learning.training import train_local
from fedgo_flwr.models.classifiers import build_model
from fedgo_flwr.runtime import kernels
from fedgo_flwr.runtime.rng import make_rng

CPU = torch.device("cpu")


@pytest.fixture
def channels_last():
    kernels.use_channels_last(True)
    yield
    kernels.use_channels_last(False)


@pytest.fixture
def bf16():
    kernels.use_precision("bf16")
    yield
    kernels.use_precision("fp32")


def _images(n: int = 40) -> ArrayDataset:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(n, 3, 16, 16), dtype=np.uint8)
    return ArrayDataset(x=x, y=rng.integers(0, 4, size=n), num_classes=4, flip=True)


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return build_model("cnn_bn", (3, 16, 16), 4)


def _train(model: nn.Module) -> dict[str, torch.Tensor]:
    cfg = TrainConfig(local_epochs=2, batch_size=8, lr=0.05)
    train_local(model, _images(), cfg, rng=make_rng(0, 1, 2), device=CPU)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_place_formats_convolutions_only(channels_last):
    cnn = kernels.place(_cnn(), CPU)
    conv = next(p for p in cnn.parameters() if p.dim() == 4)
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    mlp = kernels.place(nn.Sequential(nn.Linear(3, 2)), CPU)
    assert all(p.is_contiguous() for p in mlp.parameters())
    kernels.use_channels_last(False)
    kernels.place(cnn, CPU)  # back to the default format when the switch is off
    assert all(p.is_contiguous() for p in cnn.parameters())


def test_channels_last_training_is_deterministic_and_close_to_nchw(channels_last):
    a, b = _train(_cnn()), _train(_cnn())
    for key in a:  # the same seed gives the same bits
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
    kernels.use_channels_last(False)
    ref = _train(_cnn())
    for key in a:  # the default format's numbers, up to float rounding
        torch.testing.assert_close(a[key], ref[key], rtol=1e-4, atol=1e-4)


def test_a_channels_last_model_travels_like_any_other(channels_last):
    model = _cnn()
    _train(model)
    data = _images(10)
    logits = predict_views(model, data, 2, 4, CPU)
    received = ArrayRecord(model.state_dict()).to_torch_state_dict()
    kernels.use_channels_last(False)
    other = _cnn()
    other.load_state_dict(received)
    torch.testing.assert_close(predict_views(other, data, 2, 4, CPU), logits, rtol=1e-5, atol=1e-5)
    assert all(v.is_contiguous() for v in received.values())


def test_a_run_with_channels_last_is_deterministic(tmp_path, channels_last):
    from fedgo_app.inprocess import run_inprocess
    from strategies import load_experiment

    runs = []
    for name in ("a", "b"):
        kernels.use_channels_last(False)  # the run turns it on from its config
        cfg = load_experiment(
            str(Path(__file__).resolve().parents[2] / "conf/default.yaml"),
            [
                "rounds=2",
                "data.num_clients=4",
                "fraction=0.5",
                "train.local_epochs=1",
                "model.name=cnn_bn",
                "resources.channels_last=true",
                f"output_dir={tmp_path / name}",
            ],
        )
        runs.append(run_inprocess(cfg)["final_accuracy"])
        assert kernels.channels_last()
    assert runs[0] == runs[1]


# -- resources.precision: bf16 -------------------------------------------------------------------


def test_autocast_is_no_context_in_fp32_and_bfloat16_autocast_in_bf16():
    linear = nn.Linear(4, 3)
    x = torch.ones(2, 4)
    assert kernels.precision() == "fp32"
    with kernels.autocast(CPU):
        assert linear(x).dtype == torch.float32 and not torch.is_autocast_enabled("cpu")
    kernels.use_precision("bf16")
    try:
        with kernels.autocast(CPU):
            assert linear(x).dtype == torch.bfloat16
        assert linear(x).dtype == torch.float32  # only inside the context
    finally:
        kernels.use_precision("fp32")
    with pytest.raises(ValueError, match="fp32, bf16"):
        kernels.use_precision("fp16")


def test_bf16_training_runs_its_passes_in_bfloat16_and_keeps_float32_weights(bf16):
    seen = []
    cfg = TrainConfig(local_epochs=1, batch_size=8, lr=0.05)
    model = _cnn()
    train_local(
        model,
        _images(),
        cfg,
        rng=make_rng(0, 1, 2),
        device=CPU,
        batch_loss=lambda b: seen.append(b.logits.dtype) or b.logits.new_zeros(()),
    )
    assert seen and set(seen) == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in model.parameters())
    a, b = _train(_cnn()), _train(_cnn())
    for key in a:  # deterministic per seed
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
    kernels.use_precision("fp32")
    ref = _train(_cnn())
    floats = [k for k in a if a[k].is_floating_point()]
    assert any(not torch.equal(a[k], ref[k]) for k in floats)  # not float32's run
    for key in floats:  # but close to it: bfloat16 keeps 8 bits of mantissa
        torch.testing.assert_close(a[key], ref[key], rtol=0.05, atol=0.05)


def test_bf16_logits_come_back_as_float32_close_to_fp32(bf16):
    model, data = _cnn(), _images(10)
    low = predict_views(model, data, 2, 4, CPU)
    kernels.use_precision("fp32")
    full = predict_views(model, data, 2, 4, CPU)
    assert low.dtype == full.dtype == torch.float32 and not torch.equal(low, full)
    torch.testing.assert_close(low, full, rtol=0.02, atol=0.02 * full.abs().max().item())


def test_a_run_with_bf16_is_deterministic_and_set_from_its_config(tmp_path):
    """FedDF (local training, teacher logits, distillation, evaluation) with
    ``resources.precision: bf16``: the run turns it on, a second run gives the same metrics, and
    a float32 run turns it off again and gives others."""
    from helpers import rows_of, tiny_config, without_timing

    from fedgo_app.inprocess import run_inprocess

    runs = {}
    try:
        for name, extra in (("a", "bf16"), ("a-again", "bf16"), ("b", "fp32")):
            out = tmp_path / name
            feddf = ["strategy.name=feddf", "strategy.distill.epochs=1"]
            run_inprocess(tiny_config(out, *feddf, f"resources.precision={extra}"))
            assert kernels.precision() == extra
            runs[name] = without_timing(rows_of(out))
    finally:
        kernels.use_precision("fp32")
    assert runs["a"] == runs["a-again"] != runs["b"]


# -- resources.deterministic --------------------------------------------------------------------


@pytest.fixture
def cudnn_flags():
    saved = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    yield
    kernels.use_deterministic(False)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved


def test_deterministic_sets_torch_cudnn_and_cublas_and_off_undoes_them(monkeypatch, cudnn_flags):
    """On: deterministic algorithms in warn-only mode (an operation without a deterministic
    kernel warns and runs), cuDNN's deterministic convolutions without autotuning, and cuBLAS's
    fixed workspace unless the user set one; off: torch's defaults again."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    torch.backends.cudnn.benchmark = True
    kernels.use_deterministic(True)
    assert kernels.deterministic() and torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    kernels.use_deterministic(False)
    assert not kernels.deterministic() and not torch.backends.cudnn.deterministic
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the user's own choice stays
    kernels.use_deterministic(True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"


def test_deterministic_off_in_a_fresh_process_imports_no_dynamo():
    """Off, the default, in a process that never turned it on (the ServerApp's, a Ray
    worker's, a deployment's ClientApp process) leaves TorchDynamo unimported: importing it,
    which ``torch.use_deterministic_algorithms`` does, costs seconds in each such process."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from fedgo_flwr.runtime import kernels\n"
        "kernels.use_deterministic(False)\n"
        "assert not kernels.deterministic()\n"
        "loaded = ('torch._dynamo', 'torch._inductor.config')\n"
        "print(sorted(m for m in loaded if m in sys.modules))\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("TORCHINDUCTOR_DETERMINISTIC", None)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_deterministic_off_undoes_inductors_setting_once_its_config_is_loaded(cudnn_flags):
    """With Inductor's config imported (a process that ran torch.compile or turned the switch
    on), off turns its ``deterministic`` off too, as torch's own switch does."""
    import torch._inductor.config as inductor_config

    kernels.use_deterministic(True)
    assert inductor_config.deterministic
    kernels.use_deterministic(False)
    assert not inductor_config.deterministic and not kernels.deterministic()
    inductor_config.deterministic = True  # set by hand, torch's switch off
    kernels.use_deterministic(False)
    assert not inductor_config.deterministic


def test_a_run_with_deterministic_kernels_sets_them_and_on_a_cpu_changes_no_number(
    tmp_path, cudnn_flags
):
    """``resources.deterministic: true`` turns the kernels on for the run (a later run without
    it turns them off), and on a CPU, where this project's kernels are deterministic already,
    the metrics equal those of the same run without it."""
    from helpers import rows_of, tiny_config, without_timing

    from fedgo_app.inprocess import run_inprocess

    runs = {}
    for name, on in (("on", "true"), ("off", "false")):
        out = tmp_path / name
        feddf = ["strategy.name=feddf", "strategy.distill.epochs=1", "model.name=cnn_bn"]
        run_inprocess(tiny_config(out, *feddf, f"resources.deterministic={on}"))
        assert kernels.deterministic() == (on == "true")
        runs[name] = without_timing(rows_of(out))
    assert runs["on"] == runs["off"]


def test_the_data_free_path_with_deterministic_kernels_changes_no_number_on_a_cpu(
    tmp_path, cudnn_flags
):
    """Co-Boosting + FedGO (generator synthesis with transposed convolutions and upsampling,
    the discriminators, the weight steps) with ``resources.deterministic`` on and off: the same
    metrics on a CPU, and no operation warned of as lacking a deterministic kernel."""
    import warnings

    from helpers import ONESHOT_TINY, rows_of, without_timing

    from fedgo_app.inprocess import run_inprocess
    from strategies import load_experiment

    conf = Path(__file__).resolve().parents[2] / "conf/coboosting.yaml"
    runs = {}
    for on in ("true", "false"):
        out = tmp_path / on
        overrides = ["strategy.name=coboosting_fedgo", f"resources.deterministic={on}"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run_inprocess(load_experiment(conf, [*ONESHOT_TINY, *overrides, f"output_dir={out}"]))
        assert not [w for w in caught if "deterministic implementation" in str(w.message)]
        runs[on] = without_timing(rows_of(out))
    assert runs["true"] == runs["false"]
