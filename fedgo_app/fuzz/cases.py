"""The reply fuzzer's cases: which replies a strategy's clean run gets, the mutation kinds,
and the interception that applies one mutation to one client's reply (the package's
docstring: :mod:`fedgo_app.fuzz`)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord

from fedgo_app.inprocess import InProcessGrid
from fedgo_flwr.config.experiment import ConfigError
from fedgo_flwr.runtime import messages as msgs
from strategies import load_experiment, strategy_class
from strategies.oneshot import OneShot

ROOT = Path(__file__).resolve().parents[2]

# -- the margins --------------------------------------------------------------------------------
ROBUST_MARGIN = 0.05
"""With the robust options on (:data:`ROBUST`), how far the final test accuracy may fall below
the lower of the clean run's and that of the run in which the mutated reply never came
(:func:`withheld_accuracy`): a robust server treats a bad reply at worst as a missing one.
Losing one of 4 clients in one round of these 2-round runs alone moves the final accuracy by
up to 0.175 (measured), so the clean run alone is no yardstick; 0.05 is 18 test images of
digits' 360."""

# -- the robust options ------------------------------------------------------------------------
ROBUST: dict[str, object] = {
    "aggregation.rule": "median",  # coordinate-wise median of the round's models (Yin et al.)
    "teacher_norm": "std",  # each teacher's logits to one scale before the ensemble
    "loss_reduce": "median",  # CPFL: a cohort's stopping loss is its members' median
}
"""The robust options, looked up in each strategy's ``Config`` (dotted path) and turned on where
the field exists, so a new algorithm with the same sections is fuzzed with them too. The tiny
runs sample all 4 clients in every round, so the one mutated client is a minority of every
median (a median of 2 would be their mean)."""


def robust_overrides(name: str) -> list[str]:
    """``name``'s overrides that turn :data:`ROBUST` on where its ``Config`` has the field and
    the strategy accepts the value (a value the strategy refuses is skipped); empty: none
    applies."""
    if name not in _ROBUST:
        defaults = _fields(strategy_class(name).Config)
        chosen: list[str] = []
        for path, value in ROBUST.items():
            if path not in defaults or defaults[path] == value:
                continue
            option = f"strategy.{path}={value}"
            try:
                load_experiment(config_file(name), [f"strategy.name={name}", *COMMON, option])
            except ConfigError:
                continue
            chosen.append(option)
        _ROBUST[name] = chosen
    return list(_ROBUST[name])


_ROBUST: dict[str, list[str]] = {}


# -- the tiny runs ------------------------------------------------------------------------------
COMMON = [
    "data.num_clients=4",
    "fraction=1.0",
    "data.alpha=1.0",  # mildly non-IID: the clean tiny runs learn (FedAvg 0.65 after 2 rounds)
    "train.local_epochs=1",
    "train.lr=0.1",
    "train.momentum=0.9",
    "eval.batch_size=256",
    "resources.server_cpus=1",  # tiny models: one thread is as fast, and kinder to a shared machine
]
"""Every case: 4 clients, all of them sampled in every round, 1 local epoch; the optimiser
set so that 2 rounds learn well above chance (else a poisoned model could not be told from
the clean one by its accuracy)."""

CUTS: dict[str, object] = {
    # Looked up in the strategy's Config (dotted path); applied where the field exists, so a
    # new algorithm with the same sections gets them too. From tests/test_faults_resume.py,
    # tests/test_oneshot.py, tests/test_cpfl.py and conf/<name>.yaml.
    "distill.epochs": 1,
    "discriminator.epochs": 1,
    "generator.steps": 2,
    "generator.latent_dim": 8,
    "generator.width": 8,
    "generator.batch_size": 16,
    "generator.n_critic": 1,
    "generator.local_epochs": 1,
    "epochs": 1,
    "nz": 16,
    "ngf": 8,
    "synthesis.batch_size": 16,
    "synthesis.steps": 2,
    "boost.batch_size": 16,
    "tgp_epochs": 3,
    "buffer_length": 2,
    "distill_size": 128,  # FedDF's family: null (all the server's share) -> 128 images
    "generated_size": 128,
    "teacher_test_size": 120,
    "student_init": "average",  # one-shot distillation: 1 server epoch from a fresh student
    # stays at chance, from the clients' average it reflects what the clients sent
}
"""Expensive knobs, cut to a tiny value where a strategy's ``Config`` has them as a whole
number above it or as ``None`` (for these keys "all of it")."""

EXTRA: dict[str, list[str]] = {
    # Per strategy, besides the cuts: what makes the run exchange all its message types, what
    # a tiny run needs to be valid, or what makes its 2 rounds learn (final accuracy of each
    # clean run, measured: tests/integration/test_fuzz_replies.py's module docstring).
    "fedgo": [  # G3 (FedGAN at the clients): train.fedgan and train.discriminator, then train
        "strategy.generator.federated_rounds=1",
        "strategy.generator.steps=0",
    ],
    "fadi": ["model.name=cnn_bn"],  # F-ADI matches batch-norm statistics
    "cpfl": [
        "strategy.cohorts=2",
        "strategy.window=2",
        "strategy.patience=3",
        "strategy.cohort_eval_every=0",
        "strategy.distill.epochs=3",  # batch 512 is one step per epoch on the public share
        "strategy.distill.batch_size=32",
    ],
    "scaffold": ["train.momentum=0", "train.local_epochs=2"],  # diverges with momentum 0.9
    "dafkd": ["train.optimizer=adam", "train.lr=0.003", "train.momentum=0"],  # SGD: chance
}


def config_file(name: str) -> Path:
    """``conf/<name>.yaml`` if there is one, else ``conf/default.yaml``."""
    own = ROOT / "conf" / f"{name}.yaml"
    return own if own.is_file() else ROOT / "conf" / "default.yaml"


def one_shot(name: str) -> bool:
    return issubclass(strategy_class(name), OneShot)


def _fields(cls: type, prefix: str = "") -> dict[str, Any]:
    """Dotted path -> default of every leaf field of a Config dataclass."""
    out: dict[str, Any] = {}
    inst = cls()
    for f in dataclasses.fields(cls):
        value = getattr(inst, f.name)
        if dataclasses.is_dataclass(value):
            out.update(_fields(type(value), f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = value
    return out


def tiny_overrides(name: str, out_dir: Path, robust: bool = False) -> list[str]:
    """The overrides of ``name``'s tiny run writing to ``out_dir``."""
    defaults = _fields(strategy_class(name).Config)
    cuts = [
        f"strategy.{path}={value}"
        for path, value in CUTS.items()
        if path in defaults
        and (
            isinstance(value, str)
            or defaults[path] is None
            or (
                isinstance(defaults[path], int)
                and not isinstance(defaults[path], bool)
                and defaults[path] > value  # type: ignore[operator]
            )
        )
    ]
    return [
        f"strategy.name={name}",
        *COMMON,
        f"rounds={1 if one_shot(name) else 2}",
        *cuts,
        *EXTRA.get(name, []),
        *(robust_overrides(name) if robust else []),
        f"output_dir={out_dir}",
    ]


def tiny_config(name: str, out_dir: Path, robust: bool = False):
    try:
        return load_experiment(config_file(name), tiny_overrides(name, out_dir, robust))
    except ConfigError as exc:
        raise FuzzerBug(f"{name}: the tiny configuration is invalid: {exc}") from exc


class FuzzerBug(Exception):
    """The fuzzer's own fault (an invalid configuration), never a finding about the server."""


# -- what the server is sent back ---------------------------------------------------------------
@dataclass(frozen=True, repr=False)
class Slot:
    """One record of a reply: its name, its kind and its keys (float arrays marked)."""

    name: str
    kind: str  # "array" | "metric" | "config"
    keys: tuple[str, ...]
    float_keys: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"{self.kind} record {self.name!r}"


@dataclass(frozen=True, repr=False)
class Target:
    """A reply that the clean run got: client ``pid``'s answer to ``message_type`` in
    ``server_round`` (the round in the message's config: 0 for FedGO's discriminators)."""

    message_type: str
    server_round: int
    pid: int
    slots: tuple[Slot, ...]

    @property
    def node(self) -> int:
        return self.pid + 2  # InProcessGrid's node of partition p

    def label(self) -> str:
        return f"{self.message_type}@{self.server_round}/client {self.pid}"

    __repr__ = label


def _round_of(messages: list[Message]) -> int | None:
    for m in messages:
        with contextlib.suppress(Exception):
            return int(m.content.config_records[msgs.CONFIG][msgs.SERVER_ROUND])
    return None


def _pid_of(reply: Message) -> int:
    group = reply.metadata.group_id
    return int(group) if group.isascii() and group.isdigit() else reply.metadata.src_node_id - 2


def _slots(reply: Message) -> tuple[Slot, ...]:
    """The reply's records, but for the protocol's echo of the reply token, which only the
    token kinds (:data:`TOKEN_KINDS`) change: a kind that draws a record draws one the client
    algorithm declares, as before the echo existed."""
    content = reply.content
    out = []
    for name, rec in content.array_records.items():
        keys = tuple(rec.keys())
        floats = tuple(k for k in keys if np.dtype(rec[k].dtype).kind == "f")
        out.append(Slot(name, "array", keys, floats))
    for name, rec in content.metric_records.items():
        out.append(Slot(name, "metric", tuple(rec.keys())))
    for name, rec in content.config_records.items():
        if name != msgs.ECHO:
            out.append(Slot(name, "config", tuple(rec.keys())))
    return tuple(out)


# -- mutations ----------------------------------------------------------------------------------
ARRAY_VALUES = {"nan": np.nan, "posinf": np.inf, "neginf": -np.inf, "1e30": 1e30, "1e308": 1e308}
SCALES = {"1e5": 1e5, "1e12": 1e12}
GROUP_IDS = {"superscript": "\u00b2", "arabic": "\u0661"}  # "²" and "١": str.isdigit() holds

KINDS: dict[str, str] = {
    # kind -> what it does (one record / key of the reply is drawn where it applies)
    **{f"array_{k}": f"a float array's values -> {k} (all, or one element)" for k in ARRAY_VALUES},
    **{f"metric_{k}": f"a metric scalar -> {k}" for k in ARRAY_VALUES},
    "dtype_float64": "an array cast to float64",
    "dtype_int": "an array cast to int64",
    "dtype_bool": "an array cast to bool",
    "shape": "an array of another shape",
    "metric_list": "a metric scalar -> a list of floats",
    "metric_string": "the metric record sent as a ConfigRecord with a string in it",
    "missing_key": "one key of a record removed",
    "missing_record": "one record removed",
    "extra_key": "an unknown key added to a record",
    "extra_record": "an unknown record added",
    **{f"scale_{k}": f"every float array of a record x{k}" for k in SCALES},
    **{f"scale_last_{k}": f"the last layer (last two arrays) of a record x{k}" for k in SCALES},
    "group_superscript": 'metadata.group_id -> "\u00b2"',
    "group_arabic": 'metadata.group_id -> "\u0661"',
    "group_other": "metadata.group_id -> another client's partition id",
    "group_garbage": "metadata.group_id -> garbage",
    "duplicate": "the reply yielded twice (the same Message)",
    "duplicate_copy": "the reply yielded twice (a deep copy)",
    "token_missing": "the echo of the reply token removed",
    "token_garbage": "the echoed reply token -> garbage (not a token, or not a string)",
    "token_other": "the echoed reply token -> that of another client's message of the batch",
}
"""Every mutation kind; the benchmark runs each on each strategy."""

METADATA_KINDS = {k for k in KINDS if k.startswith(("group_", "duplicate"))}

TOKEN_KINDS = {k for k in KINDS if k.startswith("token_")}
"""The kinds that change the reply's echo of its reply token; only their replies may be
refused for the token (:func:`verdict`)."""

TOKEN_REFUSALS = ("reply token",)
"""What the intake's WARNING says when it refuses a reply for its token."""

WITHHOLD = "withhold"
"""Not a mutation but the yardstick of the robust verdict: the reply never reaches the server
(:func:`withheld_accuracy`)."""


def applicable(kind: str, target: Target) -> bool:
    """Whether ``kind`` has something to change in ``target``'s reply."""
    slots = target.slots
    arrays = [s for s in slots if s.kind == "array" and s.keys]
    if kind in METADATA_KINDS or kind in TOKEN_KINDS or kind == "extra_record":
        return True
    if kind in ("extra_key", "missing_record"):
        return bool(slots)
    if kind == "missing_key":
        return any(s.keys for s in slots)
    if kind.startswith(("array_", "scale_")):
        return any(s.float_keys for s in arrays)
    if kind.startswith("dtype_") or kind == "shape":
        return bool(arrays)
    if kind == "metric_string":
        return any(s.kind == "metric" and s.keys for s in slots)
    if kind.startswith("metric_"):
        return any(s.kind in ("metric", "config") and s.keys for s in slots)
    raise KeyError(kind)


@dataclass(frozen=True, repr=False)
class Mutation:
    """What to do to ``target``'s reply: ``kind`` on ``record`` / ``key`` (``None``: not used),
    ``whole``: every element (else one), ``other``: the relabelled group id."""

    target: Target
    kind: str
    record: str | None = None
    key: str | None = None
    whole: bool = True
    other: str = ""

    def describe(self) -> str:
        where = "".join(
            [
                f" {self.record}" if self.record else "",
                f"[{self.key!r}]" if self.key else "",
                " (one element)" if not self.whole and self.kind.startswith("array_") else "",
                f" -> {self.other!r}" if self.other else "",
            ]
        )
        return f"{self.kind}{where} on {self.target.label()}"

    __repr__ = describe  # what Hypothesis prints for a falsifying example

    # -- applying --------------------------------------------------------------------------
    def apply(self, reply: Message, sent: list[Message] | None = None) -> list[Message]:
        """The messages the server gets instead of ``reply`` (edited in place); ``sent``: the
        batch of messages ``reply`` answers one of (``token_other`` takes another's token)."""
        kind = self.kind
        if kind == WITHHOLD:
            return []
        if kind in TOKEN_KINDS:
            self._token(reply, sent or [])
            return [reply]
        if kind == "duplicate":
            return [reply, reply]
        if kind == "duplicate_copy":
            return [reply, copy.deepcopy(reply)]
        if kind.startswith("group_"):
            reply.metadata.__dict__["_group_id"] = self.other  # as messages._from_destination
            return [reply]
        content = reply.content
        if kind == "extra_record":
            content["fuzz-extra"] = {
                "array": ArrayRecord({"fuzz": Array(np.ones(3, np.float32))}),
                "metric": MetricRecord({"fuzz": 1.0}),
                "config": ConfigRecord({"fuzz": "x"}),
            }[self.key or "metric"]
            return [reply]
        if kind == "missing_record":
            del content[self.record]
            return [reply]
        rec = content[self.record]
        if kind == "missing_key":
            items = dict(rec.items())
            items.pop(self.key, None)
            content[self.record] = type(rec)(items)
            return [reply]
        if isinstance(rec, ArrayRecord):
            content[self.record] = ArrayRecord(self._arrays(to_plain(rec)))
        else:
            content[self.record] = self._scalars(rec)
        return [reply]

    def _token(self, reply: Message, sent: list[Message]) -> None:
        content = reply.content
        if self.kind == "token_missing":
            content.pop(msgs.ECHO, None)
            return
        if self.kind == "token_garbage":
            value: Any = {"int": 7, "empty": "", "nonhex": "z" * 32}.get(self.other, self.other)
            content[msgs.ECHO] = ConfigRecord({msgs.REPLY_TOKEN: value})
            return
        own = reply.metadata.src_node_id
        others = [
            m.content[msgs.CONFIG][msgs.REPLY_TOKEN]
            for m in sent
            if m.metadata.dst_node_id != own and msgs.REPLY_TOKEN in m.content[msgs.CONFIG]
        ]
        if others:  # else (one client in the batch) the echo is left alone: nothing to swap in
            content[msgs.ECHO] = ConfigRecord({msgs.REPLY_TOKEN: others[0]})

    def _arrays(self, arrays: dict[str, np.ndarray]) -> dict[str, Array]:
        kind, key = self.kind, self.key
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            if kind == "extra_key":
                arrays["fuzz-extra"] = np.ones(3, np.float32)
            elif kind.startswith("array_"):
                v = arrays[key].copy()
                value = ARRAY_VALUES[kind.removeprefix("array_")]
                if self.whole:
                    v[...] = value
                else:
                    v.reshape(-1)[0] = value
                arrays[key] = v
            elif kind.startswith("scale_last_"):
                factor = SCALES[kind.removeprefix("scale_last_")]
                floats = [k for k, v in arrays.items() if v.dtype.kind == "f"]
                for k in floats[-2:]:
                    arrays[k] = (arrays[k] * factor).astype(arrays[k].dtype)
            elif kind.startswith("scale_"):
                factor = SCALES[kind.removeprefix("scale_")]
                for k, v in arrays.items():
                    if v.dtype.kind == "f":
                        arrays[k] = (v * factor).astype(v.dtype)
            elif kind == "dtype_float64":
                arrays[key] = arrays[key].astype(np.float64)
            elif kind == "dtype_int":
                arrays[key] = arrays[key].astype(np.int64)
            elif kind == "dtype_bool":
                arrays[key] = arrays[key].astype(bool)
            elif kind == "shape":
                v = arrays[key]
                arrays[key] = np.zeros((*v.shape, 2), v.dtype) if self.whole else v.reshape(-1)[:1]
            else:
                raise KeyError(kind)
        return {k: Array(np.asarray(v, order="C")) for k, v in arrays.items()}

    def _scalars(self, rec: MetricRecord | ConfigRecord) -> MetricRecord | ConfigRecord:
        kind, key = self.kind, self.key
        items = dict(rec.items())
        if kind == "extra_key":
            items["fuzz-extra"] = 1.0
        elif kind.startswith("metric_") and kind.removeprefix("metric_") in ARRAY_VALUES:
            items[key] = float(ARRAY_VALUES[kind.removeprefix("metric_")])
        elif kind == "metric_list":
            items[key] = [1.0, 2.0]
        elif kind == "metric_string":
            items[key] = "garbage"
            return ConfigRecord(items)
        elif kind.startswith("dtype_") or kind == "shape":
            return rec  # nothing array-like here (not drawn: see applicable)
        else:
            raise KeyError(kind)
        return type(rec)(items)


def to_plain(rec: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in rec.items()}


def choose(kind: str, target: Target, pick: Callable[[list], Any], others: list[int]) -> Mutation:
    """A concrete mutation of ``kind`` on ``target``; ``pick`` chooses among options (Hypothesis'
    ``draw(sampled_from(...))`` in the test, a seeded ``random.choice`` in the benchmark)."""
    slots = {s.name: s for s in target.slots}

    def slot(where: Callable[[Slot], bool]) -> Slot:
        return slots[pick([s.name for s in target.slots if where(s)])]

    if kind in ("duplicate", "duplicate_copy", "token_missing", "token_other"):
        return Mutation(target, kind)
    if kind == "token_garbage":
        return Mutation(target, kind, other=pick(["int", "empty", "nonhex"]))
    if kind.startswith("group_"):
        if kind == "group_other":
            value = str(pick(others or [target.pid + 1]))
        elif kind == "group_garbage":
            value = pick(["x", "-1", "99999999999999999999", " 1", "1.0", "0x1"])
        else:
            value = GROUP_IDS[kind.removeprefix("group_")]
        return Mutation(target, kind, other=value)
    if kind == "extra_record":
        return Mutation(target, kind, key=pick(["array", "metric", "config"]))
    if kind in ("missing_record", "extra_key"):
        return Mutation(target, kind, slot(lambda s: True).name)
    if kind == "missing_key":
        chosen = slot(lambda s: bool(s.keys))
        return Mutation(target, kind, chosen.name, pick(list(chosen.keys)))
    if kind.startswith("scale_"):
        return Mutation(target, kind, slot(lambda s: bool(s.float_keys)).name)
    if kind.startswith("array_"):
        chosen = slot(lambda s: bool(s.float_keys))
        whole = pick([True, False])
        return Mutation(target, kind, chosen.name, pick(list(chosen.float_keys)), whole)
    if kind.startswith("dtype_") or kind == "shape":
        chosen = slot(lambda s: s.kind == "array" and bool(s.keys))
        whole = pick([True, False]) if kind == "shape" else True
        return Mutation(target, kind, chosen.name, pick(list(chosen.keys)), whole)
    if kind.startswith("metric_"):
        wanted = ("metric",) if kind == "metric_string" else ("metric", "config")
        chosen = slot(lambda s: s.kind in wanted and bool(s.keys))
        return Mutation(target, kind, chosen.name, pick(list(chosen.keys)))
    raise KeyError(kind)


# -- running ------------------------------------------------------------------------------------
@dataclass
class Interception:
    """What :func:`intercepted` saw: the mutations applied, and the slice of the logged
    warnings that answer the mutated reply (``window``: from its arrival to the next batch of
    messages the server sends, or the end of the run)."""

    applied: list[str] = field(default_factory=list)
    window: list[int] = field(default_factory=list)  # [start] or [start, end] in ``lines``


@contextlib.contextmanager
def intercepted(
    mutation: Mutation | None,
    seen: list[Target] | None = None,
    lines: list[str] | None = None,
) -> Iterator[Interception]:
    """Wrap :meth:`InProcessGrid.stream`: record every reply's :class:`Target` in ``seen`` and
    apply ``mutation`` to its target's replies, noting where in ``lines`` (the warnings being
    logged) the server's answer to it starts and ends."""
    original = InProcessGrid.stream
    state = Interception()
    logged = lines if lines is not None else []

    def stream(self, messages, *, timeout=None):
        if len(state.window) == 1:  # the server sends again: it is done with the mutated reply
            state.window.append(len(logged))
        messages = list(messages)
        rnd = _round_of(messages)
        for reply in original(self, messages, timeout=timeout):
            if rnd is None or reply.has_error():
                yield reply
                continue
            target = Target(reply.metadata.message_type, rnd, _pid_of(reply), _slots(reply))
            if seen is not None:
                seen.append(target)
            t = mutation.target if mutation is not None else None
            if t is not None and (t.message_type, t.server_round, t.pid) == (
                target.message_type,
                target.server_round,
                target.pid,
            ):
                state.applied.append(mutation.describe())
                if not state.window:
                    state.window.append(len(logged))
                yield from mutation.apply(reply, messages)
            else:
                yield reply

    InProcessGrid.stream = stream  # type: ignore[method-assign]
    try:
        yield state
    finally:
        InProcessGrid.stream = original  # type: ignore[method-assign]
        if len(state.window) == 1:
            state.window.append(len(logged))
