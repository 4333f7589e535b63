"""The configuration is resolved once per run: where it is read (``strategies.load_experiment``),
then passed down typed; the pre-flight check and the ServerApp's run take it as it is."""

from __future__ import annotations

import pytest
from helpers import ROOT, TINY_RUN, run_context, tiny_config

import strategies
from fedgo_app import inprocess, server_app
from fedgo_app.cli import preflight
from fedgo_app.client_app import app as client_app
from fedgo_app.inprocess import InProcessGrid, run_inprocess
from fedgo_flwr.config.experiment import load_config


@pytest.fixture
def builds(monkeypatch) -> list[str]:
    """The strategy of every call of ``strategies.build_params`` (what ``resolve`` runs), so a
    second ``resolve`` anywhere in the run is counted even where it would change nothing."""
    calls: list[str] = []
    real = strategies.build_params

    def counting(cfg):
        calls.append(cfg.strategy.name)
        return real(cfg)

    monkeypatch.setattr(strategies, "build_params", counting)
    return calls


def test_one_in_process_run_resolves_and_checks_its_config_once(
    tmp_path, builds, capsys, monkeypatch
):
    checks: list[str] = []
    real = server_app.preflight
    monkeypatch.setattr(server_app, "preflight", lambda cfg: checks.append(cfg.name) or real(cfg))
    argv = [str(ROOT / "conf" / "default.yaml"), *TINY_RUN, f"output_dir={tmp_path / 'run'}"]
    assert inprocess.main(argv) == 0
    assert builds == ["fedavg"]
    assert checks == ["default"]  # the run's own preflight; main does not check a second time
    assert (tmp_path / "run" / "summary.json").is_file()


def test_one_server_app_run_resolves_its_config_once(tmp_path, builds):
    overrides = " ".join([*TINY_RUN, f"output_dir={tmp_path / 'run'}"])
    server_app.main(InProcessGrid(client_app, 4), run_context(overrides=overrides))
    assert builds == ["fedavg"]
    assert (tmp_path / "run" / "summary.json").is_file()


def test_an_unresolved_config_is_refused_before_anything_runs(tmp_path):
    raw = load_config(ROOT / "conf" / "fedprox.yaml", [*TINY_RUN, f"output_dir={tmp_path}"])
    assert not strategies.is_resolved(raw)
    with pytest.raises(TypeError, match="preflight needs a resolved config"):
        preflight(raw)
    with pytest.raises(TypeError, match="run_experiment needs a resolved config"):
        run_inprocess(raw)
    assert not any(tmp_path.iterdir())
    assert strategies.is_resolved(tiny_config(tmp_path / "typed", conf="fedprox.yaml"))
