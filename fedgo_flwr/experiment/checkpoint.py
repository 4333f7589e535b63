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
before the run uses it.

A run started with ``resume: true`` whose folder holds a checkpoint continues after the
checkpoint's round. Every random draw of a round is seeded from ``(seed, round, ...)``, so the
resumed run ends with the same metrics as an uninterrupted one (on CPU).
"""

from __future__ import annotations

import os
import random
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from logging import WARNING
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.supercore import log

from fedgo_flwr.experiment.config import ExperimentConfig
from fedgo_flwr.runtime.fileio import atomic_torch_save

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

_RUN_TOKEN = re.compile(r"[0-9a-f]{32}")
_NUMPY, _NUMPY_SCALAR = "__numpy__", "__numpy_scalar__"


def new_run_token() -> str:
    """A fresh run token (names the clients' state folders of one run): 32 hex digits."""
    return uuid.uuid4().hex


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


def safe_torch_load(path: str | os.PathLike[str], what: str = "file") -> Any:
    """``torch.load(path, weights_only=True)`` on CPU; any failure is a ``ValueError`` naming
    ``path`` (a truncated file, or one that holds objects other than tensors and plain data,
    which weights_only loading refuses instead of running their code)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - truncated, foreign or malicious files alike
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(
            f"{what} {path} is unreadable or holds more than tensors and plain data "
            f"(refused by torch.load(weights_only=True): {first})"
        ) from exc


# -- saving and loading --------------------------------------------------------------------


def save_checkpoint(out_dir: Path, ckpt: Checkpoint) -> Path:
    """Write ``out_dir/checkpoint.pt`` atomically; the one it replaces becomes the previous.

    The data is encoded first (nothing is renamed if it cannot be saved). Between the two
    renames only ``checkpoint.prev.pt`` exists; :func:`load_checkpoint` then uses it.
    """
    data = {"format": FORMAT, **encode(dict(ckpt.__dict__))}
    newest = Path(out_dir) / CHECKPOINT_FILE
    if newest.is_file():
        os.replace(newest, newest.with_name(PREVIOUS_FILE))
    return atomic_torch_save(newest, data)  # also fsyncs the folder, so both renames


def read_checkpoint(path: Path) -> Checkpoint:
    """One checkpoint file, loaded safely and checked field by field (``ValueError``)."""
    raw = safe_torch_load(path, "checkpoint")
    if not isinstance(raw, dict):
        raise ValueError(f"checkpoint {path}: holds a {type(raw).__name__}, not a dict")
    fmt = raw.pop("format", 1)
    if fmt != FORMAT:
        raise ValueError(f"checkpoint {path}: field 'format' is {fmt!r}, expected {FORMAT}")
    names = set(Checkpoint.__dataclass_fields__)
    if set(raw) != names:
        missing, extra = sorted(names - set(raw)), sorted(set(raw) - names)
        raise ValueError(f"checkpoint {path}: missing fields {missing}, unknown fields {extra}")
    ckpt = Checkpoint(**decode(raw))
    problem = _field_problem(ckpt)
    if problem:
        raise ValueError(f"checkpoint {path}: field {problem}")
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
    raise ValueError(f"{'; '.join(problems)}. Delete the checkpoint files to start over")


def config_differences(saved: dict[str, Any], cfg: ExperimentConfig) -> list[str]:
    """Dotted keys whose values differ between the checkpoint's config and ``cfg``.

    A key that the checkpoint lacks (one added to the project after it was written) counts as
    unchanged while ``cfg`` has that key's default, which keeps the earlier behaviour.
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

    walk(saved, current, ExperimentConfig().to_dict(strategy_params=False), "")
    return out
