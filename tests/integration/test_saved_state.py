"""Checkpoints and the clients' state files (issue 12): a previous checkpoint is kept and used
when the newest is unreadable, every field is checked, and nothing is unpickled beyond tensors
and plain data (also the client state files and FedGO's generator/discriminator files)."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict
from helpers import SMALL_GAN, log_messages, rows_of, tiny_config

from fedgo_app.client_app import restore_state
from fedgo_app.inprocess import run_inprocess
from fedgo_flwr.records.checkpoint import (
    CHECKPOINT_FILE,
    PREVIOUS_FILE,
    SAVED_FIELDS,
    Checkpoint,
    CheckpointError,
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
    return {name: getattr(ckpt, name) for name in SAVED_FIELDS}


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
    from fedgo_flwr.records.checkpoint import FORMAT, encode

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
        from fedgo_flwr.gan import build_generator
        from fedgo_flwr.learning.task import load_bundle

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


# -- resuming checks values, not only types ------------------------------------------------
SCAFFOLD = ["strategy.name=scaffold"]


@pytest.fixture(scope="module")
def finished_round_1(tmp_path_factory) -> Path:
    """A SCAFFOLD run of one round (its checkpoint is of round 1), made once per module."""
    out = tmp_path_factory.mktemp("round1")
    run_inprocess(tiny_config(out, *SCAFFOLD))
    return out


def tampered(base: Path, out: Path, change) -> Path:
    """A copy of run folder ``base`` whose checkpoint ``change(ckpt)`` altered (rewritten as
    a run would write it: the attack is in the values, not the format)."""
    shutil.copytree(base, out)
    ckpt = load_checkpoint(out)
    change(ckpt)
    (out / CHECKPOINT_FILE).unlink()
    save_checkpoint(out, ckpt)
    (out / PREVIOUS_FILE).unlink(missing_ok=True)  # nothing to fall back to
    return out


def run_files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def refused_resume(out: Path, *overrides: str) -> str:
    """The one error of resuming ``out`` with ``rounds=2``; the run folder stays as it was."""
    before = run_files(out)
    with pytest.raises(CheckpointError) as info:
        run_inprocess(tiny_config(out, *SCAFFOLD, "rounds=2", "resume=true", *overrides))
    assert run_files(out) == before  # nothing rewritten, nothing removed
    text = str(info.value)
    assert "\n" not in text and str(out / CHECKPOINT_FILE) in text
    return text


def first_weight(ckpt: Checkpoint) -> str:
    return next(k for k, v in ckpt.arrays.items() if v.dtype == np.float32 and v.ndim > 1)


def set_first(value):
    def change(ckpt):
        key = first_weight(ckpt)
        ckpt.arrays[key] = np.full_like(ckpt.arrays[key], value)

    return change


def as_float64(ckpt):
    ckpt.arrays = {
        k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in ckpt.arrays.items()
    }


def misshaped(ckpt):
    ckpt.arrays[first_weight(ckpt)] = np.zeros((3, 3), np.float32)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (set_first(np.nan), r"field 'arrays': '[\w.]+' holds non-finite values"),
        (set_first(1e30), r"field 'arrays': '[\w.]+' holds 1e\+30, above 1e\+06 in magnitude"),
        (as_float64, r"field 'arrays': '[\w.]+' has dtype float64, expected float32"),
        (misshaped, r"field 'arrays': '[\w.]+' has shape \(3, 3\), expected \(32, 1, 3, 3\)"),
    ],
    ids=["nan", "1e30", "float64", "shape"],
)
def test_a_checkpoint_whose_model_does_not_fit_is_refused(
    finished_round_1, tmp_path, change, problem
):
    """Before, NaN, 1e30 and float64 models were resumed (every later round had 0 usable
    replies) and a wrong shape was a raw RuntimeError."""
    out = tampered(finished_round_1, tmp_path / "run", change)
    assert re.search(problem, refused_resume(out))


def test_a_checkpoint_beyond_the_configured_rounds_is_refused(finished_round_1, tmp_path):
    """Before, ``round = 10**18`` "finished" the run silently."""

    def far(ckpt):
        ckpt.round = 10**18

    out = tampered(finished_round_1, tmp_path / "run", far)
    text = refused_resume(out)
    assert f"field 'round' is {10**18}, beyond this run's last round 2" in text


def test_resuming_a_finished_run_says_so_and_changes_nothing(finished_round_1, tmp_path, flwr_log):
    """Its summary.json there, a finished run is refused with one message; without it (the run
    stopped between its last checkpoint and its summary) the summary is written."""
    out = tmp_path / "run"
    shutil.copytree(finished_round_1, out)
    before = run_files(out)
    with pytest.raises(CheckpointError) as info:
        run_inprocess(tiny_config(out, *SCAFFOLD, "resume=true"))
    assert run_files(out) == before
    assert str(info.value) == (
        f"checkpoint {out / CHECKPOINT_FILE} is of round 1, the end of the finished run in "
        f"{out} (summary.json is there): nothing to resume; raise rounds to extend it, or set "
        "overwrite=true to run it again"
    )
    (out / "summary.json").unlink()
    flwr_log.set_level(logging.INFO, logger="flwr")
    run_inprocess(tiny_config(out, *SCAFFOLD, "resume=true"))
    assert json.loads((out / "summary.json").read_text())["rounds"] == 1
    assert [r["round"] for r in rows_of(out)] == [0, 1]
    assert any(
        "the run's last; writing its final model and summary" in m for m in log_messages(flwr_log)
    )


def nan_control(ckpt):
    control = ckpt.strategy_state["control"]
    key = next(iter(control))
    control[key] = np.full_like(control[key], np.nan)


def misshaped_control(ckpt):
    control = ckpt.strategy_state["control"]
    control[next(iter(control))] = np.zeros(2, np.float32)


def huge_control(ckpt):
    control = ckpt.strategy_state["control"]
    key = next(iter(control))
    control[key] = np.full_like(control[key], 1e30)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (nan_control, r"field 'strategy_state.control.[\w.]+' holds non-finite values"),
        (misshaped_control, r"'strategy_state.control': '[\w.]+' has shape \(2,\), expected"),
        (huge_control, r"'strategy_state.control': L2 norm [\d.e+]+ exceeds [\d.e+]+, the most 1 "),
    ],
    ids=["nan", "shape", "norm"],
)
def test_a_strategy_state_that_does_not_fit_is_refused(finished_round_1, tmp_path, change, problem):
    """SCAFFOLD's control variate: before, each was resumed and sent to the clients, whose
    replies were then all dropped."""
    out = tampered(finished_round_1, tmp_path / "run", change)
    assert re.search(problem, refused_resume(out))


def test_the_server_app_logs_one_line_for_a_bad_checkpoint(finished_round_1, tmp_path, flwr_log):
    from helpers import TINY_RUN, run_context

    from fedgo_app import server_app
    from fedgo_app.client_app import app as client_app
    from fedgo_app.inprocess import InProcessGrid

    out = tampered(finished_round_1, tmp_path / "run", set_first(np.nan))
    overrides = " ".join([*TINY_RUN, *SCAFFOLD, "rounds=2", "resume=true", f"output_dir={out}"])
    with pytest.raises(CheckpointError):
        server_app.main(InProcessGrid(client_app, 4), run_context(overrides=overrides))
    [line] = [r.getMessage() for r in flwr_log.records if r.levelno == logging.ERROR]
    assert line.startswith(f"fedgo-flwr: checkpoint {out / CHECKPOINT_FILE}: field 'arrays'")


G3 = [
    *FEDGO,
    *SMALL_GAN,
    "strategy.generator.steps=0",
    "strategy.generator.federated_rounds=2",
    "strategy.generator.local_epochs=1",
]
"""FedGO's scenario G3: the generator trained by FedGAN rounds, saved in ``fedgan.pt``."""


@pytest.fixture(scope="module")
def stopped_in_fedgan(tmp_path_factory) -> Path:
    """A G3 run folder as a run stopped after its FedGAN rounds leaves it: ``fedgan.pt`` of
    round 2, no generator, discriminators, checkpoint or summary yet."""
    out = tmp_path_factory.mktemp("g3")
    run_inprocess(tiny_config(out, *G3))
    for name in ("generator.pt", "discriminators.pt", CHECKPOINT_FILE, PREVIOUS_FILE):
        (out / name).unlink(missing_ok=True)
    (out / "summary.json").unlink()
    return out


def nan_generator(saved):
    key = next(iter(saved["generator"]))
    saved["generator"][key] = torch.full_like(saved["generator"][key], float("nan"))


def misshaped_critic(saved):
    key = next(iter(saved["critic"]))
    saved["critic"][key] = torch.zeros(3)


def round_99(saved):
    saved["round"] = 99


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (nan_generator, r"'generator': '[\w.]+' holds non-finite values"),
        (misshaped_critic, r"'critic': '[\w.]+' has shape \(3,\), expected"),
        (round_99, r"'round' is 99, not one of the 2 rounds"),
    ],
    ids=["nan", "shape", "round"],
)
def test_a_fedgan_checkpoint_that_does_not_fit_is_refused(
    stopped_in_fedgan, tmp_path, change, problem
):
    """Before, a NaN pair was resumed, a misshaped one was a raw RuntimeError and round 99
    skipped the FedGAN rounds with the saved pair."""
    out = tmp_path / "run"
    shutil.copytree(stopped_in_fedgan, out)
    saved = torch.load(out / "fedgan.pt")
    change(saved)
    torch.save(saved, out / "fedgan.pt")
    with pytest.raises(CheckpointError) as info:
        run_inprocess(tiny_config(out, *G3, "resume=true"))
    text = str(info.value)
    assert text.startswith(f"FedGAN checkpoint {out / 'fedgan.pt'}: ") and "\n" not in text
    assert re.search(problem, text), text


def misshaped_protos(ckpt):
    ckpt.strategy_state["global_protos"] = np.zeros((2, 2), np.float32)


def misshaped_tgp(ckpt):
    tgp = ckpt.strategy_state["tgp"]
    tgp[next(iter(tgp))] = torch.zeros(1)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (misshaped_protos, r"'strategy_state.global_protos': 'protos' has shape \(2, 2\)"),
        (misshaped_tgp, r"'strategy_state.tgp': '[\w.]+' has shape \(1,\), expected"),
    ],
    ids=["global_protos", "tgp"],
)
def test_a_fedtgp_state_that_does_not_fit_is_refused(tmp_path, change, problem):
    """Before, misshaped prototypes were sent to every client (round 2 had 0 usable replies)
    and a misshaped TGP network was a raw RuntimeError."""
    run_inprocess(tiny_config(tmp_path / "base", "strategy.name=fedtgp"))
    out = tampered(tmp_path / "base", tmp_path / "run", change)
    before = run_files(out)
    with pytest.raises(CheckpointError) as info:
        run_inprocess(tiny_config(out, "strategy.name=fedtgp", "rounds=2", "resume=true"))
    assert run_files(out) == before
    assert str(out / CHECKPOINT_FILE) in str(info.value)
    assert re.search(problem, str(info.value)), str(info.value)
