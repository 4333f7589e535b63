"""A content-hashed cache of G1 generators: trained once per (server data, settings), reused.

FedGO's scenario G1 trains a WGAN-GP generator on the server's unlabeled data before round 1
(Jang, Park, Lee, ICML 2025, Alg. 2; App. E.2: 100,000 generator steps, the largest single
cost of a CIFAR-10 run). What it learns depends only on what :func:`generator_key` lists: the
server's images (their bytes), the generator's settings (network, width, latent size, steps,
batch, learning rate, critic steps, penalty weight), the seed (the generator's and critic's
initial weights and the training's one random stream, :func:`fedgo_flwr.runtime.rng.make_rng`), the
flips, and where and how the numbers are computed (device, torch version, memory format, CPU
thread count). Runs that share all of them, e.g. several weightings or distillation settings
on one seed's split, train the same generator; with ``strategy.generator.cache`` set, the
first run stores it and the others load it.

An entry is a folder ``<cache>/<key hash>/`` holding ``generator.pt`` (the state dict) and
``meta.json`` (the full key, the file's SHA-256 and the training statistics), written last
and atomically, so a half-written entry is never read. While the generator trains, the folder
holds ``training.pt`` too (:func:`training_snapshot`), its training's snapshot every few
minutes: a run stopped before the generator is done leaves it, and the next run with the same
key goes on from it. An entry is used only if its key is
the run's exactly and the file's hash matches; anything else is a miss (the generator is
trained and the entry written again), logged with the reason.

Training draws only from its own seeded stream, so loading a stored generator leaves the
run's other random numbers where training it would have: a run that hits the cache computes
what the run that filled it did, bit for bit on a CPU.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedgo_flwr.runtime import kernels
from fedgo_flwr.runtime.fileio import atomic_torch_save, atomic_write_text, safe_torch_load

__all__ = [
    "GENERATOR_CACHE_VERSION",
    "CachedGenerator",
    "generator_key",
    "load_cached_generator",
    "store_generator",
    "training_snapshot",
]

GENERATOR_CACHE_VERSION = 1
"""Part of every key: raised when what a generator depends on changes meaning."""

SETTINGS = ("name", "latent_dim", "width", "steps", "batch_size", "lr", "n_critic", "gp_lambda")
"""The ``strategy.generator`` keys that shape what WGAN-GP trains (``path``, ``module`` and
the G3 keys select other scenarios, which are not cached)."""


def data_digest(x: np.ndarray) -> str:
    """SHA-256 of an array's dtype, shape and bytes."""
    arr = np.ascontiguousarray(x)
    h = hashlib.sha256(f"{arr.dtype.str}{arr.shape}".encode())
    h.update(memoryview(arr).cast("B"))
    return h.hexdigest()


def generator_key(
    settings: Any,
    *,
    seed: int,
    data: np.ndarray,
    flip: bool,
    augment: bool,
    device: torch.device,
) -> dict[str, Any]:
    """Everything a G1 generator trained with ``settings`` (a ``GeneratorConfig``) on the
    images ``data`` depends on (see the module docstring), as plain JSON values."""
    where: dict[str, Any] = {
        "device": device.type,
        "torch": torch.__version__,
        "channels_last": kernels.channels_last(),
    }
    if device.type == "cpu":
        where["threads"] = torch.get_num_threads()
    elif device.type == "cuda":
        where["gpu"] = torch.cuda.get_device_name(device)
    return {
        "version": GENERATOR_CACHE_VERSION,
        "generator": {k: getattr(settings, k) for k in SETTINGS},
        "seed": int(seed),
        "data_sha256": data_digest(data),
        "flip": bool(flip and augment),
        **where,
    }


def key_hash(key: dict[str, Any]) -> str:
    """The folder name of ``key``'s entry."""
    text = json.dumps(key, sort_keys=True, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass
class CachedGenerator:
    """A stored generator: its state dict, the statistics of the training that made it, and
    its entry's folder."""

    state: dict[str, torch.Tensor]
    stats: dict[str, Any]
    entry: Path


def load_cached_generator(
    cache: str | os.PathLike[str], key: dict[str, Any]
) -> tuple[CachedGenerator | None, str]:
    """The entry of ``key`` in ``cache``, or ``None`` and why it is a miss."""
    entry = Path(cache).expanduser() / key_hash(key)
    meta_file, weights = entry / "meta.json", entry / "generator.pt"
    if not meta_file.is_file():
        return None, f"no entry {entry}"
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return None, f"unreadable {meta_file} ({exc})"
    if not isinstance(meta, dict) or meta.get("key") != key:
        return None, f"{meta_file} was written for other settings"
    if not weights.is_file() or _file_sha256(weights) != meta.get("sha256"):
        return None, f"{weights} is missing or does not match its recorded SHA-256"
    try:
        state = safe_torch_load(weights, "cached generator")
    except ValueError as exc:
        return None, str(exc)
    if not isinstance(state, dict):
        return None, f"{weights} holds no state dict"
    return CachedGenerator(state, dict(meta.get("stats", {})), entry), "hit"


def training_snapshot(cache: str | os.PathLike[str], key: dict[str, Any]) -> Path:
    """Where the training of ``key``'s generator keeps its snapshot while it runs
    (:func:`fedgo_flwr.gan.wgan_gp.train_wgan_gp`'s ``resume_file``): in the entry's folder, so
    a training stopped before its end goes on there when a run with the same key starts."""
    return Path(cache).expanduser() / key_hash(key) / "training.pt"


def store_generator(
    cache: str | os.PathLike[str],
    key: dict[str, Any],
    state: dict[str, torch.Tensor],
    stats: dict[str, Any],
) -> Path:
    """Write ``state`` as ``key``'s entry in ``cache`` (``meta.json`` last); the entry."""
    entry = Path(cache).expanduser() / key_hash(key)
    entry.mkdir(parents=True, exist_ok=True)
    weights = atomic_torch_save(entry / "generator.pt", {k: v.cpu() for k, v in state.items()})
    finite = {k: v for k, v in stats.items() if not isinstance(v, float) or np.isfinite(v)}
    meta = {"key": key, "sha256": _file_sha256(weights), "stats": finite}
    atomic_write_text(entry / "meta.json", json.dumps(meta, sort_keys=True, indent=1) + "\n")
    return entry
