"""Every upload a server combines is bounded, and the ensembles of client models are checked.

The bound (``strategy.aggregation.upload_bound``, :mod:`fedgo_flwr.learning.aggregation`) is tested
on plain arrays: it binds, it does not, and where it does not the result is the plain rule's bit
for bit. The runs then replay, each with one tampered reply in a tiny in-process run, what
one client could do before: FedGAN's pair, DaFKD's generator, FedTGP's prototypes and
SCAFFOLD's control deltas averaged without a bound, and one-shot ensembles (Co-Boosting and
its peers) taking a client model whose logits are NaN or huge. Each run must finish, name the
client in a WARNING, and keep its later rounds usable.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, RecordDict
from helpers import SMALL_GAN, rows_of, without_timing
from test_tampered_replies import tamper

from fedgo_app.inprocess import run_inprocess
from fedgo_flwr.config.experiment import ConfigError
from fedgo_flwr.datafree import SynthesisSettings, synthesize, weighted_logits
from fedgo_flwr.gan import discriminator_scale_outliers, neutralise_nonfinite
from fedgo_flwr.learning.aggregation import (
    DEFAULT_UPDATE_BOUND,
    DEFAULT_UPLOAD_BOUND,
    AggregationConfig,
    BoundedAverage,
    RunningAverage,
    bound_uploads,
    lower_median,
    new_average,
    norm_bound_scales,
    round_median,
    update_problem,
    upload_norm,
)
from fedgo_flwr.learning.distill import (
    MAX_TEACHER_LOGIT,
    TeacherBank,
    normalise_teachers,
    teacher_logits_problem,
    teacher_scales,
)
from fedgo_flwr.learning.task import sample_clients
from fedgo_flwr.protocol.dafkd import GENERATOR_KEY as DAFKD_GENERATOR_KEY
from fedgo_flwr.protocol.fedgo import CRITIC_KEY, DISCRIMINATOR_MESSAGE, FEDGAN_MESSAGE
from fedgo_flwr.protocol.fedgo import GENERATOR_KEY as FEDGAN_GENERATOR_KEY
from fedgo_flwr.protocol.fedtgp import PROTOS_KEY
from fedgo_flwr.protocol.oneshot_fedgo import DISCRIMINATOR_KEY
from fedgo_flwr.protocol.scaffold import CONTROL_DELTA_KEY
from fedgo_flwr.records.checkpoint import load_checkpoint
from fedgo_flwr.runtime import messages as msgs
from strategies import load_experiment

ROOT = Path(__file__).resolve().parents[2]
Edit = Callable[[RecordDict], None]
NO_UPDATE_BOUND = "strategy.aggregation.update_bound=null"  # the checks behind it, alone


# -- the bound on plain arrays -------------------------------------------------------------
def uploads(*scales: float, base: float = 1.0) -> list[dict[str, np.ndarray]]:
    """One upload per scale: a float32 (2, 3) array of ``base * scale`` and an int counter."""
    return [
        {"w": np.full((2, 3), base * s, dtype=np.float32), "n": np.asarray(np.int64(i))}
        for i, s in enumerate(scales)
    ]


def test_lower_median_lets_neither_of_two_set_it():
    assert lower_median([3.0, 1.0, 2.0]) == 2.0
    assert lower_median([5.0, 1e30]) == 5.0  # the mean of the middle two would be 5e29
    assert lower_median([4.0, 1.0, 3.0, 2.0]) == 2.0
    with pytest.raises(ValueError):
        lower_median([])


def test_round_median_gives_each_group_one_vote():
    # Client 0 has three huge rows, client 1 one small row: by rows the median is huge.
    norms = [1e30, 1e30, 1e30, 2.0]
    assert lower_median(norms) == 1e30
    assert round_median(norms, groups=[0, 0, 0, 1]) == 2.0


def test_norm_bound_scales():
    assert norm_bound_scales([1.0, 2.0, 3.0], 10.0) == [1.0, 1.0, 1.0]
    scales = norm_bound_scales([1.0, 2.0, 300.0], 10.0)  # bound 10 * 2
    assert scales[:2] == [1.0, 1.0] and scales[2] == pytest.approx(20.0 / 300.0)
    assert norm_bound_scales([1.0, 2.0, 20.0], 10.0)[2] == 1.0  # at the bound: kept
    assert norm_bound_scales([], 10.0) == []
    for factor in (0.5, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="factor"):
            norm_bound_scales([1.0], factor)


def test_the_bound_binds_on_an_upload_far_above_the_median():
    up = uploads(1.0, 2.0, 3.0, 1e30)
    out, bounded = bound_uploads(up, 10.0, clients=["a", "b", "c", "d"])
    assert [b.client for b in bounded] == ["d"] and bounded[0].index == 3
    median = upload_norm(up[1])  # lower median of the four norms: the second smallest
    assert float(upload_norm(out[3])) == pytest.approx(10.0 * float(median), rel=1e-6)
    np.testing.assert_allclose(out[3]["w"], 20.0, rtol=1e-6)  # same direction, 10 x median
    assert out[3]["w"].dtype == np.float32 and out[3]["n"] is up[3]["n"]  # ints as received
    assert all(out[i] == up[i] for i in range(3))
    assert bounded[0].ratio == pytest.approx(1e30 / 2.0, rel=1e-6)
    message = bounded[0].message("the generator")
    assert "the generator of client d" in message and "upload_bound = 10" in message


def test_an_update_is_bounded_towards_the_reference():
    reference = {"w": np.full((2, 3), 5.0, np.float32), "n": np.asarray(np.int64(0))}
    up = uploads(1.0, 1.1, 1e6, base=5.0)  # updates 0, 0.5, 5e6 per coordinate
    out, bounded = bound_uploads(up, 4.0, reference=reference)
    assert [b.index for b in bounded] == [2] and bounded[0].update
    # lower median of the update norms (0, 0.5*sqrt6, ...) is 0.5 * sqrt(6): bound 2 * sqrt(6)
    np.testing.assert_allclose(out[2]["w"], 5.0 + 2.0, rtol=1e-6)
    assert float(upload_norm(out[2], reference)) == pytest.approx(4.0 * 0.5 * np.sqrt(6))


def test_the_bound_does_not_bind_on_honest_spread_and_returns_the_same_arrays():
    up = uploads(1.0, 3.0, 0.5, 2.0)
    out, bounded = bound_uploads(up, 10.0)
    assert bounded == [] and all(o["w"] is u["w"] for o, u in zip(out, up, strict=True))
    out, bounded = bound_uploads(uploads(1.0, 1e30), None)  # null: off
    assert bounded == [] and out[1]["w"][0, 0] == np.float32(1e30)


@pytest.mark.parametrize("rule", ["mean", "median", "trimmed_mean"])
def test_unbound_average_is_the_plain_rules_bit_for_bit(rule):
    rng = np.random.default_rng(0)
    ups = [
        {"w": rng.normal(size=(5, 7)).astype(np.float32), "b": rng.normal(size=3)} for _ in range(6)
    ]
    weights = [3, 17, 1, 8, 5, 2]
    plain = new_average(AggregationConfig(rule=rule, upload_bound=None))
    bounded = BoundedAverage(AggregationConfig(rule=rule), "x", reference=ups[0])
    off = BoundedAverage(AggregationConfig(rule=rule, upload_bound=None), "x")
    for pid, (u, w) in enumerate(zip(ups, weights, strict=True)):
        plain.add(u, w)
        bounded.add(u, w, pid)
        off.add(u, w, pid)
    a, b, c = plain.result(), bounded.result(), off.result()
    assert bounded.bounded == []
    for key in a:
        assert a[key].dtype == b[key].dtype == c[key].dtype
        assert a[key].tobytes() == b[key].tobytes() == c[key].tobytes(), key


def test_bounded_average_scales_the_outlier_and_warns_naming_it(caplog):
    caplog.set_level(logging.WARNING, logger="flwr")
    logging.getLogger("flwr").propagate = True
    try:
        config = AggregationConfig(rule="mean", upload_bound=10.0)
        avg = BoundedAverage(config, "round 3: the critic")
        for pid, u in zip((4, 7, 9), uploads(1.0, 2.0, 1e30), strict=True):
            avg.add(u, 1.0, pid)
        out = avg.result()
    finally:
        logging.getLogger("flwr").propagate = False
    # (1 + 2 + 20) / 3: the outlier counts, at 10 x the median norm
    np.testing.assert_allclose(out["w"], 23.0 / 3.0, rtol=1e-6)
    assert [b.client for b in avg.bounded] == [9]
    texts = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("round 3: the critic of client 9" in t for t in texts), texts
    plain = RunningAverage()
    for u in uploads(1.0, 2.0, 1e30):
        plain.add(u, 1.0)
    assert plain.result()["w"][0, 0] > 1e29  # what it was without the bound


def test_bounded_average_checks_weights_and_keys():
    avg = BoundedAverage(AggregationConfig())
    with pytest.raises(ValueError, match="weight"):
        avg.add(uploads(1.0)[0], float("nan"))
    avg.add(uploads(1.0)[0], 1.0)
    with pytest.raises(ValueError, match="keys"):
        avg.add({"v": np.zeros(1)}, 1.0)


def test_update_problem_bounds_the_update_by_the_models_own_norm():
    x = {"w": np.array([3.0, 4.0], np.float32), "n": np.array(7)}  # ||x|| = 5; ints left out
    y = {"w": np.array([3.0 + 6.0, 4.0 + 8.0], np.float32), "n": np.array(10**9)}  # ||y-x|| 10
    assert update_problem(y, x, 2.0) is None  # exactly 2 x: within
    problem = update_problem(y, x, 1.9)
    assert problem is not None and "update norm 10 is 2 x the norm 5" in problem
    assert "strategy.aggregation.update_bound = 1.9" in problem
    assert update_problem(y, x, None) is None  # null: off
    zero = {"w": np.zeros(2, np.float32), "n": np.array(0)}
    assert update_problem(y, zero, 1.0) is None  # no scale to bound against
    huge = {"w": np.array([3.0, 3e38], np.float32), "n": np.array(7)}
    assert "above" in update_problem(huge, x, 1e30)  # no overflow of the squares
    assert update_problem(y, x, 1.9, scale=upload_norm(x)) == problem  # the caller's ||x||
    assert update_problem(y, x, 1.9, scale=100.0) is None  # taken as given


@pytest.mark.parametrize(
    ("overrides", "per_round"),
    # CPFL: round 1 sends both cohorts the one initial model, round 2 each cohort its own
    [(["strategy.name=fedavg"], [1, 1]), (["strategy.name=cpfl", "strategy.cohorts=2"], [1, 2])],
    ids=["fedavg", "cpfl"],
)
def test_the_sent_models_norm_is_taken_once_per_model_a_round(
    tmp_path, monkeypatch, overrides, per_round
):
    """Every client of a round (of a cohort) is bounded against the same sent model, so its
    norm is computed once a round per model, not once a reply."""
    import strategies._replies as replies

    calls: list[int] = []
    monkeypatch.setattr(replies, "upload_norm", lambda a: calls.append(1) or upload_norm(a))
    rounds: list[int] = []
    opened = replies.ReplyIntake.open

    def open_round(self, pids):
        rounds.append(len(calls))
        return opened(self, pids)

    monkeypatch.setattr(replies.ReplyIntake, "open", open_round)
    run_inprocess(config(tmp_path, *overrides, "fraction=1.0", "rounds=2"))
    counts = [b - a for a, b in zip(rounds, [*rounds[1:], len(calls)], strict=True)]
    assert counts == per_round, counts


def test_upload_bound_is_in_the_aggregation_section_and_checked_by_key():
    cfg = load_experiment(ROOT / "conf/default.yaml", ["strategy.name=dafkd"])
    assert cfg.strategy.params.aggregation.upload_bound == DEFAULT_UPLOAD_BOUND
    off = load_experiment(
        ROOT / "conf/default.yaml",
        ["strategy.name=fedtgp", "strategy.aggregation.upload_bound=null"],
    )
    assert off.strategy.params.aggregation.upload_bound is None
    for bad in ("0.5", "-1"):
        with pytest.raises(ConfigError, match=r"strategy\.aggregation\.upload_bound.*>= 1"):
            load_experiment(
                ROOT / "conf/default.yaml",
                ["strategy.name=scaffold", f"strategy.aggregation.upload_bound={bad}"],
            )


def test_update_bound_is_in_the_aggregation_section_and_checked_by_key():
    cfg = load_experiment(ROOT / "conf/default.yaml", ["strategy.name=fedavg"])
    assert cfg.strategy.params.aggregation.update_bound == DEFAULT_UPDATE_BOUND
    for bad in ("0", "-1"):
        with pytest.raises(ConfigError, match=r"strategy\.aggregation\.update_bound.*> 0"):
            load_experiment(
                ROOT / "conf/default.yaml",
                ["strategy.name=fedavg", f"strategy.aggregation.update_bound={bad}"],
            )


# -- the teachers' logits ------------------------------------------------------------------
def test_teacher_logits_problem():
    assert teacher_logits_problem(torch.randn(4, 3) * 50) is None
    assert "not finite" in teacher_logits_problem(torch.tensor([[0.0, float("nan")]]), "x")
    big = torch.tensor([[0.0, 2 * MAX_TEACHER_LOGIT]])
    assert "exceed 1e+06 in magnitude" in teacher_logits_problem(big, "the test split")


def test_teacher_norm_std_stops_a_scaled_teacher_from_steering_the_ensemble():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 200, 10, generator=gen) * 3.0  # four teachers, 200 samples
    scaled = logits.clone()
    scaled[2] = scaled[2] * 1e5  # one last layer x 1e5: logits x 1e5, still below 1e6 here
    uniform = torch.full((4,), 0.25)
    plain = weighted_logits(logits, uniform).argmax(1)
    steered = weighted_logits(normalise_teachers(scaled, "none"), uniform).argmax(1)
    assert torch.equal(steered, scaled[2].argmax(1))  # it agrees with that client everywhere
    assert (plain == scaled[2].argmax(1)).float().mean() < 0.6
    fixed = weighted_logits(normalise_teachers(scaled, "std"), uniform).argmax(1)
    honest = weighted_logits(normalise_teachers(logits, "std"), uniform).argmax(1)
    assert torch.equal(fixed, honest)
    # Every teacher at the (lower) median teacher's scale; a per-sample offset does not count.
    scales = teacher_scales(normalise_teachers(scaled + 7.0, "std"))
    torch.testing.assert_close(scales, scales.median().expand(4))
    assert normalise_teachers(logits, "none") is logits
    with pytest.raises(ValueError, match="teacher_norm"):
        normalise_teachers(logits, "max")


def test_teacher_bank_applies_the_norm_to_the_stack_only():
    from fedgo_flwr.data import ArrayDataset

    data = ArrayDataset(x=np.zeros((5, 3), np.float32), y=np.zeros(5, np.int64), num_classes=3)
    logits = torch.randn(2, 1, 5, 3)
    bank = TeacherBank(data, augment=False, teacher_norm="std")
    plain = TeacherBank(data, augment=False)
    for k in (1, 0):
        for b in (bank, plain):
            b.add_logits(logits[k] * (100.0 if k == 1 else 1.0), key=k)
    assert torch.equal(plain.logits[1], logits[1] * 100.0)
    torch.testing.assert_close(bank.logits, normalise_teachers(plain.logits, "std"))


def test_synthesis_on_nan_logits_says_so():
    """NaN < inf is false: with NaN logits no step was ever "best", which the old message
    called "synthesis needs steps >= 1"."""

    class NaNModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.flatten(1)[:, :3] * float("nan") * self.w

    settings = SynthesisSettings(source="pixels", batch_size=4, steps=2, adv_weight=0.0)
    with pytest.raises(FloatingPointError, match="not finite in any of its 2 steps"):
        synthesize(
            [NaNModel()],
            torch.ones(1),
            NaNModel(),
            settings,
            num_classes=3,
            image_shape=(1, 4, 4),
            rng=torch.Generator().manual_seed(0),
            device=torch.device("cpu"),
        )
    with pytest.raises(ValueError, match="steps >= 1, got 0"):
        synthesize(
            [NaNModel()],
            torch.ones(1),
            NaNModel(),
            SynthesisSettings(source="pixels", batch_size=4, steps=0),
            num_classes=3,
            image_shape=(1, 4, 4),
            rng=torch.Generator().manual_seed(0),
            device=torch.device("cpu"),
        )


# -- runs with one tampered reply ------------------------------------------------------------
TINY = ["rounds=3", "data.num_clients=4", "fraction=0.5", "train.local_epochs=1"]
TINY += ["data.train_subset=400", "data.test_subset=120"]  # digits cut as the golden runs
BAD = sample_clients(0, 1, 4, 2)[0]  # a client sampled in round 1 (seed 0, K=4, m=2)
FEDGO = [
    "strategy.name=fedgo",
    "strategy.distill.epochs=1",
    "strategy.generator.steps=5",
    "strategy.discriminator.epochs=1",
]
FEDGO += SMALL_GAN
G3 = [
    *FEDGO,
    "rounds=1",
    "strategy.generator.steps=0",
    "strategy.generator.federated_rounds=2",
    "strategy.generator.local_epochs=1",
    "data.server_fraction=0",
    "strategy.distill_data=generated",
    "strategy.generated_size=64",
]
DAFKD = [
    "strategy.name=dafkd",
    "strategy.generator.latent_dim=8",
    "strategy.generator.width=8",
    "strategy.distill_size=64",
    "strategy.distill.epochs=1",
]
FEDTGP = ["strategy.name=fedtgp", "strategy.lam=1.0", "strategy.tgp_epochs=3"]
ONESHOT = [
    "data.num_clients=4",
    "train.local_epochs=2",
    "strategy.epochs=2",
    "strategy.nz=16",
    "strategy.ngf=8",
    "strategy.synthesis.batch_size=16",
    "strategy.synthesis.steps=3",
    "strategy.boost.batch_size=16",
    "checkpoint=false",
]


def config(out: Path, *overrides: str, base: str = "default.yaml"):
    return load_experiment(ROOT / "conf" / base, [*TINY, f"output_dir={out}", *overrides])


def oneshot_config(out: Path, name: str, *overrides: str):
    return load_experiment(
        ROOT / "conf/coboosting.yaml",
        [*ONESHOT, f"strategy.name={name}", f"output_dir={out}", *overrides],
    )


def fill(value: float, *records: str) -> Edit:
    """Every floating array of ``records`` filled with ``value`` (finite in float32)."""

    def edit(content: RecordDict) -> None:
        for record in records:
            arrays = {k: v.numpy() for k, v in content[record].items()}
            content[record] = ArrayRecord(
                {
                    k: Array(np.full_like(v, value) if v.dtype.kind == "f" else v)
                    for k, v in arrays.items()
                }
            )

    return edit


def scaled(factor: float, record: str = msgs.ARRAYS, last: int | None = None) -> Edit:
    """Every floating array of ``record`` (its ``last`` ones only: the output layer) times
    ``factor``."""

    def edit(content: RecordDict) -> None:
        arrays = {k: v.numpy() for k, v in content[record].items()}
        keys = list(arrays)[-last:] if last else list(arrays)
        for k in keys:
            if arrays[k].dtype.kind == "f":
                arrays[k] = (arrays[k] * np.float32(factor)).astype(arrays[k].dtype)
        content[record] = ArrayRecord({k: Array(v) for k, v in arrays.items()})

    return edit


def warnings_naming(caplog, *texts: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and all(t in r.getMessage() for t in texts)
    ]


def all_rounds_usable(out: Path, replies: int = 2) -> list[dict]:
    rows = rows_of(out)
    assert [r["clients_replied"] for r in rows[1:]] == [replies] * (len(rows) - 1), rows
    assert all(np.isfinite(r["test_loss"]) for r in rows), rows
    return rows


def finite(state) -> bool:
    return all(np.isfinite(np.asarray(v, dtype=np.float64)).all() for v in state.values())


def test_fedgan_bounds_a_huge_generator_and_critic(tmp_path, monkeypatch, flwr_log):
    tamper(monkeypatch, fill(1e30, FEDGAN_GENERATOR_KEY, CRITIC_KEY), message_type=FEDGAN_MESSAGE)
    run_inprocess(config(tmp_path, *G3))
    for key in ("generator", "critic"):
        assert warnings_naming(flwr_log, f"FedGAN round 1: the {key} of client {BAD}:"), key
    rounds = json.loads((tmp_path / "prefl.json").read_text())["generator"]["rounds"]
    assert [r["clients"] for r in rounds] == [[0, 1, 2, 3]] * 2  # round 2 is usable
    generator = torch.load(tmp_path / "generator.pt")
    assert finite(generator) and max(float(v.abs().max()) for v in generator.values()) < 1e10
    all_rounds_usable(tmp_path)


def test_dafkd_bounds_a_huge_generator(tmp_path, monkeypatch, flwr_log):
    tamper(monkeypatch, fill(1e30, DAFKD_GENERATOR_KEY))
    run_inprocess(config(tmp_path, *DAFKD))
    assert warnings_naming(flwr_log, f"round 1: the generator of client {BAD}:")
    all_rounds_usable(tmp_path)
    generator = load_checkpoint(tmp_path).strategy_state["generator"]
    assert finite(generator) and max(float(np.abs(v).max()) for v in generator.values()) < 1e10


def test_dafkd_bounds_a_huge_discriminator_head(tmp_path, monkeypatch, flwr_log):
    from fedgo_flwr.protocol.dafkd import DISC_HEAD_KEY

    tamper(monkeypatch, scaled(1e6, DISC_HEAD_KEY))
    run_inprocess(config(tmp_path, *DAFKD, "rounds=2", "strategy.distill_from_round=1"))
    assert warnings_naming(flwr_log, f"round 1: the discriminator head of client {BAD}:")
    all_rounds_usable(tmp_path)


def test_fedtgp_bounds_huge_prototypes(tmp_path, monkeypatch, flwr_log):
    def huge(content: RecordDict) -> None:
        arrays = {k: v.numpy() for k, v in content[PROTOS_KEY].items()}
        arrays["protos"] = np.full_like(arrays["protos"], 1e30)  # finite float32
        content[PROTOS_KEY] = ArrayRecord({k: Array(v) for k, v in arrays.items()})

    tamper(monkeypatch, huge)
    run_inprocess(config(tmp_path, *FEDTGP))
    assert warnings_naming(flwr_log, f"round 1: the prototype of client {BAD} (class")
    rows = all_rounds_usable(tmp_path)
    assert all(np.isfinite(r["tgp_loss"]) and np.isfinite(r["tgp_margin"]) for r in rows[1:])
    protos = load_checkpoint(tmp_path).strategy_state["global_protos"]
    assert np.isfinite(protos).all() and np.abs(protos).max() < 1e6


def test_scaffold_bounds_a_long_control_delta(tmp_path, monkeypatch, flwr_log):
    """A control delta of 1e5 times the honest one, below max_control_delta_norm (1e6)."""
    tamper(monkeypatch, scaled(1e5, CONTROL_DELTA_KEY))
    run_inprocess(config(tmp_path, "strategy.name=scaffold"))
    assert warnings_naming(flwr_log, f"round 1: {CONTROL_DELTA_KEY} of client {BAD}:")
    all_rounds_usable(tmp_path)
    control = load_checkpoint(tmp_path).strategy_state["control"]
    assert max(float(np.abs(v).max()) for v in control.values()) < 1e3


def test_coboosting_drops_a_client_whose_logits_are_nan(tmp_path, monkeypatch, flwr_log):
    """Weights x 1e12 are finite, the model's logits are not: before, every synthetic batch's
    ensemble was NaN and synthesis failed with "synthesis needs steps >= 1"."""
    tamper(monkeypatch, scaled(1e12), pid=1)
    run_inprocess(oneshot_config(tmp_path, "coboosting", NO_UPDATE_BOUND))
    assert warnings_naming(flwr_log, "client 1 (node 3)", "teacher logits on the test split")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["clients_used"] == [0, 2, 3] and summary["clients_left_out"] == [1]
    losses = [r["test_loss"] for r in rows_of(tmp_path) if r.get("test_loss") is not None]
    assert len(losses) >= 2 and np.isfinite(losses).all(), losses


def test_oneshot_drops_a_client_whose_last_layer_is_scaled_up(tmp_path, monkeypatch, flwr_log):
    """x 1e5 leaves the logits of a digits CNN below MAX_TEACHER_LOGIT; their scale is far
    above the other clients'. Before, the ensemble agreed with this client on every sample."""
    tamper(monkeypatch, scaled(1e5, last=2), pid=1)
    run_inprocess(oneshot_config(tmp_path, "oneshot", NO_UPDATE_BOUND))
    assert warnings_naming(flwr_log, "leaving out client 1:", "upload_bound")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["clients_used"] == [0, 2, 3] and summary["clients_left_out"] == [1]
    assert rows_of(tmp_path)[1]["clients_replied"] == 3


def test_teacher_norm_std_keeps_a_scaled_last_layer_from_steering_the_ensemble(
    tmp_path, monkeypatch
):
    """x 100 with the relative teacher check off: unnormalised, the ensemble then follows
    that client. With ``teacher_norm: std`` it is the clean ensemble again."""

    def accuracy(name: str, *overrides: str) -> float:
        off = "strategy.aggregation.upload_bound=null"
        trained = ["train.local_epochs=5", "data.alpha=1.0"]  # an ensemble well above chance
        run_inprocess(
            oneshot_config(tmp_path / name, "oneshot", off, NO_UPDATE_BOUND, *trained, *overrides)
        )
        return json.loads((tmp_path / name / "summary.json").read_text())[
            "ensemble_accuracy_uniform"
        ]

    clean = accuracy("clean", "strategy.teacher_norm=std")
    tamper(monkeypatch, scaled(100.0, last=2), pid=1)
    steered = accuracy("none")
    fixed = accuracy("std", "strategy.teacher_norm=std")
    assert abs(fixed - clean) < 0.05 and fixed - steered > 0.1, (clean, steered, fixed)


@pytest.mark.parametrize(
    ("overrides", "edit"),
    [
        (["strategy.name=fedavg"], scaled(1e5)),
        (["strategy.name=fedavg"], fill(1e30, msgs.ARRAYS)),
        (["strategy.name=feddf", "strategy.distill.epochs=1"], scaled(1e5, last=2)),
        (["strategy.name=cpfl", "strategy.cohorts=2", "fraction=1.0"], scaled(1e5)),
    ],
    ids=["fedavg-x1e5", "fedavg-1e30", "feddf-last-layer-x1e5", "cpfl-member-x1e5"],
)
def test_a_model_far_longer_than_what_was_sent_is_dropped(
    tmp_path, monkeypatch, flwr_log, overrides, edit
):
    """Finite weights x 1e5 (or all 1e30) are refused by the intake's checks of keys, shapes,
    dtypes and finiteness; before, the streaming mean took them at full weight (FedAvg:
    the next model's outputs overflow). ``update_bound`` drops the reply, naming the client,
    against the model that client was sent (a CPFL member: its cohort's)."""
    tamper(monkeypatch, edit)
    run_inprocess(config(tmp_path, *overrides))
    assert warnings_naming(flwr_log, f"client {BAD}", "strategy.aggregation.update_bound")
    rows = rows_of(tmp_path)
    losses = [r["test_loss"] for r in rows if r.get("test_loss") is not None]  # CPFL: some
    assert rows[1]["clients_failed"] == 1 and losses and np.isfinite(losses).all(), rows


@pytest.mark.parametrize(("factor", "why"), [(1e12, "non-finite logits"), (1e5, "logit scale")])
def test_fedgo_gives_a_discriminator_it_cannot_use_the_neutral_weight(
    tmp_path, monkeypatch, flwr_log, factor, why
):
    """A discriminator x 1e12 is finite and its logits are not: before, FedGO's weighting
    raised ``disc_logits contains NaN or infinite values``. Its last layer x 1e5 gives finite
    logits far beyond the others', which push its odds to 0 or infinity on every sample. Either
    way the client gets the neutral weight (as one without a discriminator), named."""
    tamper(
        monkeypatch,
        scaled(factor, last=None if factor > 1e6 else 2),
        pid=BAD,
        message_type=DISCRIMINATOR_MESSAGE,
        server_round=0,
    )
    run_inprocess(config(tmp_path, *FEDGO, "rounds=1"))
    assert warnings_naming(flwr_log, f"discriminator of client {BAD}", why)
    prefl = json.loads((tmp_path / "prefl.json").read_text())
    key = "nonfinite_discriminators" if factor > 1e6 else "scaled_discriminators"
    assert prefl[key] == [BAD]
    assert np.isfinite([r["test_loss"] for r in rows_of(tmp_path)]).all()


def test_coboosting_fedgo_drops_a_client_whose_discriminator_gives_nonfinite_logits(
    tmp_path, monkeypatch, flwr_log
):
    """Before, the odds weights of every synthetic sample were NaN and synthesis failed."""
    tamper(monkeypatch, scaled(1e12, DISCRIMINATOR_KEY), pid=1)
    gan = ["strategy.discriminator.epochs=1", "strategy.generator.steps=0", *SMALL_GAN]
    run_inprocess(oneshot_config(tmp_path, "coboosting_fedgo", *gan))
    assert warnings_naming(flwr_log, "client 1", "discriminator: its logits on the test split")
    assert json.loads((tmp_path / "summary.json").read_text())["clients_used"] == [0, 2, 3]


def rolled(factor: float) -> Edit:
    """The classifier's last layer rolled by one class (every prediction one class off) and
    multiplied by ``factor``."""

    def edit(content: RecordDict) -> None:
        model = {k: v.numpy() for k, v in content[msgs.ARRAYS].items()}
        for k in list(model)[-2:]:
            model[k] = (np.roll(model[k], 1, axis=0) * np.float32(factor)).astype(model[k].dtype)
        content[msgs.ARRAYS] = ArrayRecord({k: Array(v) for k, v in model.items()})

    return edit


def test_feddf_gives_a_scaled_teacher_the_median_scale(tmp_path, monkeypatch, flwr_log):
    """One of four teachers rolls its last layer by one class and multiplies it by 30 (inside
    ``update_bound``'s reach only with the bound off, as here). Bounded at 10 x the round's
    median teacher scale, it is rescaled to that median on both sets, a WARNING naming it
    (the accuracy effect is in ``tests/unit/test_distill_equations.py``: on this tiny data the
    honest teachers are too weak, ensemble accuracy 0.26, for one wrong teacher of four not
    to steer it at any scale). The check of its arrays, which would leave it out first
    (``teacher_array_bound``), is off here; with it on, that is what happens."""
    four = ["strategy.name=feddf", "strategy.distill.epochs=1", "fraction=1.0", "rounds=1"]
    four += [NO_UPDATE_BOUND, "strategy.aggregation.upload_bound=10"]
    tamper(monkeypatch, rolled(30.0), pid=1)
    off = "strategy.aggregation.teacher_array_bound=null"
    run_inprocess(config(tmp_path / "logits", *four, off))
    for where in ("the distillation set", "the test split"):
        assert warnings_naming(flwr_log, "client 1", where, "rescaled to the median")
    assert np.isfinite(rows_of(tmp_path / "logits")[1]["ensemble_test_loss"])
    flwr_log.clear()
    run_inprocess(config(tmp_path / "arrays", *four))
    assert warnings_naming(flwr_log, "client 1", "left out of the ensemble")
    assert not warnings_naming(flwr_log, "rescaled to the median")
    assert rows_of(tmp_path / "arrays")[1]["teachers_left_out"] == 1


def biased_and_rolled(content: RecordDict) -> None:
    """The discriminator's last bias + 50 (it calls every image its own) and the classifier's
    last layer rolled by one class (its norms unchanged: every prediction one class off)."""
    disc = {k: v.numpy() for k, v in content[DISCRIMINATOR_KEY].items()}
    last = list(disc)[-1]
    disc[last] = (disc[last] + np.float32(50)).astype(disc[last].dtype)
    content[DISCRIMINATOR_KEY] = ArrayRecord({k: Array(v) for k, v in disc.items()})
    model = {k: v.numpy() for k, v in content[msgs.ARRAYS].items()}
    for k in list(model)[-2:]:
        model[k] = np.roll(model[k], 1, axis=0).copy()
    content[msgs.ARRAYS] = ArrayRecord({k: Array(v) for k, v in model.items()})


@pytest.mark.parametrize(
    ("overrides", "warning"),
    [([], "logit scale"), (["strategy.aggregation.discriminator_bound=null"], "mean share")],
    ids=["screened", "capped-only"],
)
def test_coboosting_fedgo_bounds_a_biased_discriminator(
    tmp_path, monkeypatch, flwr_log, overrides, warning
):
    """With exact odds (``disc_mode: sigmoid``) a discriminator bias of + 50 gave its client
    weight 1.0 on every sample, and with its rolled classifier the odds-weighted ensemble fell
    to 0.04 (uniform 0.59). The screen gives that discriminator the neutral weight: the
    ensemble stays within 0.05 of uniform's. Without the screen (``discriminator_bound`` off) the
    cap on the mean share (1/2 here: 4 clients of similar size) still bounds it: above 0.2 of
    accuracy rather than 0.04."""
    tamper(monkeypatch, biased_and_rolled, pid=1)
    gan = ["strategy.discriminator.epochs=1", "strategy.generator.steps=0", *SMALL_GAN]
    trained = ["train.local_epochs=5", "data.alpha=1.0", "strategy.disc_mode=sigmoid"]
    run_inprocess(oneshot_config(tmp_path, "coboosting_fedgo", *gan, *trained, *overrides))
    assert warnings_naming(flwr_log, "client 1", warning)
    summary = json.loads((tmp_path / "summary.json").read_text())
    least = summary["ensemble_accuracy_uniform"] - 0.05 if not overrides else 0.2
    assert summary["ensemble_accuracy_fedgo"] > least, summary
    assert summary["ensemble_accuracy_learned"] > least, summary


def test_neutralise_nonfinite_and_discriminator_scale_outliers():
    a = torch.tensor([[[1.0, -2.0]], [[float("inf"), 0.0]], [[3.0, 1.0]]])  # (K=3, V=1, N=2)
    b = torch.tensor([[0.5], [1.0], [float("nan")]])
    assert neutralise_nonfinite(a, b) == [1, 2]  # a row bad in either tensor, in both
    assert a[1].abs().sum() == 0 and a[2].abs().sum() == 0 and b[2] == 0 and b[0] == 0.5
    z = torch.tensor([[1.0, -1.0], [2.0, 2.0], [300.0, -300.0], [0.0, 0.0]])
    # RMS 1, 2, 300 over clients 0-2 (3 has no discriminator): lower median 2
    assert discriminator_scale_outliers(z, [0, 1, 2], 100.0) == [(2, 300.0, 2.0)]
    assert discriminator_scale_outliers(z, [0, 1, 2], 200.0) == []
    assert discriminator_scale_outliers(z, [0, 1, 2], None) == []


# -- clean runs are unchanged ------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides",
    [["strategy.name=scaffold"], FEDTGP, DAFKD, G3],
    ids=["scaffold", "fedtgp", "dafkd", "fedgan"],
)
def test_an_honest_run_never_meets_the_default_bound(tmp_path, overrides, flwr_log):
    """The default bound does not bind in honest runs: every metric and the model are those
    of the run without it (whose averages are the former code's: the same arrays, added in
    the same order with the same weights)."""
    run_inprocess(config(tmp_path / "default", *overrides, "rounds=2"))
    run_inprocess(
        config(tmp_path / "off", *overrides, "rounds=2", "strategy.aggregation.upload_bound=null")
    )
    assert not warnings_naming(flwr_log, "upload_bound")
    assert without_timing(rows_of(tmp_path / "default")) == without_timing(
        rows_of(tmp_path / "off")
    )
    a, b = torch.load(tmp_path / "default" / "model.pt"), torch.load(tmp_path / "off" / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
