"""CPFL (paper 003): cohorts, the stopping rule, the stage-2 math, the clock, and whole runs."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import rows_of, without_timing
from torch import nn

from fedgo_app.cli import preflight
from fedgo_app.inprocess import run_inprocess
from fedgo_flwr.config.experiment import ConfigError
from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.learning.cohorts import (
    CohortDistillConfig,
    PlateauStopper,
    batches_per_epoch,
    class_cohorts,
    combine_teachers,
    distill_l1,
    holdout_size,
    holdout_split,
    random_cohorts,
    teacher_weights,
)
from fedgo_flwr.records.checkpoint import load_checkpoint
from strategies import load_experiment
from strategies.cpfl import CPFL

ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "data.num_clients=8",
    "rounds=6",
    "strategy.cohorts=2",
    "strategy.window=2",
    "strategy.patience=3",
    "strategy.cohort_eval_every=0",
    "strategy.distill.epochs=2",
    "checkpoint=false",
]


def config(out: Path, *overrides: str):
    return load_experiment(ROOT / "conf/cpfl.yaml", [*TINY, f"output_dir={out}", *overrides])


def summary_of(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


# -- cohorts and the validation split --------------------------------------------------------


def test_random_cohorts_are_a_seeded_near_equal_partition():
    groups = random_cohorts(10, 3, seed=0)
    assert [len(g) for g in groups] == [4, 3, 3]  # the first K mod n get one more
    assert sorted(c for g in groups for c in g) == list(range(10))
    assert groups == random_cohorts(10, 3, seed=0)
    assert groups != random_cohorts(10, 3, seed=1)
    singles = random_cohorts(5, 5, seed=0)
    assert all(len(g) == 1 for g in singles) and sorted(g[0] for g in singles) == [0, 1, 2, 3, 4]
    assert random_cohorts(5, 1, seed=3) == [[0, 1, 2, 3, 4]]
    with pytest.raises(ValueError, match="cohorts must be in 1..5"):
        random_cohorts(5, 6, seed=0)


def test_class_cohorts_group_clients_by_dominant_class():
    hist = np.array([[5, 1, 0], [0, 9, 1], [3, 3, 0], [0, 0, 4], [1, 7, 0]])
    assert class_cohorts(hist) == [[0, 2], [1, 4], [3]]  # a tie goes to the lower class


def test_the_validation_split_is_ten_percent_of_clients_with_ten_samples():
    assert holdout_size(9, 0.1, 10) == 0
    assert holdout_size(10, 0.1, 10) == 1
    assert holdout_size(255, 0.1, 10) == 25
    assert holdout_size(100, 0.0, 10) == 0
    train, val = holdout_split(50, 0.1, 10, seed=0, client=3)
    assert len(val) == 5 and len(train) == 45
    assert sorted([*train, *val]) == list(range(50))
    again = holdout_split(50, 0.1, 10, seed=0, client=3)
    assert np.array_equal(val, again[1])  # the same split every round
    assert not np.array_equal(val, holdout_split(50, 0.1, 10, seed=0, client=4)[1])


def test_batches_per_epoch_follows_the_training_loop():
    assert batches_per_epoch(40, 20) == 2
    assert batches_per_epoch(41, 20) == 2  # the last batch of one sample is dropped
    assert batches_per_epoch(42, 20) == 3
    assert batches_per_epoch(1, 20) == 1


# -- the stopping rule -----------------------------------------------------------------------


def test_the_moving_average_stops_after_patience_rounds_without_a_new_minimum():
    s = PlateauStopper(window=3, patience=2)
    # smoothed: 6, (6+4)/2=5, (6+4+2)/3=4, (4+2+9)/3=5, (2+9+9)/3=6.67 -> stop
    assert s.observe(6.0) and s.smoothed == 6.0
    assert s.observe(4.0) and s.smoothed == 5.0  # cumulative mean until the window fills
    assert s.observe(2.0) and s.smoothed == 4.0
    assert not s.observe(9.0) and s.smoothed == 5.0 and not s.stopped
    assert not s.observe(9.0) and s.stopped and s.best == 4.0


def test_a_new_minimum_resets_the_counter_and_a_round_without_loss_counts():
    s = PlateauStopper(window=1, patience=3)
    s.observe(5.0)
    s.observe(6.0)
    s.observe(None)  # nobody reported a loss: no improvement
    assert s.counter == 2
    assert s.observe(1.0) and s.counter == 0
    restored = PlateauStopper.from_state(json.loads(json.dumps(s.state())))
    assert restored == s
    with pytest.raises(ValueError, match="window"):
        PlateauStopper(window=0)
    with pytest.raises(ValueError, match="patience"):
        PlateauStopper(patience=0)


# -- stage 2 ---------------------------------------------------------------------------------


def test_per_class_label_weights():
    counts = np.array([[30, 0, 5], [10, 0, 15]])
    w = teacher_weights(counts, "label")
    assert np.allclose(w, [[0.75, 0.5, 0.25], [0.25, 0.5, 0.75]])  # class 1: nobody -> 1/n
    assert np.allclose(w.sum(axis=0), 1.0)
    assert np.allclose(teacher_weights(counts, "size"), [[35 / 60] * 3, [25 / 60] * 3])
    assert np.allclose(teacher_weights(counts, "uniform"), 0.5)
    with pytest.raises(ValueError, match="unknown teacher weighting"):
        teacher_weights(counts, "entropy")


def test_the_target_weights_each_class_of_each_teacher():
    logits = torch.tensor([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]])  # (2, 2, 2)
    weights = np.array([[0.25, 1.0], [0.75, 0.0]])
    target = combine_teachers(logits, weights)
    assert torch.allclose(target, torch.tensor([[0.25 + 3.75, 2.0], [0.75 + 5.25, 4.0]]))
    with pytest.raises(ValueError, match="disagree"):
        combine_teachers(logits, np.ones((3, 2)))


def test_l1_distillation_moves_the_student_to_the_target():
    torch.manual_seed(0)
    data = ArrayDataset(
        x=np.random.default_rng(0).normal(size=(64, 5)), y=np.zeros(64), num_classes=3
    )
    teacher = nn.Linear(5, 3)
    targets = teacher(data.to_tensors()[0]).detach()
    student = nn.Linear(5, 3)

    def l1() -> float:
        return float((student(data.to_tensors()[0]) - targets).abs().mean())

    before = l1()
    cfg = CohortDistillConfig(epochs=60, batch_size=16, lr=0.02)
    result = distill_l1(
        student,
        data,
        targets,
        cfg,
        rng=torch.Generator().manual_seed(0),
        device=torch.device("cpu"),
    )
    assert l1() < 0.2 * before
    assert result.steps == 60 * 4 and result.epoch_losses[-1] < result.epoch_losses[0]


# -- whole runs ------------------------------------------------------------------------------


def test_one_cohort_is_fedavg(tmp_path):
    """n = 1 without a validation split and with patience beyond the rounds: FedAvg's model."""
    common = [
        "data.num_clients=6",
        "data.server_fraction=0.3",
        "rounds=3",
        "fraction=1.0",
        "train.local_epochs=1",
    ]
    fedavg = load_experiment(
        ROOT / "conf/fedavg.yaml",
        [*common, f"output_dir={tmp_path / 'fedavg'}", "checkpoint=false"],
    )
    run_inprocess(fedavg)
    run_inprocess(
        config(
            tmp_path / "cpfl",
            *common,
            "strategy.cohorts=1",
            "strategy.val_fraction=0",
            "strategy.patience=10",
        )
    )
    a, b = torch.load(tmp_path / "fedavg" / "model.pt"), torch.load(tmp_path / "cpfl" / "model.pt")
    for key, value in a.items():
        assert torch.equal(value, b[key]), key
    accs = [r["test_accuracy"] for r in rows_of(tmp_path / "cpfl")]
    assert accs == [r["test_accuracy"] for r in rows_of(tmp_path / "fedavg")]
    s = summary_of(tmp_path / "cpfl")
    assert s["cohort_status"] == ["max_rounds"] and s["distill_time_s"] == 0.0
    assert s["bytes_total"] == 3 * 6 * 2 * s["model_bytes"]  # no upload to a global server


def test_cohorts_stop_on_their_own_and_are_distilled(tmp_path):
    run_inprocess(config(tmp_path, "rounds=40"))
    s = summary_of(tmp_path)
    assert s["cohorts"] == 2 and sum(s["cohort_sizes"]) == 8
    assert "converged" in s["cohort_status"]
    for status, rounds in zip(s["cohort_status"], s["cohort_rounds"], strict=True):
        assert rounds < 40 if status == "converged" else status == "max_rounds" and rounds == 40
    assert s["sim_time_to_convergence_h"] == pytest.approx(max(s["cohort_finish_h"]))
    assert 0 <= s["final_accuracy"] <= 1 and len(s["teacher_accuracies"]) == 2
    assert s["public_size"] > 0 and len(s["distill_epoch_losses"]) == 2
    rows = rows_of(tmp_path)
    assert all(r["test_accuracy"] is None for r in rows[1:-1])  # no single model in stage 1
    assert rows[-1]["test_accuracy"] == s["final_accuracy"]
    # A cohort trains until the round it stopped in, and no further.
    for cohort, rounds in enumerate(s["cohort_rounds"]):
        ran = [r["round"] for r in rows[1:] for c in r.get("cohorts", []) if c["cohort"] == cohort]
        assert ran == list(range(1, rounds + 1))


def test_the_clock_on_a_hand_made_profile(tmp_path):
    """Every client: 2 s per mini-batch, 1 MB/s. A round of a cohort lasts its slowest
    client's download + batches x 2 s + upload; the cohort's time is the sum of its rounds."""
    profiles = tmp_path / "devices.csv"
    rows = ["client_id,seconds_per_batch,bytes_per_second"] + [f"{i},2.0,1e6" for i in range(8)]
    profiles.write_text("\n".join(rows) + "\n")
    out = tmp_path / "run"
    run_inprocess(config(out, f"strategy.profiles={profiles}", "rounds=3", "strategy.patience=50"))
    s = summary_of(out)
    part = json.loads((out / "partition.json").read_text())
    cfg = config(out)
    groups = random_cohorts(8, 2, cfg.seed)
    size = s["model_bytes"]
    for cohort, members in enumerate(groups):
        batches = [
            batches_per_epoch(n - holdout_size(n, 0.1, 10), cfg.train.batch_size)
            for n in (part["client_sizes"][k] for k in members)
        ]
        per_round = max(2 * size / 1e6 + 2.0 * b for b in batches)
        assert s["cohort_finish_h"][cohort] == pytest.approx(3 * per_round / 3600)
    train_batches = sum(
        batches_per_epoch(n - holdout_size(n, 0.1, 10), cfg.train.batch_size)
        for n in part["client_sizes"]
    )
    assert s["cpu_hours"] == pytest.approx(3 * 2.0 * train_batches / 3600)
    assert s["bytes_total"] == 3 * 8 * 2 * size + 2 * (size + 8 * 10)


def test_one_client_per_cohort_is_one_shot_kd_without_round_traffic(tmp_path):
    run_inprocess(config(tmp_path, "data.num_clients=4", "strategy.cohorts=4", "rounds=3"))
    s = summary_of(tmp_path)
    assert s["cohort_sizes"] == [1, 1, 1, 1]
    assert s["bytes_total"] == 4 * (s["model_bytes"] + 8 * 10)  # only the final uploads


def test_resume_continues_every_cohort(tmp_path, monkeypatch):
    overrides = ["checkpoint=true", "rounds=12", "strategy.patience=4"]
    run_inprocess(config(tmp_path / "straight", *overrides))
    original = CPFL.aggregate_cohorts

    def dying(self, server_round, replies):
        if server_round == 5:
            raise KeyboardInterrupt
        return original(self, server_round, replies)

    out = tmp_path / "resumed"
    with monkeypatch.context() as m:
        m.setattr(CPFL, "aggregate_cohorts", dying)
        with pytest.raises(KeyboardInterrupt):
            run_inprocess(config(out, *overrides))
    assert load_checkpoint(out).round == 4
    run_inprocess(config(out, *overrides, "resume=true"))
    assert without_timing(rows_of(out)) == without_timing(rows_of(tmp_path / "straight"))
    a, b = torch.load(tmp_path / "straight" / "model.pt"), torch.load(out / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    straight, resumed = summary_of(tmp_path / "straight"), summary_of(out)
    for key in ("cohort_finish_h", "cohort_rounds", "cpu_hours", "bytes_total", "final_accuracy"):
        assert resumed[key] == straight[key], key


def test_a_cohort_whose_client_always_fails_is_left_out(tmp_path, flwr_log):
    cfg = config(
        tmp_path,
        "data.num_clients=4",
        "strategy.cohorts=4",
        "rounds=3",
        "faults=[{partition: 2, round: 0, kind: crash}]",
    )
    run_inprocess(cfg)
    s = summary_of(tmp_path)
    left_out = [c for c, members in enumerate(random_cohorts(4, 4, cfg.seed)) if members == [2]]
    assert s["cohorts_left_out"] == left_out
    assert len(s["cohorts_distilled"]) == 3 and "final_accuracy" in s
    assert "never got a usable reply" in flwr_log.text


def test_a_cohort_keeps_its_model_in_a_round_all_its_clients_fail(tmp_path):
    cfg = config(
        tmp_path,
        "data.num_clients=4",
        "strategy.cohorts=4",
        "rounds=3",
        "faults=[{partition: 1, round: 2, kind: crash}]",
    )
    run_inprocess(cfg)
    rows = rows_of(tmp_path)
    cohort = next(c for c, m in enumerate(random_cohorts(4, 4, cfg.seed)) if m == [1])
    entry = next(c for c in rows[2]["cohorts"] if c["cohort"] == cohort)
    assert entry["clients_replied"] == 0 and entry["val_loss"] is None
    assert summary_of(tmp_path)["cohort_rounds"][cohort] == 3


def test_distilling_when_half_the_cohorts_converged(tmp_path):
    full, half = tmp_path / "full", tmp_path / "half"
    common = ["data.num_clients=8", "strategy.cohorts=4", "rounds=40", "strategy.patience=2"]
    run_inprocess(config(full, *common))
    run_inprocess(config(half, *common, "strategy.distill_when=0.5"))
    a, b = summary_of(full), summary_of(half)
    finish = sorted(a["cohort_finish_h"])
    assert b["sim_time_to_convergence_h"] == pytest.approx(finish[1])
    assert b["cpu_hours"] < a["cpu_hours"]
    assert "paused" in b["cohort_status"] or b["cohort_finish_h"] != a["cohort_finish_h"]


def test_distilling_at_a_fixed_simulated_time(tmp_path):
    run_inprocess(
        config(tmp_path, "rounds=40", "strategy.distill_at_hours=0.05", "strategy.patience=30")
    )
    s = summary_of(tmp_path)
    assert all(h <= 0.05 + 1e-9 for h in s["cohort_finish_h"])
    assert s["cohort_status"] == ["paused", "paused"]
    assert s["sim_time_to_convergence_h"] <= 0.05


def test_a_public_image_folder_is_resized_and_distilled_on(tmp_path):
    from PIL import Image

    folder = tmp_path / "public" / "any" / "depth"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(12):
        Image.fromarray(rng.integers(0, 255, (24, 24, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    data = tmp_path / "cifar"
    for split in ("train", "test"):
        for c in range(3):
            d = data / split / f"c{c}"
            d.mkdir(parents=True)
            for i in range(12 if split == "train" else 3):
                Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(
                    d / f"{i}.png"
                )
    out = tmp_path / "run"
    run_inprocess(
        config(
            out,
            "data.dataset=imagefolder",
            f"data.path={data}",
            "data.num_clients=4",
            "data.server_fraction=0",
            f"data.public_path={tmp_path / 'public'}",
            "rounds=2",
            "model.name=cnn",
        )
    )
    assert summary_of(out)["public_size"] == 12


@pytest.mark.parametrize(
    ("overrides", "key", "problem"),
    [
        (["strategy.cohorts=9"], "strategy.cohorts", "more cohorts than clients"),
        (["strategy.window=0"], "strategy.window", "must be >= 1"),
        (["strategy.patience=0"], "strategy.patience", "must be >= 1"),
        (["strategy.distill_when=0"], "strategy.distill_when", "must be in (0, 1]"),
        (["strategy.local_algorithm=scaffold"], "strategy.local_algorithm", "server-side state"),
        (
            ["strategy.local_params={mu: -1}", "strategy.local_algorithm=fedprox"],
            "strategy.local_params.mu",
            ">= 0",
        ),
        (["strategy.distill.weights=entropy"], "strategy.distill.weights", "label"),
    ],
)
def test_bad_parameters_are_refused_naming_the_key(tmp_path, overrides, key, problem):
    with pytest.raises(ConfigError) as err:
        config(tmp_path, *overrides)
    assert err.value.key == key and problem in str(err.value)


def test_profile_problems_are_refused_before_the_run(tmp_path):
    with pytest.raises(ConfigError, match="strategy.profiles.*cannot be read"):
        preflight(config(tmp_path, f"strategy.profiles={tmp_path / 'missing.csv'}"))
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "client_id,seconds_per_batch,bytes_per_second\n"
        + "".join(f"{i},1.0,{'-5' if i == 3 else '1e6'}\n" for i in range(8))
    )
    with pytest.raises(ConfigError, match=r"bad.csv:5, column bytes_per_second"):
        preflight(config(tmp_path, f"strategy.profiles={bad}"))


def test_a_public_folder_is_refused_by_other_strategies(tmp_path):
    with pytest.raises(ConfigError, match="data.public_path.*only cpfl, dafkd, feddf"):
        preflight(load_experiment(ROOT / "conf/fedavg.yaml", [f"data.public_path={tmp_path}"]))
    with pytest.raises(ConfigError, match="data.public_path.*no such folder"):
        preflight(config(tmp_path, f"data.public_path={tmp_path / 'nothing'}"))


def test_cohort_odds_weights_sum_their_clients_fedgo_weights():
    from fedgo_flwr.learning.cohorts import cohort_odds_weights, combine_per_sample

    client = torch.tensor([[0.1, 0.5], [0.2, 0.25], [0.7, 0.25]])  # (K=3, N=2), columns sum to 1
    cohorts = cohort_odds_weights(client, [[0, 2], [1]])
    assert torch.allclose(cohorts, torch.tensor([[0.8, 0.75], [0.2, 0.25]]))
    logits = torch.tensor([[[1.0, 0.0], [2.0, 2.0]], [[0.0, 1.0], [4.0, 0.0]]])
    target = combine_per_sample(logits, cohorts)
    assert torch.allclose(target, torch.tensor([[0.8, 0.2], [0.75 * 2 + 0.25 * 4, 1.5]]))


def test_fedgo_weighted_distillation_of_cohorts(tmp_path):
    gan = [
        "strategy.distill.weights=fedgo",
        "strategy.generator.steps=3",
        "strategy.generator.width=8",
        "strategy.generator.batch_size=16",
        "strategy.generator.n_critic=1",
        "strategy.discriminator.epochs=1",
    ]
    run_inprocess(config(tmp_path, *gan))
    s = summary_of(tmp_path)
    prefl = json.loads((tmp_path / "prefl.json").read_text())
    assert sorted(prefl["discriminators"]) == [str(k) for k in range(8)]
    assert "disc_stats_public" in s and math.isfinite(s["final_accuracy"])
    assert (tmp_path / "discriminators.pt").exists()


def test_teachers_can_be_evaluated_on_a_test_subset(tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    run_inprocess(config(full))
    run_inprocess(config(part, "strategy.teacher_test_size=50"))
    a, b = summary_of(full), summary_of(part)
    assert a["final_accuracy"] == b["final_accuracy"]  # the student: the whole test split
    assert a["teacher_accuracies"] != b["teacher_accuracies"]
    assert all(
        round(acc * 50) == pytest.approx(acc * 50, abs=1e-4) for acc in b["teacher_accuracies"]
    )


def test_cohorts_by_dominant_class(tmp_path, flwr_log):
    with pytest.raises(ConfigError, match="strategy.cohorts.*one cohort per class: set it to 10"):
        preflight(config(tmp_path, "strategy.grouping=class", "strategy.cohorts=3"))
    cfg = config(tmp_path, "strategy.grouping=class", "strategy.cohorts=8", "data.num_clients=8")
    with pytest.raises(ConfigError, match="set it to 10"):
        preflight(cfg)
    run_inprocess(
        config(
            tmp_path,
            "strategy.grouping=class",
            "strategy.cohorts=10",
            "data.num_clients=10",
            "rounds=2",
            "overwrite=true",
        )
    )
    s = summary_of(tmp_path)
    part = json.loads((tmp_path / "partition.json").read_text())
    dominant = np.argmax(np.array(part["class_histogram"]), axis=1)
    assert s["cohort_sizes"] == [int((dominant == c).sum()) for c in range(10)]
    empty = [c for c in range(10) if s["cohort_sizes"][c] == 0]
    assert [s["cohort_status"][c] for c in empty] == ["empty"] * len(empty)
    assert all(c not in s["cohorts_distilled"] for c in empty)


def test_the_ensemble_accuracy_is_that_of_the_distillation_target(tmp_path, monkeypatch):
    """With ``outputs: log_probs`` the reported ensemble combines log-probabilities, as the
    target does: a teacher with a large logit offset cannot decide it."""
    import strategies._cpfl_distill as cpfl_module

    seen = []
    original = cpfl_module.combine_teachers

    def spy(logits, weights):
        seen.append(logits.clone())
        return original(logits, weights)

    monkeypatch.setattr(cpfl_module, "combine_teachers", spy)
    run_inprocess(config(tmp_path, "strategy.distill.outputs=log_probs"))
    test_part, public_part = seen  # the ensemble on the test images, then the target
    for part in (test_part, public_part):
        assert torch.allclose(part.exp().sum(-1), torch.ones(part.shape[:2]), atol=1e-4)


# -- what the stopping rule sees and keeps ---------------------------------------------------


def test_the_client_reports_the_received_models_validation_loss(tmp_path):
    """CPFL Sec. 4.1 (the code's ``val_loss_global_model``): the loss is of the cohort model as
    received, on the client's held-out split, before local training changes it."""
    import copy

    from flwr.app import RecordDict

    from clients.base import ClientJob
    from clients.cpfl import CPFLClient
    from fedgo_flwr.learning.training import evaluate
    from fedgo_flwr.models.classifiers import build_model
    from fedgo_flwr.protocol.cpfl import PROTOCOL
    from fedgo_flwr.runtime.rng import make_rng

    cfg = config(tmp_path, "train.local_epochs=3")
    rng = np.random.default_rng(0)
    data = ArrayDataset(
        x=rng.normal(size=(40, 1, 8, 8)).astype(np.float32),
        y=rng.integers(0, 10, size=40),
        num_classes=10,
    )
    params = PROTOCOL.Config(val_fraction=0.25, min_val_samples=2)
    torch.manual_seed(0)
    model = build_model("cnn", (1, 8, 8), 10)
    received = copy.deepcopy(model)
    _, val_idx = holdout_split(len(data), 0.25, 2, cfg.seed, 3)
    held_out = data.subset(val_idx)
    expected, _ = evaluate(received, held_out, cfg.eval.batch_size, torch.device("cpu"))
    job = ClientJob(
        cfg=cfg,
        params=params,
        partition_id=3,
        server_round=1,
        data=data,
        device=torch.device("cpu"),
        rng=make_rng(0),
        content=RecordDict(),
        state=RecordDict(),
        model=model,
    )
    stats, _ = CPFLClient().train(job)
    assert stats.metrics["val_examples"] == len(val_idx) == 10
    assert stats.metrics["val_loss"] == expected
    after, _ = evaluate(model, held_out, cfg.eval.batch_size, torch.device("cpu"))
    assert after != expected  # training moved the model: the test can tell the two apart


def test_the_best_model_is_the_one_whose_loss_was_reported(tmp_path, monkeypatch):
    """The loss reported in round r is of the model sent in round r, so a new minimum makes
    that model the cohort's best, not the one aggregated from round r's updates."""
    calls = {"n": 0}
    observe = PlateauStopper.observe

    def second_round_is_best(self, loss):
        calls["n"] += 1
        observe(self, loss)
        return calls["n"] == 2

    monkeypatch.setattr(PlateauStopper, "observe", second_round_is_best)
    out = tmp_path / "run"
    run_inprocess(
        config(out, "rounds=2", "strategy.cohorts=1", "strategy.patience=10", "checkpoint=true")
    )
    final = load_checkpoint(out)
    (tmp_path / "prev").mkdir()
    shutil.copy(out / "checkpoint.prev.pt", tmp_path / "prev" / "checkpoint.pt")
    previous = load_checkpoint(tmp_path / "prev")
    assert (final.round, previous.round) == (2, 1)
    cohort = final.strategy_state["cohorts"][0]
    assert cohort["best_round"] == 2
    sent = previous.strategy_state["cohorts"][0]["arrays"]  # after round 1: sent in round 2
    assert all(np.array_equal(cohort["best"][k], sent[k]) for k in sent)
    assert not all(np.array_equal(cohort["best"][k], cohort["arrays"][k]) for k in sent)
