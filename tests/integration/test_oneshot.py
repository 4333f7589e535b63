"""One-shot strategies end to end on tiny digits: oneshot (FedAvg), coboosting, dense, fadi."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import ONESHOT_TINY, rows_of, without_timing

from fedgo_app.cli import preflight
from fedgo_app.inprocess import run_inprocess
from fedgo_flwr.config.experiment import ConfigError
from fedgo_flwr.records.checkpoint import load_checkpoint
from strategies import load_experiment
from strategies.coboosting import CoBoosting

ROOT = Path(__file__).resolve().parents[2]

TINY = ONESHOT_TINY


def config(out: Path, *overrides: str, name: str = "coboosting"):
    return load_experiment(
        ROOT / "conf/coboosting.yaml",
        [*TINY, f"strategy.name={name}", f"output_dir={out}", *overrides],
    )


def summary_of(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_oneshot_fedavg_is_the_average_of_the_uploaded_models(tmp_path):
    """strategy oneshot = one FedAvg round: the same model as fedavg with rounds 1."""
    common = [*TINY[:3], "train.local_epochs=1", "checkpoint=false"]  # clients, data cut
    run_inprocess(config(tmp_path / "oneshot", *common, name="oneshot"))
    run_inprocess(
        load_experiment(
            ROOT / "conf/coboosting.yaml",
            [*common, "strategy.name=fedavg", f"output_dir={tmp_path / 'fedavg'}"],
        )
    )
    a = torch.load(tmp_path / "oneshot" / "model.pt")
    b = torch.load(tmp_path / "fedavg" / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    s = summary_of(tmp_path / "oneshot")
    assert s["clients_used"] == [0, 1, 2, 3] and s["clients_left_out"] == []
    assert 0 < s["ensemble_accuracy_uniform"] <= 1 and 0 < s["ensemble_accuracy_data_size"] <= 1
    assert [r["round"] for r in rows_of(tmp_path / "oneshot")] == [0, 1]


def test_coboosting_rows_pool_weights_and_summary(tmp_path):
    run_inprocess(config(tmp_path))
    rows = rows_of(tmp_path)
    assert [r["round"] for r in rows] == [0, 1, 2, 3, 4]
    epochs = rows[2:]
    assert [r["epoch"] for r in epochs] == [1, 2, 3]
    assert [r["pool_size"] for r in epochs] == [16, 32, 48]  # b samples per epoch, all kept
    # Student evaluated every eval.every = 2 epochs and in the last one.
    assert [r["test_accuracy"] is not None for r in epochs] == [False, True, True]
    for r in epochs:
        w = r["ensemble_weights"]
        assert len(w) == 4 and all(0 <= x <= 1 for x in w)
        for key in ("synthesis_time", "distill_time", "ensemble_accuracy_learned"):
            assert key in r
    assert epochs[-1]["ensemble_weights"] != [0.25] * 4
    s = summary_of(tmp_path)
    for key in ("ensemble_accuracy_learned", "ensemble_accuracy_uniform", "final_accuracy"):
        assert 0 <= s[key] <= 1
    assert s["server_epochs"] == 3 and len(s["ensemble_weights"]) == 4


def test_coboosting_is_deterministic_and_resumes_equal(tmp_path, monkeypatch):
    overrides = ["checkpoint=true"]
    run_inprocess(config(tmp_path / "straight", *overrides))
    run_inprocess(config(tmp_path / "again", *overrides))
    assert without_timing(rows_of(tmp_path / "again")) == without_timing(
        rows_of(tmp_path / "straight")
    )
    original = CoBoosting.server_epoch

    def dying(self, epoch):
        if epoch == 2:
            raise KeyboardInterrupt
        return original(self, epoch)

    out = tmp_path / "resumed"
    with monkeypatch.context() as m:
        m.setattr(CoBoosting, "server_epoch", dying)
        with pytest.raises(KeyboardInterrupt):
            run_inprocess(config(out, *overrides))
    assert load_checkpoint(out).round == 2  # the clients' row and epoch 1
    run_inprocess(config(out, *overrides, "resume=true"))
    # The pool, the weights and the student come out bit for bit equal. The generator's
    # convolution weight gradients differ in the last bits after a resume (measured: 1e-9 on
    # its parameters after two epochs; the same inputs, parameters and random draws go in, so
    # CPU reduction order, not state, differs), so the generator's loss values match to 1e-5.
    straight, resumed = rows_of(tmp_path / "straight"), rows_of(out)
    assert [r.keys() for r in resumed] == [r.keys() for r in straight]
    for a_row, b_row in zip(without_timing(straight), without_timing(resumed), strict=True):
        for key, value in a_row.items():
            if key.startswith("synthesis_") and value is not None:
                assert b_row[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
            else:
                assert b_row[key] == value, key
    a, b = torch.load(tmp_path / "straight" / "model.pt"), torch.load(out / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    pool_a = load_checkpoint(tmp_path / "straight").strategy_state["engine"]["pool"]["x"]
    pool_b = load_checkpoint(out).strategy_state["engine"]["pool"]["x"]
    assert (pool_a == pool_b).all()
    assert (
        summary_of(out)["ensemble_weights"] == summary_of(tmp_path / "straight")["ensemble_weights"]
    )


def test_a_client_that_fails_its_round_is_left_out_and_named(tmp_path, flwr_log):
    run_inprocess(config(tmp_path, "faults=[{partition: 2, round: 1, kind: crash}]"))
    s = summary_of(tmp_path)
    assert s["clients_used"] == [0, 1, 3] and s["clients_left_out"] == [2]
    assert len(s["ensemble_weights"]) == 3
    assert "clients [2] are left out" in flwr_log.text


def test_too_few_usable_clients_stop_the_run_naming_them(tmp_path):
    faults = "faults=[{partition: 0, round: 1, kind: crash}, {partition: 1, round: 1, kind: crash}]"
    with pytest.raises(RuntimeError, match=r"Left out: \[0, 1\]"):
        run_inprocess(config(tmp_path, faults, "min_clients=3"))


def test_ablation_switches(tmp_path):
    run_inprocess(config(tmp_path / "ee", "strategy.boost.reweight=false"))
    assert all(r["ensemble_weights"] == [0.25] * 4 for r in rows_of(tmp_path / "ee")[2:])
    s = summary_of(tmp_path / "ee")
    assert s["ensemble_accuracy_learned"] == s["ensemble_accuracy_uniform"]
    run_inprocess(config(tmp_path / "ghs", "strategy.synthesis.hardness=0"))
    a = rows_of(tmp_path / "ghs")[2]["synthesis_ce"]
    b = rows_of(tmp_path / "ee")[2]["synthesis_ce"]
    assert a != b


def test_dense_and_fadi_defaults(tmp_path):
    dense = config(tmp_path / "dense", name="dense").strategy.params
    assert dense.synthesis.hardness == 0 and dense.synthesis.adv_mask
    assert not dense.boost.reweight and not dense.boost.diversify
    # A DENSE override keeps DENSE's other defaults.
    d2 = config(tmp_path / "d2", "strategy.synthesis.steps=7", name="dense").strategy.params
    assert d2.synthesis.steps == 7 and d2.synthesis.adv_mask and d2.synthesis.hardness == 0
    run_inprocess(config(tmp_path / "dense", name="dense"))
    assert all(r["ensemble_weights"] == [0.25] * 4 for r in rows_of(tmp_path / "dense")[2:])
    cfg = config(tmp_path / "fadi", "model.name=cnn_bn", name="fadi")
    assert cfg.strategy.params.synthesis.source == "pixels"
    run_inprocess(cfg)
    row = rows_of(tmp_path / "fadi")[2]
    assert row["synthesis_bn"] > 0 and "synthesis_tv" in row


def test_fadi_needs_batch_norm(tmp_path):
    with pytest.raises(ConfigError) as err:
        preflight(config(tmp_path, name="fadi"))
    assert err.value.key == "model.name" and "BatchNorm2d" in str(err.value)


@pytest.mark.parametrize(
    "overrides, key, problem",
    [
        (["rounds=3"], "rounds", "must be 1"),
        (["strategy.boost.epsilon=-0.1"], "strategy.boost.epsilon", ">= 0"),
        (["strategy.boost.mu=0"], "strategy.boost.mu", "> 0"),
        (["strategy.synthesis.steps=0"], "strategy.synthesis.steps", ">= 1"),
        (["strategy.boost.variant=foo"], "strategy.boost.variant", "paper"),
        (["strategy.student_init=zero"], "strategy.student_init", "fresh"),
        (["data.dataset=four_gaussians"], "data.dataset", "multiples of 4"),
    ],
)
def test_bad_parameters_are_refused_naming_the_key(tmp_path, overrides, key, problem):
    with pytest.raises(ConfigError) as err:
        preflight(config(tmp_path, *overrides))
    assert err.value.key == key and problem in str(err.value)


def test_server_holds_no_data_and_student_can_start_from_the_average(tmp_path):
    cfg = config(tmp_path, "strategy.student_init=average", "strategy.epochs=1")
    assert cfg.data.server_fraction == 0
    run_inprocess(cfg)
    first = rows_of(tmp_path)[1]["test_accuracy"]
    run_inprocess(config(tmp_path / "avg", "strategy.epochs=1", name="oneshot"))
    assert first == rows_of(tmp_path / "avg")[1]["test_accuracy"]  # student = the average
    assert np.isfinite(summary_of(tmp_path)["final_accuracy"])


def test_coboosting_with_fedgo_odds_in_the_one_round(tmp_path):
    cfg = config(tmp_path, "strategy.discriminator.epochs=1", name="coboosting_fedgo")
    assert cfg.strategy.params.generator.steps == 0  # untrained generator, no server data
    run_inprocess(cfg)
    rows = rows_of(tmp_path)
    assert rows[1]["clients_replied"] == 4
    assert rows[1]["clients_failed"] == 0  # every reply carried a usable discriminator
    s = summary_of(tmp_path)
    for key in ("ensemble_accuracy_fedgo", "ensemble_accuracy_learned", "final_accuracy"):
        assert 0 <= s[key] <= 1
    assert s["ensemble_weights"] != [0.25] * 4
    run_inprocess(
        config(
            tmp_path / "odds",
            "strategy.discriminator.epochs=1",
            "strategy.combine=odds",
            f"strategy.teachers_from={tmp_path}",  # the models and discriminators, reused
            name="coboosting_fedgo",
        )
    )
    assert rows_of(tmp_path / "odds")[1]["uploads_reused"] == 1
    odds = summary_of(tmp_path / "odds")
    assert odds["ensemble_weights"] == [0.25] * 4
    assert odds["ensemble_accuracy_learned"] == odds["ensemble_accuracy_fedgo"]
    assert odds["ensemble_accuracy_fedgo"] == s["ensemble_accuracy_fedgo"]  # same discriminators


def test_a_reply_without_a_discriminator_is_refused(tmp_path):
    from flwr.app import ArrayRecord, RecordDict

    from fedgo_flwr.learning.task import load_bundle, make_partition, new_model
    from strategies.base import ServerResources
    from strategies.coboosting_fedgo import CoBoostingFedGO

    cfg = config(tmp_path, name="coboosting_fedgo")
    bundle = load_bundle(cfg.data)
    res = ServerResources(bundle, make_partition(cfg), torch.device("cpu"), tmp_path)
    strategy = CoBoostingFedGO(cfg, {p: p + 1 for p in range(4)}, new_model(cfg, bundle), res)
    assert "no ArrayRecord 'discriminator'" in strategy.check_reply(RecordDict({}))
    wrong = RecordDict({"discriminator": ArrayRecord({"w": torch.zeros(3)})})
    assert "discriminator" in strategy.check_reply(wrong)


def test_fedgo_generator_training_needs_server_data(tmp_path):
    with pytest.raises(ConfigError) as err:
        preflight(config(tmp_path, "strategy.generator.steps=10", name="coboosting_fedgo"))
    assert err.value.key == "data.server_fraction"


def test_uploads_are_reused_by_another_method(tmp_path):
    """teachers_from: the same uploaded models without training the clients again."""
    run_inprocess(config(tmp_path / "oneshot", name="oneshot"))
    assert (tmp_path / "oneshot" / "client_models.pt").is_file()
    run_inprocess(config(tmp_path / "trained"))
    run_inprocess(config(tmp_path / "reused", f"strategy.teachers_from={tmp_path / 'oneshot'}"))
    rows = rows_of(tmp_path / "reused")
    assert rows[1]["uploads_reused"] == 1 and rows[1]["clients_replied"] == 4
    a = torch.load(tmp_path / "trained" / "model.pt")
    b = torch.load(tmp_path / "reused" / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (
        summary_of(tmp_path / "reused")["ensemble_weights"]
        == summary_of(tmp_path / "trained")["ensemble_weights"]
    )
    with pytest.raises(ConfigError) as err:
        preflight(
            config(
                tmp_path / "other",
                "train.local_epochs=3",
                f"strategy.teachers_from={tmp_path / 'oneshot'}",
            )
        )
    assert err.value.key == "strategy.teachers_from" and "train differ" in str(err.value)
    with pytest.raises(ConfigError, match="discriminators"):
        preflight(
            config(
                tmp_path / "fedgo",
                f"strategy.teachers_from={tmp_path / 'oneshot'}",
                name="coboosting_fedgo",
            )
        )
    with pytest.raises(ConfigError, match="does not exist"):
        preflight(config(tmp_path / "x", f"strategy.teachers_from={tmp_path / 'nothing'}"))


def test_clients_of_other_architectures(tmp_path):
    """Co-Boosting's model market: the ensemble meets in the logits, the student is model.name."""
    cfg = config(tmp_path, "model.client_models=[cnn, lenet5]")
    run_inprocess(cfg)
    s = summary_of(tmp_path)
    assert s["clients_used"] == [0, 1, 2, 3] and len(s["ensemble_weights"]) == 4
    saved = torch.load(tmp_path / "client_models.pt")
    shapes = {
        k: {n: tuple(v.shape) for n, v in e["state"].items()} for k, e in saved["clients"].items()
    }
    assert shapes["0"] == shapes["2"] and shapes["1"] == shapes["3"] and shapes["0"] != shapes["1"]
    for name in ("oneshot",):
        with pytest.raises(ConfigError) as err:
            config(tmp_path / name, "model.client_models=[cnn, lenet5]", name=name)
        assert err.value.key == "model.client_models"
    with pytest.raises(ConfigError) as err:
        config(
            tmp_path / "avg", "model.client_models=[cnn, lenet5]", "strategy.student_init=average"
        )
    assert err.value.key == "strategy.student_init"


def test_fedgo_generator_trained_on_a_server_share(tmp_path, monkeypatch):
    """G1 in the one-shot setting: the generator is trained on the server's share first (and
    not at all with steps 0, the default)."""
    import strategies.coboosting_fedgo as module

    calls = []
    original = module.train_generator

    def counting(generator, cfg, data, device, shape):
        calls.append(len(data))
        return original(generator, cfg, data, device, shape)

    monkeypatch.setattr(module, "train_generator", counting)
    common = ["data.server_fraction=0.3", "strategy.discriminator.epochs=1", "strategy.epochs=1"]
    run_inprocess(config(tmp_path / "u", *common, name="coboosting_fedgo"))
    assert calls == []
    g1 = [
        "strategy.generator.steps=2",
        "strategy.generator.width=8",
        "strategy.generator.batch_size=16",
        "strategy.generator.n_critic=1",
    ]
    run_inprocess(config(tmp_path / "g1", *common, *g1, name="coboosting_fedgo"))
    cfg = config(tmp_path / "x", *common, name="coboosting_fedgo")
    from fedgo_flwr.learning.task import make_partition

    assert calls == [len(make_partition(cfg).server)]
    assert summary_of(tmp_path / "g1")["clients_used"] == [0, 1, 2, 3]


def _stopped_after(monkeypatch, cls, uploads: int) -> None:
    """Make ``cls``'s clients' round stop (KeyboardInterrupt, as a killed process) once
    ``uploads`` uploads were taken and kept."""
    import strategies.oneshot as oneshot_module
    from strategies.oneshot import OneShot

    monkeypatch.setattr(oneshot_module, "KEEP_EVERY", 0.0)  # every upload, in a round of seconds
    original = OneShot.keeping_uploads

    def stopping(self, replies):
        for msg in original(self, replies):
            if len(self.teachers) >= uploads:
                raise KeyboardInterrupt
            yield msg
        if len(self.teachers) >= uploads:
            raise KeyboardInterrupt

    monkeypatch.setattr(cls, "keeping_uploads", stopping)


@pytest.mark.parametrize("name", ["oneshot", "coboosting_fedgo"])
def test_a_clients_round_stopped_half_way_goes_on_with_the_missing_clients(
    tmp_path, monkeypatch, name
):
    """A clients' round stopped after 2 of 4 uploads keeps them (client_models.partial.pt);
    the resumed run sends training only to the 2 missing clients and ends with the uploads,
    rows and model of an uninterrupted run."""
    from strategies import strategy_class
    from strategies.oneshot import PARTIAL_FILE, UPLOADS_FILE

    extra = ["strategy.discriminator.epochs=1"] if name == "coboosting_fedgo" else []
    run_inprocess(config(tmp_path / "straight", *extra, name=name))
    out = tmp_path / "cut"
    cls = strategy_class(name)
    with monkeypatch.context() as m:
        _stopped_after(m, cls, 2)
        with pytest.raises(KeyboardInterrupt):
            run_inprocess(config(out, *extra, name=name))
    kept = torch.load(out / PARTIAL_FILE, weights_only=True)
    assert len(kept["clients"]) == 2 and not (out / UPLOADS_FILE).exists()
    trained = []
    import strategies.oneshot as oneshot_module

    real_stream = oneshot_module.stream_replies

    def stream(grid, messages, timeout):
        trained.extend(int(m.metadata.group_id) for m in messages)
        return real_stream(grid, messages, timeout)

    monkeypatch.setattr(oneshot_module, "stream_replies", stream)
    run_inprocess(config(out, *extra, "resume=true", name=name))
    assert sorted(trained) == sorted(set(range(4)) - {int(k) for k in kept["clients"]})
    assert not (out / PARTIAL_FILE).exists()
    a = torch.load(tmp_path / "straight" / UPLOADS_FILE, weights_only=True)
    b = torch.load(out / UPLOADS_FILE, weights_only=True)
    assert a["clients"].keys() == b["clients"].keys()
    for pid, entry in a["clients"].items():
        for key, value in entry["state"].items():
            assert torch.equal(value, b["clients"][pid]["state"][key]), (pid, key)
    straight, resumed = rows_of(tmp_path / "straight"), rows_of(out)
    assert resumed[1]["clients_replied"] == 4 and resumed[1]["clients_failed"] == 0
    for key in ("ensemble_accuracy_uniform", "ensemble_accuracy_data_size"):
        assert resumed[1][key] == straight[1][key]
    assert resumed[-1]["test_accuracy"] == straight[-1]["test_accuracy"]


def test_kept_uploads_of_other_settings_are_not_used(tmp_path, monkeypatch, flwr_log):
    from strategies.oneshot import PARTIAL_FILE, OneShot

    out = tmp_path / "cut"
    with monkeypatch.context() as m:
        _stopped_after(m, OneShot, 2)
        with pytest.raises(KeyboardInterrupt):
            run_inprocess(config(out, name="oneshot"))
    run_inprocess(config(out, "resume=true", "train.local_epochs=1", name="oneshot"))
    assert any(
        PARTIAL_FILE in r.getMessage() and "other settings" in r.getMessage()
        for r in flwr_log.records
    )
    assert rows_of(out)[1]["clients_replied"] == 4
    assert not (out / PARTIAL_FILE).exists()
