"""Issue 12: a client is not steered outside its folder; nothing is lost or silently replaced.

- the server's run token is a folder name on the client: only the server's own form is taken,
  and the state folder must resolve inside the node's base folder;
- ``faults`` (crash, exit, ...) act only on a node that opted in through its own config;
- the thread count the server asks for is capped by the node;
- a run folder holding an earlier run is refused (``cli prepare`` and the ServerApp) unless
  ``resume`` or ``overwrite``; ``run.sh`` keeps an earlier summary and does not take it as
  success;
- ``model.pt`` before ``summary.json``, both atomic; strict JSON (no ``Infinity``);
- checkpoints: a previous one is kept and used when the newest is unreadable, every field is
  checked, and nothing is unpickled beyond tensors and plain data (also the client state files
  and FedGO's generator/discriminator files).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Context, RecordDict
from helpers import rows_of, run_sh

from fedgo_flwr import cli
from fedgo_flwr import server_app as server_app_module
from fedgo_flwr.checkpoint import (
    CHECKPOINT_FILE,
    PREVIOUS_FILE,
    Checkpoint,
    capture_rng,
    load_checkpoint,
    new_run_token,
    save_checkpoint,
)
from fedgo_flwr.client_app import node_cpus, restore_state
from fedgo_flwr.config import ConfigError
from fedgo_flwr.inprocess import run_inprocess
from fedgo_flwr.recorder import RunRecorder
from fedgo_flwr.task import sample_clients
from strategies import load_experiment

ROOT = Path(__file__).resolve().parents[2]
TINY = ["rounds=1", "data.num_clients=4", "fraction=0.5", "train.local_epochs=1"]


def config(out: Path, *overrides: str):
    return load_experiment(ROOT / "conf/default.yaml", [*TINY, f"output_dir={out}", *overrides])


def messages(log) -> list[str]:
    return [r.getMessage() for r in log.records]


class Planted:
    """Unpickling this runs code (writes ``marker``): what a planted file could do."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


# -- the run token and the node's folder ---------------------------------------------------


@pytest.mark.parametrize("kind", ["climbing", "absolute", "symlink"])
def test_a_run_token_cannot_steer_the_client_out_of_its_folder(
    tmp_path, monkeypatch, flwr_log, kind
):
    outside = tmp_path / "outside"
    out = tmp_path / "run"
    token = {"climbing": "../../outside", "absolute": str(outside)}.get(kind, new_run_token())
    if kind == "symlink":  # a valid token whose folder is a link out of the base
        (out / "client-state").mkdir(parents=True)
        outside.mkdir()
        (out / "client-state" / token).symlink_to(outside)
    monkeypatch.setattr(server_app_module, "new_run_token", lambda: token)
    run_inprocess(config(out, "strategy.name=scaffold"))
    assert not list(outside.rglob("*.pt")), "the client wrote outside its state folder"
    row = rows_of(out)[1]
    assert row["clients_replied"] == 0 and row["clients_failed"] == 2
    dropped = [m for m in messages(flwr_log) if "Dropping reply" in m]
    assert len(dropped) == 2
    assert all("run token" in m or "outside" in m for m in dropped), dropped


# -- faults need the node's consent --------------------------------------------------------


@pytest.mark.parametrize("kind", ["crash", "exit", "nan"])
def test_a_node_that_did_not_opt_in_ignores_faults(tmp_path, monkeypatch, flwr_log, kind):
    def no_exit(status):  # an obeyed `exit` fault would end pytest
        raise RuntimeError(f"os._exit({status}) called")

    monkeypatch.setattr(os, "_exit", no_exit)
    monkeypatch.delenv("FEDGO_ALLOW_FAULTS", raising=False)
    bad = sample_clients(0, 1, 4, 2)[0]
    cfg = config(tmp_path, f"faults=[{{partition: {bad}, round: 1, kind: {kind}}}]")
    run_inprocess(cfg, node_config={"allow-faults": False})
    row = rows_of(tmp_path)[1]
    assert row["clients_replied"] == 2 and row["clients_failed"] == 0
    ignored = [m for m in messages(flwr_log) if "ignoring the server's injected fault" in m]
    assert len(ignored) == 1 and f"client {bad}," in ignored[0] and kind in ignored[0]


def test_faults_act_on_a_node_that_opted_in(tmp_path, monkeypatch):
    """Through node config (run_inprocess's default) or, without one, the environment."""
    bad = sample_clients(0, 1, 4, 2)[0]
    fault = f"faults=[{{partition: {bad}, round: 1, kind: crash}}]"
    run_inprocess(config(tmp_path / "node-config", fault))
    assert rows_of(tmp_path / "node-config")[1]["clients_failed"] == 1
    monkeypatch.setenv("FEDGO_ALLOW_FAULTS", "1")
    run_inprocess(config(tmp_path / "env", fault), node_config={"allow-faults": None})
    assert rows_of(tmp_path / "env")[1]["clients_failed"] == 1
    # The node's explicit "no" wins over the environment.
    run_inprocess(config(tmp_path / "no", fault), node_config={"allow-faults": "false"})
    assert rows_of(tmp_path / "no")[1]["clients_failed"] == 0


# -- threads -------------------------------------------------------------------------------


@pytest.fixture
def keep_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_the_server_cannot_ask_a_client_for_more_threads_than_it_has(
    tmp_path, keep_threads, monkeypatch
):
    import fedgo_flwr.client_app as client_app

    used: list[int] = []  # the thread counts the client handler set (the grid restores the
    real = client_app.client_threads  # server's after each call, so read them here)
    monkeypatch.setattr(client_app, "client_threads", lambda *a: used.append(real(*a)) or used[-1])
    cpus = node_cpus()
    run_inprocess(config(tmp_path / "a", f"resources.client_cpus={cpus + 3}"))
    assert used and set(used) == {cpus}
    # A node may set a lower limit of its own.
    used.clear()
    run_inprocess(config(tmp_path / "b", "resources.client_cpus=2"), {"max-threads": 1})
    assert used and set(used) == {1}


def test_the_in_process_server_keeps_its_own_threads(tmp_path, keep_threads):
    torch.set_num_threads(2)
    run_inprocess(config(tmp_path, "resources.client_cpus=1", "resources.server_cpus=2"))
    assert torch.get_num_threads() == 2  # not the clients' 1


# -- the run folder ------------------------------------------------------------------------


def test_a_second_run_into_a_used_folder_is_refused_and_the_first_is_kept(tmp_path):
    run_inprocess(config(tmp_path))
    before = {f.name: f.read_bytes() for f in tmp_path.iterdir() if f.is_file()}
    assert {"metrics.jsonl", "summary.json", "model.pt"} <= set(before)
    with pytest.raises(ConfigError, match=r"output_dir = .*holds an earlier run.*overwrite=true"):
        run_inprocess(config(tmp_path, "seed=1"))
    after = {f.name: f.read_bytes() for f in tmp_path.iterdir() if f.is_file()}
    assert after == before


def test_overwrite_replaces_the_earlier_run(tmp_path):
    run_inprocess(config(tmp_path, "rounds=2"))
    assert (tmp_path / PREVIOUS_FILE).exists()
    run_inprocess(config(tmp_path, "overwrite=true", "checkpoint=false", "seed=1"))
    assert [r["round"] for r in rows_of(tmp_path)] == [0, 1]
    assert json.loads((tmp_path / "summary.json").read_text())["rounds"] == 1
    # The old run's checkpoints are gone: a later resume=true cannot pick up the old run.
    assert not (tmp_path / CHECKPOINT_FILE).exists() and not (tmp_path / PREVIOUS_FILE).exists()


def test_resume_without_a_checkpoint_does_not_replace_a_run(tmp_path):
    run_inprocess(config(tmp_path, "checkpoint=false"))
    before = (tmp_path / "metrics.jsonl").read_bytes()
    with pytest.raises(ConfigError, match="no checkpoint to resume from"):
        run_inprocess(config(tmp_path, "checkpoint=false", "resume=true", "rounds=2"))
    assert (tmp_path / "metrics.jsonl").read_bytes() == before


def test_resume_restarts_a_run_stopped_before_its_first_checkpoint(tmp_path):
    """Nothing to continue and nothing finished (e.g. a FedGO run stopped in its pre-FL
    stage): resume=true starts it again instead of refusing, so a sweep can go on."""
    (tmp_path / "metrics.jsonl").write_text('{"round": 0}\n')
    (tmp_path / "prefl.json").write_text("{}")
    run_inprocess(config(tmp_path, "resume=true", "rounds=1"))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1]
    assert (tmp_path / "summary.json").exists()


def test_prepare_refuses_a_used_folder_with_exit_2(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"round": 0}\n')
    run_toml = tmp_path / "flwr" / "run.toml"
    argv = ["prepare", "conf/default.yaml", f"output_dir={tmp_path}", "--run-toml", str(run_toml)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "output_dir" in err and "metrics.jsonl" in err and "resume=true" in err
    assert not run_toml.exists()
    assert (tmp_path / "metrics.jsonl").read_text() == '{"round": 0}\n'
    assert cli.main([*argv[:3], "overwrite=true", *argv[3:]]) == 0


# -- the order and atomicity of the final files --------------------------------------------


def test_no_summary_without_its_model(tmp_path, monkeypatch):
    def full_disk(*args, **kwargs):
        raise OSError("no space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError, match="no space left"):
        run_inprocess(config(tmp_path, "checkpoint=false"))
    assert not (tmp_path / "summary.json").exists()


def test_a_crash_while_writing_the_summary_leaves_none(tmp_path, monkeypatch):
    real_replace = os.replace

    def crash_on_summary(src, dst):
        if Path(dst).name == "summary.json":
            raise KeyboardInterrupt  # killed between writing and renaming
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_summary)
    with pytest.raises(KeyboardInterrupt):
        run_inprocess(config(tmp_path))
    monkeypatch.undo()
    assert not (tmp_path / "summary.json").exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    torch.load(tmp_path / "model.pt", weights_only=True)  # complete, written first


def test_infinite_metrics_are_written_as_null(tmp_path):
    cfg = config(tmp_path, "eval.every=5", "rounds=3")

    class Stub:
        last_round = {"train_loss": float("inf"), "distill_loss": float("-inf"), "x": [1.0]}

    recorder = RunRecorder.create(cfg)
    recorder.attach(Stub(), None, None, None)
    recorder.evaluate(1, ArrayRecord())  # not an evaluation round: no model needed

    def strict(name):
        raise ValueError(f"not JSON: {name}")

    row = json.loads((tmp_path / "metrics.jsonl").read_text(), parse_constant=strict)
    assert row["train_loss"] is None and row["distill_loss"] is None
    assert row["test_accuracy"] is None


# -- checkpoints ---------------------------------------------------------------------------


def test_the_previous_checkpoint_is_kept_and_used_when_the_newest_is_unreadable(tmp_path, flwr_log):
    run_inprocess(config(tmp_path, "rounds=2", "strategy.name=scaffold"))
    assert load_checkpoint(tmp_path).round == 2
    newest = tmp_path / CHECKPOINT_FILE
    newest.write_bytes(newest.read_bytes()[:100])  # torn by a disk fault
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.round == 1 and ckpt.strategy_state["control"]
    warned = [m for m in messages(flwr_log) if "previous checkpoint" in m]
    assert len(warned) == 1 and str(newest) in warned[0] and PREVIOUS_FILE in warned[0]


def timeless(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if "time" not in k and k != "elapsed"} for r in rows]


def test_resuming_from_the_previous_checkpoint_matches_the_straight_run(tmp_path, caplog):
    run_inprocess(config(tmp_path, "rounds=2", "strategy.name=scaffold"))
    straight = timeless(rows_of(tmp_path))
    (tmp_path / CHECKPOINT_FILE).unlink()  # e.g. lost between the two renames
    logger = logging.getLogger("flwr")
    old, logger.propagate = logger.propagate, True
    try:
        with caplog.at_level(logging.INFO, logger="flwr"):
            run_inprocess(config(tmp_path, "rounds=2", "strategy.name=scaffold", "resume=true"))
    finally:
        logger.propagate = old
    assert any(f"continuing {tmp_path} after round 1" in m for m in messages(caplog))
    assert timeless(rows_of(tmp_path)) == straight


def test_a_planted_checkpoint_runs_no_code_on_resume(tmp_path, flwr_log):
    marker = tmp_path / "pwned"
    out = tmp_path / "run"
    out.mkdir()
    torch.save({"round": 1, "config": Planted(marker)}, out / CHECKPOINT_FILE)
    with pytest.raises(ValueError, match=f"checkpoint {out / CHECKPOINT_FILE}.*weights_only"):
        run_inprocess(config(out, "resume=true"))
    assert not marker.exists()
    # Beside a good previous checkpoint, the planted one is skipped with a WARNING.
    run_inprocess(config(tmp_path / "good", "rounds=2"))
    torch.save({"round": 3, "config": Planted(marker)}, tmp_path / "good" / CHECKPOINT_FILE)
    assert load_checkpoint(tmp_path / "good").round == 1
    assert not marker.exists()
    assert any("previous checkpoint" in m for m in messages(flwr_log))


def good_checkpoint() -> dict:
    cfg = config(Path("unused"))
    ckpt = Checkpoint(
        round=2,
        arrays={"w": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.array(4)},
        strategy_state={"control": {"w": np.ones(3)}, "previous": None},
        metrics=[{"round": 0, "test_accuracy": 0.5, "x": float("nan")}],
        config=cfg.to_dict(),
        rng=capture_rng(),
    )
    return ckpt.__dict__


def test_a_checkpoint_round_trips_exactly(tmp_path):
    saved = good_checkpoint()
    save_checkpoint(tmp_path, Checkpoint(**saved))
    loaded = load_checkpoint(tmp_path)
    for name, array in saved["arrays"].items():
        assert loaded.arrays[name].dtype == array.dtype
        np.testing.assert_array_equal(loaded.arrays[name], array)
    np.testing.assert_array_equal(loaded.strategy_state["control"]["w"], np.ones(3))
    assert loaded.strategy_state["previous"] is None and loaded.run_token == saved["run_token"]
    assert loaded.rng["python"] == saved["rng"]["python"]
    np.testing.assert_array_equal(loaded.rng["numpy"][1], saved["rng"]["numpy"][1])
    assert torch.equal(loaded.rng["torch"], saved["rng"]["torch"])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("round", -1),
        ("round", "2"),
        ("arrays", [1, 2]),
        ("arrays", {"w": [1.0, 2.0]}),
        ("strategy_state", None),
        ("metrics", {"round": 0}),
        ("config", "name: x"),
        ("run_token", "../../x"),
        ("rng", {"torch": torch.zeros(3)}),
    ],
)
def test_checkpoint_fields_are_checked_on_load(tmp_path, field, value):
    raw = good_checkpoint()
    from fedgo_flwr.checkpoint import FORMAT, encode

    data = {"format": FORMAT, **encode(raw)}
    data[field] = value
    torch.save(data, tmp_path / CHECKPOINT_FILE)
    with pytest.raises(ValueError, match=rf"checkpoint {tmp_path / CHECKPOINT_FILE}: .*'{field}"):
        load_checkpoint(tmp_path)


# -- the client's state files and FedGO's files --------------------------------------------


def node_context() -> Context:
    return Context(
        run_id=1,
        node_id=2,
        node_config={"partition-id": 0},
        state=RecordDict(),
        run_config={},
    )


def test_a_planted_client_state_file_runs_no_code(tmp_path, monkeypatch):
    # Even where torch is told to unpickle everything by default, the client does not.
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    marker = tmp_path / "pwned"
    folder = tmp_path / "partition-0"
    folder.mkdir()
    torch.save({"control": Planted(marker)}, folder / "round-1.pt")
    with pytest.raises(ValueError, match=r"round-1.pt"):
        restore_state(node_context().state, folder.resolve(), server_round=2)
    assert not marker.exists()


def test_an_unreadable_client_state_file_falls_back_to_the_one_before(tmp_path, flwr_log):
    folder = (tmp_path / "partition-0").resolve()
    folder.mkdir()
    torch.save({"control": {"w": torch.ones(2)}}, folder / "round-1.pt")
    (folder / "round-2.pt").write_bytes(b"torn")
    context = node_context()
    restore_state(context.state, folder, server_round=3)
    assert torch.equal(context.state["control"].to_torch_state_dict()["w"], torch.ones(2))
    assert any("round-2.pt" in m for m in messages(flwr_log))


FEDGO = [
    "strategy.name=fedgo",
    "strategy.distill.epochs=1",
    "strategy.generator.steps=2",
    "strategy.discriminator.epochs=1",
]


@pytest.mark.parametrize("planted", ["generator", "discriminator"])
def test_planted_fedgo_files_run_no_code(tmp_path, monkeypatch, planted):
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    marker = tmp_path / "pwned"
    evil = tmp_path / f"{planted}.pt"
    torch.save({"0": Planted(marker)}, evil)
    if planted == "generator":
        paths = [f"strategy.generator.path={evil}"]
    else:
        from fedgo_flwr.gan import build_generator
        from fedgo_flwr.task import load_bundle

        cfg = config(tmp_path / "x", *FEDGO)
        gp = cfg.strategy.params.generator
        shape = load_bundle(cfg.data).train.input_shape
        generator = build_generator(gp.name, gp.latent_dim, shape, seed=0, **gp.model_kwargs())
        torch.save(generator.state_dict(), tmp_path / "gen.pt")
        paths = [f"strategy.generator.path={tmp_path / 'gen.pt'}"]
        paths.append(f"strategy.discriminator.path={evil}")
    with pytest.raises(ValueError, match=f"{planted}s? file {evil}"):
        run_inprocess(config(tmp_path / "run", *FEDGO, *paths))
    assert not marker.exists()


# -- run.sh --------------------------------------------------------------------------------


@pytest.mark.slow
def test_run_sh_refuses_a_used_folder_and_keeps_its_files(tmp_path):
    run_inprocess(config(tmp_path))
    before = {f.name: f.read_bytes() for f in tmp_path.iterdir() if f.is_file()}
    proc = run_sh("conf/default.yaml", *TINY, f"output_dir={tmp_path}", timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "holds an earlier run" in proc.stderr and "overwrite=true" in proc.stderr
    assert {f.name: f.read_bytes() for f in tmp_path.iterdir() if f.is_file()} == before


@pytest.mark.slow
def test_run_sh_keeps_the_summary_of_a_run_whose_resume_fails(tmp_path):
    """A resume that the ServerApp refuses (changed config) fails, and the finished run's
    summary.json is neither deleted nor taken as this run's success."""
    run_inprocess(config(tmp_path))
    summary = (tmp_path / "summary.json").read_bytes()
    proc = run_sh(
        "conf/default.yaml", *TINY, "resume=true", "data.alpha=0.5", f"output_dir={tmp_path}"
    )
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-3000:]
    assert "the run failed" in proc.stderr
    assert "configuration differs" in proc.stdout + proc.stderr
    assert (tmp_path / "summary.json").read_bytes() == summary
