"""Per-round checkpoints of the server, and resuming a run from one.

After every round the ServerApp writes ``checkpoint.pt`` in the run folder (atomically, with
:mod:`fedgo_flwr.fileio`, so a crash never leaves half a checkpoint). It holds the round
number, the global model, the strategy's own state (SCAFFOLD's control variate, FedDF's
previous model, ...; FedGO's generator and discriminators are in ``generator.pt`` and
``discriminators.pt`` beside it), the global random number generators, the metrics rows so far,
the run token that names the clients' state files, and the resolved configuration.

A run started with ``resume: true`` whose folder holds a checkpoint continues after the
checkpoint's round. Every random draw of a round is seeded from ``(seed, round, ...)``, so the
resumed run ends with the same metrics as an uninterrupted one (on CPU).
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedgo_flwr.config import ExperimentConfig
from fedgo_flwr.fileio import atomic_torch_save

CHECKPOINT_FILE = "checkpoint.pt"

# Keys that may differ between the interrupted run and the resumed one.
RESUMABLE_CHANGES = {
    "resume",
    "rounds",
    "round_timeout",
    "faults",
    "checkpoint",
    "device",
    "resources",
    "output_dir",
    "name",
}


def new_run_token() -> str:
    """A fresh run token (names the clients' state folders of one run)."""
    return uuid.uuid4().hex


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


def save_checkpoint(out_dir: Path, ckpt: Checkpoint) -> Path:
    """Write ``out_dir/checkpoint.pt`` atomically."""
    return atomic_torch_save(Path(out_dir) / CHECKPOINT_FILE, ckpt.__dict__)


def load_checkpoint(out_dir: Path) -> Checkpoint | None:
    """The run folder's checkpoint, or ``None`` if it has none."""
    path = Path(out_dir) / CHECKPOINT_FILE
    if not path.is_file():
        return None
    try:
        raw = torch.load(path, map_location="cpu", weights_only=False)
        return Checkpoint(**raw)
    except Exception as exc:  # a truncated or foreign file
        problem = f"checkpoint {path} is unreadable ({exc}); delete it to start over"
        raise ValueError(problem) from exc


def config_differences(saved: dict[str, Any], cfg: ExperimentConfig) -> list[str]:
    """Dotted keys whose values differ between the checkpoint's config and ``cfg``."""
    current = cfg.to_dict()
    out: list[str] = []

    def walk(a: Any, b: Any, prefix: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                if not prefix and key in RESUMABLE_CHANGES:
                    continue
                walk(a.get(key), b.get(key), f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix.rstrip('.')} ({a!r} -> {b!r})")

    walk(saved, current, "")
    return out
