"""Checkpoints and the clients' state files (issue 12): a previous checkpoint is kept and used
when the newest is unreadable, every field is checked, and nothing is unpickled beyond tensors
and plain data (also the client state files and FedGO's generator/discriminator files)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict
from helpers import log_messages, rows_of, tiny_config

from fedgo_flwr.app.client_app import restore_state
from fedgo_flwr.app.inprocess import run_inprocess
from fedgo_flwr.experiment.checkpoint import (
    CHECKPOINT_FILE,
    PREVIOUS_FILE,
    Checkpoint,
    capture_rng,
    load_checkpoint,
    save_checkpoint,
)


class Planted:
    """Unpickling this runs code (writes ``marker``): what a planted file could do."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


# -- checkpoints ---------------------------------------------------------------------------


def test_the_previous_checkpoint_is_kept_and_used_when_the_newest_is_unreadable(tmp_path, flwr_log):
    run_inprocess(tiny_config(tmp_path, "rounds=2", "strategy.name=scaffold"))
    assert load_checkpoint(tmp_path).round == 2
    newest = tmp_path / CHECKPOINT_FILE
    newest.write_bytes(newest.read_bytes()[:100])  # torn by a disk fault
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.round == 1 and ckpt.strategy_state["control"]
    warned = [m for m in log_messages(flwr_log) if "previous checkpoint" in m]
    assert len(warned) == 1 and str(newest) in warned[0] and PREVIOUS_FILE in warned[0]


def timeless(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if "time" not in k and k != "elapsed"} for r in rows]


def test_resuming_from_the_previous_checkpoint_matches_the_straight_run(tmp_path, caplog):
    run_inprocess(tiny_config(tmp_path, "rounds=2", "strategy.name=scaffold"))
    straight = timeless(rows_of(tmp_path))
    (tmp_path / CHECKPOINT_FILE).unlink()  # e.g. lost between the two renames
    logger = logging.getLogger("flwr")
    old, logger.propagate = logger.propagate, True
    try:
        with caplog.at_level(logging.INFO, logger="flwr"):
            run_inprocess(
                tiny_config(tmp_path, "rounds=2", "strategy.name=scaffold", "resume=true")
            )
    finally:
        logger.propagate = old
    assert any(f"continuing {tmp_path} after round 1" in m for m in log_messages(caplog))
    assert timeless(rows_of(tmp_path)) == straight


def test_a_planted_checkpoint_runs_no_code_on_resume(tmp_path, flwr_log):
    marker = tmp_path / "pwned"
    out = tmp_path / "run"
    out.mkdir()
    torch.save({"round": 1, "config": Planted(marker)}, out / CHECKPOINT_FILE)
    with pytest.raises(ValueError, match=f"checkpoint {out / CHECKPOINT_FILE}.*weights_only"):
        run_inprocess(tiny_config(out, "resume=true"))
    assert not marker.exists()
    # Beside a good previous checkpoint, the planted one is skipped with a WARNING.
    run_inprocess(tiny_config(tmp_path / "good", "rounds=2"))
    torch.save({"round": 3, "config": Planted(marker)}, tmp_path / "good" / CHECKPOINT_FILE)
    assert load_checkpoint(tmp_path / "good").round == 1
    assert not marker.exists()
    assert any("previous checkpoint" in m for m in log_messages(flwr_log))


def good_checkpoint() -> dict:
    cfg = tiny_config(Path("unused"))
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
    from fedgo_flwr.experiment.checkpoint import FORMAT, encode

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
    assert any("round-2.pt" in m for m in log_messages(flwr_log))


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
        from fedgo_flwr.experiment.task import load_bundle
        from fedgo_flwr.gan import build_generator

        cfg = tiny_config(tmp_path / "x", *FEDGO)
        gp = cfg.strategy.params.generator
        shape = load_bundle(cfg.data).train.input_shape
        generator = build_generator(gp.name, gp.latent_dim, shape, seed=0, **gp.model_kwargs())
        torch.save(generator.state_dict(), tmp_path / "gen.pt")
        paths = [f"strategy.generator.path={tmp_path / 'gen.pt'}"]
        paths.append(f"strategy.discriminator.path={evil}")
    with pytest.raises(ValueError, match=f"{planted}s? file {evil}"):
        run_inprocess(tiny_config(tmp_path / "run", *FEDGO, *paths))
    assert not marker.exists()
