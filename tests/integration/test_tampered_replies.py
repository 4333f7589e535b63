"""One client must not take over or crash the server (issue 12).

Each test lets the clients train honestly and then edits one client's reply on its way to the
server (as a malicious or broken client would send it), through the in-process grid. The server
must drop that reply, name the client (partition id and node id) and the reason, and go on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from helpers import SMALL_GAN, held_one_thread, rows_of

from fedgo_app.inprocess import InProcessGrid, run_inprocess
from fedgo_flwr.learning.aggregation import check_arrays
from fedgo_flwr.learning.task import load_bundle, make_partition, new_model, sample_clients
from fedgo_flwr.protocol.fedgo import DISCRIMINATOR_MESSAGE
from fedgo_flwr.protocol.scaffold import CONTROL_DELTA_KEY
from fedgo_flwr.records.checkpoint import load_checkpoint
from fedgo_flwr.runtime import messages as msgs
from strategies import load_experiment, strategy_class

ROOT = Path(__file__).resolve().parents[2]
TINY = ["rounds=1", "data.num_clients=4", "fraction=0.5", "train.local_epochs=1"]
TINY += ["data.train_subset=400", "data.test_subset=120"]  # digits cut as the golden runs
FEDGO = [
    "strategy.name=fedgo",
    "strategy.distill.epochs=1",
    "strategy.generator.steps=5",
    "strategy.discriminator.epochs=1",
]
FEDGO += SMALL_GAN
BAD = sample_clients(0, 1, 4, 2)[0]  # a client sampled in round 1 (seed 0, K=4, m=2)
NODE = BAD + 2  # InProcessGrid's node id of partition p is p + 2
NO_UPDATE_BOUND = "strategy.aggregation.update_bound=null"

Edit = Callable[[RecordDict], None]


def config(tmp_path: Path, *overrides: str):
    return load_experiment(
        ROOT / "conf/default.yaml", [*TINY, f"output_dir={tmp_path}", *overrides]
    )


def warnings_with(caplog, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and text in r.getMessage()
    ]


def tamper(
    monkeypatch, edit: Edit, pid: int = BAD, message_type: str = "train", server_round: int = 1
) -> None:
    """Apply ``edit`` to the content of client ``pid``'s reply to ``message_type`` in
    ``server_round`` (0 for FedGO's discriminator round) before the server sees it."""
    original = InProcessGrid.stream

    def stream(self, messages, *, timeout=None):
        messages = list(messages)
        hit = any(
            m.metadata.message_type == message_type
            and int(m.content[msgs.CONFIG][msgs.SERVER_ROUND]) == server_round
            for m in messages
        )
        for reply in original(self, messages, timeout=timeout):
            if hit and reply.metadata.src_node_id == pid + 2 and not reply.has_error():
                edit(reply.content)
            yield reply

    monkeypatch.setattr(InProcessGrid, "stream", stream)


# -- edits -------------------------------------------------------------------------------------
def set_metric(key: str, value) -> Edit:
    def edit(content: RecordDict) -> None:
        content[msgs.METRICS] = MetricRecord({**dict(content[msgs.METRICS]), key: value})

    return edit


def map_arrays(fn: Callable[[np.ndarray], np.ndarray], record: str = msgs.ARRAYS) -> Edit:
    def edit(content: RecordDict) -> None:
        arrays = {k: fn(v.numpy()) for k, v in content[record].items()}
        content[record] = ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()})

    return edit


def replace_first_array(array: Array, record: str = msgs.ARRAYS) -> Edit:
    def edit(content: RecordDict) -> None:
        items = dict(content[record].items())
        first = next(iter(items))
        items[first] = array
        content[record] = ArrayRecord(items)

    return edit


def drop_record(record: str) -> Edit:
    def edit(content: RecordDict) -> None:
        del content[record]

    return edit


def nan_first(v: np.ndarray) -> np.ndarray:
    return np.full_like(v, np.nan) if v.dtype.kind == "f" else v


def assert_dropped(tmp_path: Path, caplog, reason: str, pid: int = BAD) -> None:
    """The run ended normally, round 1 lost exactly client ``pid``, and it was named."""
    rows = rows_of(tmp_path)
    assert rows[1]["clients_replied"] == 1 and rows[1]["clients_failed"] == 1
    assert np.isfinite(rows[1]["test_accuracy"])
    dropped = warnings_with(caplog, "Dropping reply")
    assert len(dropped) == 1, dropped
    assert f"client {pid} (node {pid + 2})" in dropped[0] and reason in dropped[0], dropped[0]


# -- 1. the claimed data size --------------------------------------------------------------------
STRATEGIES = {
    "fedavg": ["strategy.name=fedavg"],
    "fedprox": ["strategy.name=fedprox"],
    "scaffold": ["strategy.name=scaffold", "strategy.weighted=true"],
    "feddf": ["strategy.name=feddf", "strategy.distill.epochs=1", "strategy.weighting=data_size"],
    "fedgo": FEDGO,
}


@pytest.mark.parametrize("claim", [1e300, "size+1"])
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_claimed_data_size_other_than_the_partitions_is_dropped(
    tmp_path, monkeypatch, flwr_log, strategy, claim
):
    cfg = config(tmp_path, *STRATEGIES[strategy])
    size = make_partition(cfg).client_sizes[BAD]
    tamper(monkeypatch, set_metric(msgs.NUM_EXAMPLES, size + 1 if claim == "size+1" else claim))
    run_inprocess(cfg)
    assert_dropped(tmp_path, flwr_log, f"the server's count of partition {BAD} is {size}")


def test_the_servers_count_is_n_k(tmp_path, monkeypatch):
    """Every accepted reply's n_k is the server's count of its partition."""
    cfg = config(tmp_path, "strategy.name=fedavg", "rounds=2")
    cls = strategy_class("fedavg")
    seen: list[tuple[int, int]] = []
    original = cls.absorb

    def absorb(self, server_round, reply):
        seen.append((reply.partition_id, reply.num_examples))
        original(self, server_round, reply)

    monkeypatch.setattr(cls, "absorb", absorb)
    run_inprocess(cfg)
    sizes = make_partition(cfg).client_sizes
    assert len(seen) == 4 and all(n == sizes[pid] for pid, n in seen)


# -- without ServerResources: the claim, checked to be a positive whole number -------------------
def bare_strategy(tmp_path: Path):
    """A FedAvg strategy built without ServerResources (as some unit tests do)."""
    cfg = config(tmp_path, "strategy.name=fedavg")
    model = new_model(cfg, load_bundle(cfg.data))
    InProcessGrid(lambda m, c: m, cfg.data.num_clients)  # sets Flower's task identity
    strategy = strategy_class("fedavg")(cfg, {p: p + 2 for p in range(4)}, model)
    arrays = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    strategy.global_arrays = arrays
    strategy.open_round([0, 1])
    strategy.outbox.tokens.update(BARE_TOKENS)  # as if it had sent the round's messages
    return strategy, arrays


BARE_TOKENS = {p: f"{p + 10:x}" * 32 for p in range(4)}
"""The reply tokens of :func:`bare_strategy`'s messages (partition ``p`` on node ``p + 2``)."""


def reply_from(node: int, arrays, metrics: dict) -> Message:
    """A reply from ``node`` that echoes its partition's token."""
    request = Message(
        RecordDict({msgs.CONFIG: ConfigRecord()}), dst_node_id=node, message_type="train"
    )
    content = RecordDict(
        {
            msgs.ARRAYS: ArrayRecord({k: Array(v) for k, v in arrays.items()}),
            msgs.METRICS: MetricRecord(metrics),
        }
    )
    if node - 2 in BARE_TOKENS:
        content[msgs.ECHO] = ConfigRecord({msgs.REPLY_TOKEN: BARE_TOKENS[node - 2]})
    return Message(content, reply_to=request)


@pytest.mark.parametrize(
    ("claim", "accepted"),
    [(7, 7), (7.0, 7), (0.5, None), ([7], None), (2.0**60, None), (-3, None), ("size", None)],
)
def test_without_resources_a_claim_must_be_a_positive_whole_number(
    tmp_path, flwr_log, claim, accepted
):
    strategy, arrays = bare_strategy(tmp_path)
    metrics = {msgs.NUM_EXAMPLES: claim} if claim != "size" else {}
    reply = strategy.accept(reply_from(2, arrays, metrics))
    if accepted is None:
        assert reply is None
        assert warnings_with(flwr_log, "client 0 (node 2)")
    else:
        assert reply is not None and reply.num_examples == accepted


def test_a_reply_from_a_node_that_was_not_sampled_is_dropped(tmp_path, flwr_log):
    strategy, arrays = bare_strategy(tmp_path)
    assert strategy.accept(reply_from(4, arrays, {msgs.NUM_EXAMPLES: 5})) is None  # partition 2
    assert strategy.accept(reply_from(99, arrays, {msgs.NUM_EXAMPLES: 5})) is None  # unknown
    assert warnings_with(flwr_log, "client 2 (node 4): not sent work in this round")
    assert warnings_with(flwr_log, "client -1 (node 99): not a partition this node serves")


# -- 2. dtypes --------------------------------------------------------------------------------
def test_check_arrays_requires_the_references_dtype_and_real_numbers():
    ref = {"w": np.zeros(3, dtype=np.float32), "n": np.zeros((), dtype=np.int64)}
    assert check_arrays(ref, ref) is None
    for bad in (np.int8, np.float64, np.float16, np.complex64, np.bool_):
        got = check_arrays({**ref, "w": np.ones(3, dtype=bad)}, ref)
        assert got is not None and "'w'" in got and "dtype" in got, got
    assert "dtype" in check_arrays({**ref, "n": np.zeros((), dtype=np.float32)}, ref)
    # A complex reference does not make complex values acceptable: the finiteness check needs
    # real numbers.
    cref = {"w": np.zeros(3, dtype=np.complex64)}
    assert "real" in check_arrays({"w": np.array([np.nan, 0, 0], dtype=np.complex64)}, cref)


@pytest.mark.parametrize("dtype", [np.int8, np.float64])
def test_a_reply_in_another_dtype_is_dropped(tmp_path, monkeypatch, flwr_log, dtype):
    cfg = config(tmp_path, "strategy.name=fedavg")
    tamper(monkeypatch, map_arrays(lambda v: v.astype(dtype)))
    run_inprocess(cfg)
    assert_dropped(tmp_path, flwr_log, f"dtype {np.dtype(dtype).name}")
    model = torch.load(tmp_path / "model.pt")
    assert all(v.dtype == torch.float32 for k, v in model.items())


# -- 3. replies that used to raise inside the ServerApp ------------------------------------------
def scale_floats(factor: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda v: (v * np.float32(factor)).astype(v.dtype) if v.dtype.kind == "f" else v


CRASHERS: dict[str, tuple[list[str], Edit, str]] = {
    "half_example": (["strategy.name=fedavg"], set_metric(msgs.NUM_EXAMPLES, 0.5), "0.5"),
    "huge_claim_float32": (
        ["strategy.name=feddf", "strategy.distill.epochs=1", "strategy.weighting=data_size"],
        set_metric(msgs.NUM_EXAMPLES, 1e39),
        "1e+39",
    ),
    "unknown_stype": (
        ["strategy.name=fedavg"],
        replace_first_array(Array(dtype="float32", shape=(2,), stype="weird", data=bytes(8))),
        "unreadable",
    ),
    "bad_bytes": (
        ["strategy.name=feddf", "strategy.distill.epochs=1"],
        replace_first_array(
            Array(dtype="float32", shape=(2,), stype="numpy.ndarray", data=b"garbage")
        ),
        "unreadable",
    ),
    "list_train_loss": (["strategy.name=fedavg"], set_metric("train_loss", [1.0, 2.0]), "loss"),
    # The teacher checks behind strategy.aggregation.update_bound (which drops these first).
    "teacher_overflow": (
        ["strategy.name=feddf", "strategy.distill.epochs=1", NO_UPDATE_BOUND],
        map_arrays(scale_floats(1e12)),
        "teacher logits",
    ),
    "teacher_overflow_fedgo": (
        [*FEDGO, NO_UPDATE_BOUND],
        map_arrays(scale_floats(1e12)),
        "teacher logits",
    ),
}


@pytest.mark.parametrize("case", list(CRASHERS))
def test_a_reply_that_used_to_end_the_run_is_dropped(tmp_path, monkeypatch, flwr_log, case):
    overrides, edit, reason = CRASHERS[case]
    tamper(monkeypatch, edit)
    run_inprocess(config(tmp_path, *overrides))
    assert_dropped(tmp_path, flwr_log, reason)


def scale_last_layer(factor: float) -> Edit:
    """Multiply the output layer (the last weight and bias of the state dict) by ``factor``."""

    def edit(content: RecordDict) -> None:
        items = {k: v.numpy() for k, v in content[msgs.ARRAYS].items()}
        for key in list(items)[-2:]:
            items[key] = (items[key] * np.float32(factor)).astype(np.float32)
        content[msgs.ARRAYS] = ArrayRecord({k: Array(v) for k, v in items.items()})

    return edit


def test_a_teacher_with_huge_finite_logits_is_dropped(tmp_path, monkeypatch, flwr_log):
    """Logits of 1e8 and more are finite but overflow once divided by a temperature < 1e-30;
    a trained classifier never comes near MAX_TEACHER_LOGIT (1e6)."""
    tamper(monkeypatch, scale_last_layer(1e9))
    feddf = ["strategy.name=feddf", "strategy.distill.epochs=1", NO_UPDATE_BOUND]
    run_inprocess(config(tmp_path, *feddf))
    assert_dropped(tmp_path, flwr_log, "exceed 1e+06 in magnitude")


def test_the_overflowing_model_is_finite_and_its_logits_are_not(tmp_path):
    """The precondition of the teacher-overflow case: every weight finite, logits not."""
    cfg = config(tmp_path)
    bundle = load_bundle(cfg.data)
    model = new_model(cfg, bundle)
    scale = scale_floats(1e12)
    state = {k: torch.from_numpy(scale(v.numpy())) for k, v in model.state_dict().items()}
    assert all(torch.isfinite(v).all() for v in state.values())
    model.load_state_dict(state)
    x = torch.as_tensor(bundle.train.x[:8], dtype=torch.float32)
    with torch.no_grad():
        assert not torch.isfinite(model(x)).all()


def test_teacher_overflow_leaves_the_round_as_if_the_client_had_failed(tmp_path, monkeypatch):
    """The dropped model enters neither the ensemble nor the parameter average: the round is
    the one where that client crashed."""
    feddf = ["strategy.name=feddf", "strategy.distill.epochs=1"]
    with monkeypatch.context() as m:
        tamper(m, map_arrays(scale_floats(1e12)))
        run_inprocess(config(tmp_path / "overflow", *feddf))
    run_inprocess(
        config(tmp_path / "crash", *feddf, f"faults=[{{partition: {BAD}, round: 1, kind: crash}}]")
    )
    a = torch.load(tmp_path / "overflow" / "model.pt")
    b = torch.load(tmp_path / "crash" / "model.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    keys = ("test_accuracy", "distill_loss", "init_test_accuracy", "train_loss")
    ra, rb = rows_of(tmp_path / "overflow")[1], rows_of(tmp_path / "crash")[1]
    assert {k: ra[k] for k in keys} == {k: rb[k] for k in keys}


# -- 4. FedGO's discriminator replies --------------------------------------------------------------
DISC_EDITS: dict[str, tuple[Edit, str]] = {
    "nan": (map_arrays(nan_first), "non-finite"),
    "shape": (map_arrays(lambda v: np.zeros((*v.shape, 2), v.dtype)), "shape"),
    "dtype": (map_arrays(lambda v: v.astype(np.float64)), "dtype"),
    "no_arrays": (drop_record(msgs.ARRAYS), "no ArrayRecord"),
    "no_metrics": (drop_record(msgs.METRICS), "no MetricRecord"),
    "no_token": (drop_record(msgs.ECHO), "echoes no reply token"),
    "unreadable": (
        replace_first_array(Array(dtype="float32", shape=(2,), stype="weird", data=bytes(8))),
        "unreadable",
    ),
}


@pytest.mark.parametrize("case", list(DISC_EDITS))
def test_a_bad_discriminator_is_dropped_and_gets_the_neutral_weight(
    tmp_path, monkeypatch, flwr_log, case
):
    edit, reason = DISC_EDITS[case]
    tamper(monkeypatch, edit, pid=2, message_type=DISCRIMINATOR_MESSAGE, server_round=0)
    run_inprocess(config(tmp_path, *FEDGO))
    prefl = json.loads((tmp_path / "prefl.json").read_text())
    assert prefl["missing_discriminators"] == [2]
    assert "2" not in prefl["discriminators"]
    saved = torch.load(tmp_path / "discriminators.pt")
    assert sorted(saved) == [0, 1, 3]
    assert all(torch.isfinite(t).all() for s in saved.values() for t in s.values())
    dropped = warnings_with(flwr_log, "discriminator of client 2 (node 4)")
    assert len(dropped) == 1 and reason in dropped[0], dropped
    assert np.isfinite(rows_of(tmp_path)[-1]["test_accuracy"])


@pytest.fixture(scope="module")
def fedgo_run(tmp_path_factory) -> Path:
    """One honest FedGO run whose generator and discriminators the loading tests reuse."""
    out = tmp_path_factory.mktemp("fedgo")
    with held_one_thread():
        run_inprocess(config(out, *FEDGO))
    return out


def _bad_nan(s):
    return {
        k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in s.items()
    }


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda s: {**s, 1: _bad_nan(s[1])}, "client 1: .*non-finite"),
        (lambda s: {**s, 1: {k: v[..., :1] for k, v in s[1].items()}}, "client 1: .*shape"),
        (lambda s: {**s, 1: {k: v.double() for k, v in s[1].items()}}, "client 1: .*dtype"),
        (lambda s: {**s, 7: s[0]}, "client 7: not a partition id"),
        (lambda s: {**s, "x": s[0]}, "client 'x': not a partition id"),
        (lambda s: {**s, 1: "junk"}, "client 1: not a state dict"),
        (lambda s: [s[0]], "not a mapping"),
    ],
    ids=["nan", "shape", "dtype", "range", "key", "junk", "list"],
)
def test_a_bad_discriminator_file_is_a_clear_error(tmp_path, fedgo_run, change, reason):
    states = torch.load(fedgo_run / "discriminators.pt")
    bad = tmp_path / "bad.pt"
    torch.save(change(states), bad)
    cfg = config(
        tmp_path / "run",
        *FEDGO,
        f"strategy.discriminator.path={bad}",
        f"strategy.generator.path={fedgo_run / 'generator.pt'}",
    )
    with pytest.raises(ValueError, match=f"{bad}.*{reason}"):
        run_inprocess(cfg)


# -- 5. SCAFFOLD's control deltas ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (map_arrays(lambda v: np.full(v.shape, 1e300), CONTROL_DELTA_KEY), "dtype float64"),
        (map_arrays(lambda v: np.full_like(v, 1e30), CONTROL_DELTA_KEY), "norm"),
        (map_arrays(lambda v: np.full_like(v, 3e38), CONTROL_DELTA_KEY), "norm"),
        (map_arrays(nan_first, CONTROL_DELTA_KEY), "non-finite"),
        (drop_record(CONTROL_DELTA_KEY), "no ArrayRecord"),
    ],
    ids=["float64", "large", "overflowing_norm", "nan", "missing"],
)
def test_a_bad_scaffold_control_delta_is_dropped(tmp_path, monkeypatch, flwr_log, edit, reason):
    cfg = config(tmp_path, "strategy.name=scaffold")
    tamper(monkeypatch, edit)
    run_inprocess(cfg)
    assert_dropped(tmp_path, flwr_log, reason)
    control = load_checkpoint(tmp_path).strategy_state["control"]
    assert all(np.isfinite(v).all() and np.abs(v).max() < 1e3 for v in control.values())


def test_the_control_delta_bound_is_configurable(tmp_path, monkeypatch, flwr_log):
    cfg = config(tmp_path, "strategy.name=scaffold", "strategy.max_control_delta_norm=1.0e-9")
    run_inprocess(cfg)
    rows = rows_of(tmp_path)
    assert rows[1]["clients_replied"] == 0 and rows[1]["clients_failed"] == 2
    dropped = [m for m in warnings_with(flwr_log, "max_control_delta_norm") if "Dropping" in m]
    assert len(dropped) == 2
    # A control delta beyond its bound is what honest clients send after a diverged model:
    # a round whose every reply has one rolls back (here to the initial model, which it kept).
    assert rows[1]["rolled_back"] == 1


def test_the_control_delta_bound_must_be_positive(tmp_path):
    with pytest.raises(
        ValueError, match="strategy.max_control_delta_norm.*must be a finite number > 0"
    ):
        config(tmp_path, "strategy.name=scaffold", "strategy.max_control_delta_norm=0")
