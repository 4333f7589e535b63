"""Per-round checkpoints of the server, and resuming a run from one.

After every round the ServerApp writes ``checkpoint.pt`` in the run folder (atomically, with
:mod:`fedgo_flwr.runtime.fileio`: written to a temporary file, ``fsync``-ed, renamed, folder
``fsync``-ed, so a crash never leaves half a checkpoint); the one before it is kept as
``checkpoint.prev.pt``. It holds the round number, the global model, the strategy's own state
(SCAFFOLD's control variate, FedDF's previous model, ...; FedGO's generator and discriminators
are in ``generator.pt`` and ``discriminators.pt`` beside it), the global random number
generators, the metrics rows so far, the run token that names the clients' state files, and
the resolved configuration.

A checkpoint is data only: every numpy array is stored as a tensor (in a ``{"__numpy__":
tensor}`` marker, so it comes back as the same numpy array) and everything else is plain
Python data, so it is read with ``torch.load(..., weights_only=True)``, which refuses any other
object. A planted or foreign ``checkpoint.pt`` can therefore not run code on resume; it is
refused (or skipped for the previous checkpoint, with a WARNING), and every field is checked
before the run uses it: its types, and its values (:func:`read_checkpoint`: the model's
arrays real numbers, finite and at most :data:`MAX_PARAMETER` in magnitude, every floating
array of the strategy's state finite). Once the configured model exists, the ServerApp checks
the checkpoint's model against it and its round against the run's
(:func:`check_resumable`), and the strategy checks its own state
(:meth:`strategies.base.Strategy.state_problem`); each problem is one
:class:`CheckpointError` naming the file, raised before round 1 and before the run folder's
files are rewritten.

A run started with ``resume: true`` whose folder holds a checkpoint continues after the
checkpoint's round. Every random draw of a round is seeded from ``(seed, round, ...)``, so the
resumed run ends with the same metrics as an uninterrupted one (on CPU).
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from logging import WARNING
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.supercore import log

from fedgo_flwr.config.experiment import ExperimentConfig
from fedgo_flwr.learning.aggregation import check_arrays
from fedgo_flwr.runtime.fileio import atomic_torch_save, safe_torch_load

CHECKPOINT_FILE = "checkpoint.pt"
PREVIOUS_FILE = "checkpoint.prev.pt"
FORMAT = 2  # 1: the pickled numpy objects before weights_only loading (not readable now)

# Keys that may differ between the interrupted run and the resumed one. ``eval``: its batch
# size does not change a result (inference is batch-invariant), the others only which rounds
# are tested and what the summary says.
RESUMABLE_CHANGES = {
    "eval",
    "logging",
    "resume",
    "overwrite",
    "strict",
    "rounds",
    "round_timeout",
    "faults",
    "checkpoint",
    "device",
    "client_device",
    "resources",
    "output_dir",
    "name",
}

MAX_PARAMETER = 1e6
"""The largest magnitude of a floating value in a checkpoint's model.

Honest runs stay far below it: measured, the checkpoints of the resume tests (every strategy
on digits) hold no value above 1.5 in magnitude, nor do those of ``cnn_bn`` and ``resnet8``
after 3 rounds of 2 local epochs (about 1.04, BatchNorm statistics included); trained weights
are of order 1 and BatchNorm running variances are those of normalised activations. A value
above 1e6 is a diverged or tampered model, one no run should be continued from: a model of
1e30 sent to the clients makes every reply non-finite (each is dropped, and the run goes on
with 0 usable replies a round). 1e6 is the bound of a teacher's logits, too
(:data:`fedgo_flwr.learning.distill.MAX_TEACHER_LOGIT`). Integer arrays (BatchNorm's
``num_batches_tracked``) count batches and have no such bound."""

_RUN_TOKEN = re.compile(r"[0-9a-f]{32}")
_NUMPY, _NUMPY_SCALAR = "__numpy__", "__numpy_scalar__"


def new_run_token() -> str:
    """A fresh run token (names the clients' state folders of one run): 32 hex digits."""
    return uuid.uuid4().hex


class CheckpointError(ValueError):
    """A checkpoint this run cannot resume from; the message names the file and the problem."""


def is_run_token(token: object) -> bool:
    """Whether ``token`` has the form :func:`new_run_token` makes (a safe folder name)."""
    return isinstance(token, str) and _RUN_TOKEN.fullmatch(token) is not None


@dataclass
class Checkpoint:
    """The server's state after ``round``."""

    round: int
    arrays: dict[str, np.ndarray]
    strategy_state: dict[str, Any]
    metrics: list[dict[str, Any]]
    config: dict[str, Any]
    run_token: str = field(default_factory=new_run_token)
    rng: dict[str, Any] = field(default_factory=dict)
    source: Path | None = field(default=None, compare=False)
    """The file it was read from (not saved)."""


SAVED_FIELDS = tuple(f.name for f in fields(Checkpoint) if f.name != "source")
"""The fields a checkpoint file holds."""


def capture_rng() -> dict[str, Any]:
    return {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }


def restore_rng(state: dict[str, Any]) -> None:
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "numpy" in state:
        np.random.set_state(state["numpy"])
    if "python" in state:
        random.setstate(state["python"])


# -- plain data <-> what weights_only loading accepts -------------------------------------


def encode(obj: Any, where: str = "checkpoint") -> Any:
    """``obj`` with every numpy array and scalar turned into a tagged tensor.

    Dicts, lists, tuples, str, int, float, bool, None and tensors pass unchanged; anything
    else raises a ``TypeError`` naming where it sits (it could not be loaded safely).
    """
    if isinstance(obj, np.ndarray):
        try:
            return {_NUMPY: torch.from_numpy(np.require(obj, requirements=["C", "W"]))}
        except TypeError as exc:
            raise TypeError(f"{where}: numpy dtype {obj.dtype} cannot be saved") from exc
    if isinstance(obj, np.generic):
        return {_NUMPY_SCALAR: encode(np.asarray(obj), where)[_NUMPY]}
    if isinstance(obj, Mapping):
        return {k: encode(v, f"{where}.{k}") for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        items = [encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else tuple(items)
    if obj is None or isinstance(obj, str | int | float | bool | torch.Tensor):
        return obj
    raise TypeError(f"{where}: a {type(obj).__name__} cannot be saved in a checkpoint")


def decode(obj: Any) -> Any:
    """The inverse of :func:`encode`."""
    if isinstance(obj, dict):
        if len(obj) == 1 and isinstance(next(iter(obj.values())), torch.Tensor):
            key, value = next(iter(obj.items()))
            if key == _NUMPY:
                return value.numpy()
            if key == _NUMPY_SCALAR:
                return value.numpy()[()]
        return {k: decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(decode(v) for v in obj)
    return obj


# -- saving and loading --------------------------------------------------------------------


def save_checkpoint(out_dir: Path, ckpt: Checkpoint) -> Path:
    """Write ``out_dir/checkpoint.pt`` atomically; the one it replaces becomes the previous.

    The data is encoded first (nothing is renamed if it cannot be saved). Between the two
    renames only ``checkpoint.prev.pt`` exists; :func:`load_checkpoint` then uses it.
    """
    data = {"format": FORMAT, **encode({name: getattr(ckpt, name) for name in SAVED_FIELDS})}
    newest = Path(out_dir) / CHECKPOINT_FILE
    if newest.is_file():
        os.replace(newest, newest.with_name(PREVIOUS_FILE))
    return atomic_torch_save(newest, data)  # also fsyncs the folder, so both renames


def read_checkpoint(path: Path) -> Checkpoint:
    """One checkpoint file, loaded safely and checked field by field: types, and the values
    that need no model to check (:class:`CheckpointError`, a ``ValueError``)."""
    try:
        raw = safe_torch_load(path, "checkpoint")
    except ValueError as exc:
        raise CheckpointError(str(exc)) from exc
    if not isinstance(raw, dict):
        raise CheckpointError(f"checkpoint {path}: holds a {type(raw).__name__}, not a dict")
    fmt = raw.pop("format", 1)
    if fmt != FORMAT:
        raise CheckpointError(f"checkpoint {path}: field 'format' is {fmt!r}, expected {FORMAT}")
    names = set(SAVED_FIELDS)
    if set(raw) != names:
        missing, extra = sorted(names - set(raw)), sorted(set(raw) - names)
        raise CheckpointError(
            f"checkpoint {path}: missing fields {missing}, unknown fields {extra}"
        )
    ckpt = Checkpoint(**decode(raw), source=Path(path))
    problem = _field_problem(ckpt) or _value_problem(ckpt)
    if problem:
        raise CheckpointError(f"checkpoint {path}: field {problem}")
    return ckpt


def _field_problem(ckpt: Checkpoint) -> str | None:
    """The first field of ``ckpt`` that is not what a run writes, or ``None``."""

    def str_keyed(value: Any) -> bool:
        return isinstance(value, dict) and all(isinstance(k, str) for k in value)

    if type(ckpt.round) is not int or ckpt.round < 0:
        return f"'round' must be an int >= 0, not {ckpt.round!r}"
    if not str_keyed(ckpt.arrays) or not all(
        isinstance(v, np.ndarray) for v in ckpt.arrays.values()
    ):
        return "'arrays' must map names (str) to numpy arrays"
    if not str_keyed(ckpt.strategy_state):
        return "'strategy_state' must be a dict with str keys"
    if not isinstance(ckpt.metrics, list) or not all(str_keyed(r) for r in ckpt.metrics):
        return "'metrics' must be a list of dicts with str keys"
    if not str_keyed(ckpt.config):
        return "'config' must be a dict with str keys"
    if not is_run_token(ckpt.run_token):
        return f"'run_token' must be 32 hex digits, not {ckpt.run_token!r}"
    if not str_keyed(ckpt.rng) or not set(ckpt.rng) <= {"torch", "numpy", "python"}:
        return "'rng' must be a dict with keys among torch, numpy, python"
    torch_state = ckpt.rng.get("torch")
    if torch_state is not None and not (
        isinstance(torch_state, torch.Tensor) and torch_state.dtype == torch.uint8
    ):
        return "'rng.torch' must be a uint8 tensor"
    for name in ("numpy", "python"):
        if name in ckpt.rng and not isinstance(ckpt.rng[name], tuple):
            return f"'rng.{name}' must be a tuple"
    return None


def _real_arrays_problem(
    arrays: Mapping[str, np.ndarray], bound: float | None = MAX_PARAMETER
) -> str | None:
    """Why ``arrays`` (a model's) is no model a run can hold, or ``None``: an array of other
    than real numbers, a non-finite value, or one above ``bound`` in magnitude."""
    for key, value in arrays.items():
        if value.dtype.kind not in "fiu":
            return f"'{key}' has dtype {value.dtype.name}, not real numbers"
        if value.dtype.kind == "f" and value.size:
            if not np.isfinite(value).all():
                return f"'{key}' holds non-finite values"
            peak = float(np.abs(value).max())
            if bound is not None and peak > bound:
                return f"'{key}' holds {peak:.3g}, above {bound:g} in magnitude"
    return None


def _nonfinite_at(value: Any, where: str) -> str | None:
    """The first place in ``value`` (nested dicts, lists, tuples) of a floating array or tensor
    holding a non-finite value, or ``None``."""
    if isinstance(value, np.ndarray):
        bad = value.dtype.kind in "fc" and value.size and not np.isfinite(value).all()
        return where if bad else None
    if isinstance(value, torch.Tensor):
        bad = value.is_floating_point() and value.numel() and not torch.isfinite(value).all()
        return where if bad else None
    items: Any = ()
    if isinstance(value, Mapping):
        items = ((f"{where}.{k}", v) for k, v in value.items())
    elif isinstance(value, list | tuple):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(value))
    for name, item in items:
        found = _nonfinite_at(item, name)
        if found:
            return found
    return None


def _value_problem(ckpt: Checkpoint) -> str | None:
    """The first value of ``ckpt`` that no run writes, as far as it can be told without the
    configured model: the model's arrays (:func:`_real_arrays_problem`) and the floating arrays
    of the strategy's state, which must be finite."""
    problem = _real_arrays_problem(ckpt.arrays)
    if problem:
        return f"'arrays': {problem}"
    where = _nonfinite_at(ckpt.strategy_state, "strategy_state")
    if where:
        return f"'{where}' holds non-finite values"
    return None


def arrays_problem(
    arrays: Any,
    template: Mapping[str, np.ndarray],
    what: str,
    of: str = "the configured model",
    bound: float | None = MAX_PARAMETER,
) -> str | None:
    """Why ``arrays`` (named ``what`` in the message) cannot stand for ``template`` (named
    ``of``): not a dict of numpy arrays, other keys, shapes or dtypes, non-finite values, or a
    value above ``bound`` in magnitude (``None``: no bound); ``None`` if it can."""
    if not isinstance(arrays, Mapping) or not all(
        isinstance(v, np.ndarray) for v in arrays.values()
    ):
        return f"{what}: not a dict of arrays (holds a {type(arrays).__name__})"
    problem = check_arrays(arrays, template, what, of)
    if problem is None:
        problem = _real_arrays_problem(arrays, bound)
        problem = f"{what}: {problem}" if problem else None
    return problem


def check_resumable(ckpt: Checkpoint, template: Mapping[str, np.ndarray], last_round: int) -> None:
    """Raise :class:`CheckpointError` (naming the file) unless the run can go on from ``ckpt``:
    its model must have the keys, shapes and dtypes of ``template`` (the configured model's
    state), and its round must be at most ``last_round``, the run's last round (``rounds``;
    a one-shot strategy's last server epoch). A checkpoint of the last round itself is a
    finished run (:func:`fedgo_app.server_app.restore_strategy` says what resuming it
    does)."""
    where = f"checkpoint {ckpt.source}" if ckpt.source else "checkpoint"
    problem = arrays_problem(ckpt.arrays, template, "'arrays'")
    if problem:
        raise CheckpointError(f"{where}: field {problem}")
    if ckpt.round > last_round:
        raise CheckpointError(
            f"{where}: field 'round' is {ckpt.round}, beyond this run's last round "
            f"{last_round}: a run cannot be resumed with fewer rounds than it has done (set "
            "rounds to at least its round, or delete the checkpoint files to start over)"
        )


def load_checkpoint(out_dir: Path) -> Checkpoint | None:
    """The run folder's checkpoint, or ``None`` if it has none.

    Falls back to ``checkpoint.prev.pt`` (with a WARNING) when ``checkpoint.pt`` is missing,
    unreadable or invalid; raises ``ValueError`` naming both files when neither can be used.
    """
    newest, previous = Path(out_dir) / CHECKPOINT_FILE, Path(out_dir) / PREVIOUS_FILE
    problems: list[str] = []
    for path in (newest, previous):
        if not path.is_file():
            continue
        try:
            ckpt = read_checkpoint(path)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        if path == previous:
            why = problems[0] if problems else f"{newest} is missing"
            log(WARNING, "%s; resuming from the previous checkpoint %s instead", why, path)
        return ckpt
    if not problems:
        return None
    raise CheckpointError(f"{'; '.join(problems)}. Delete the checkpoint files to start over")


def config_differences(saved: dict[str, Any], cfg: ExperimentConfig) -> list[str]:
    """Dotted keys whose values differ between the checkpoint's config and ``cfg``.

    A key that the checkpoint lacks (one added to the project after it was written, the
    strategy's parameters included) counts as unchanged while ``cfg`` has that key's default,
    which keeps the earlier behaviour.
    """
    current = cfg.to_dict()
    out: list[str] = []

    def walk(a: Any, b: Any, default: Any, prefix: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            default = default if isinstance(default, dict) else {}
            for key in sorted(set(a) | set(b)):
                if not prefix and key in RESUMABLE_CHANGES:
                    continue
                if key not in a and key in default and b.get(key) == default[key]:
                    continue
                walk(a.get(key), b.get(key), default.get(key), f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix.rstrip('.')} ({a!r} -> {b!r})")

    defaults = ExperimentConfig().to_dict(strategy_params=False)
    params = cfg.strategy.params
    if dataclasses.is_dataclass(params) and not isinstance(params, type):
        # The strategy's own parameters: a key added to its Config since the checkpoint.
        defaults["strategy"] = dataclasses.asdict(type(params)())
    walk(saved, current, defaults, "")
    return out
