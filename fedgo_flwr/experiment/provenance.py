"""What was run, and where: a config's fingerprint and a run folder's ``env.json``.

Two runs are runs *of the same experiment* when their resolved configs (``config.yaml``) agree
on every key that can change a result: :func:`config_fingerprint` hashes a config less the keys
in :data:`RESULT_NEUTRAL_KEYS` (the seed, which the seeds of one experiment differ in, and the
keys that only say where and how a run writes its files). The report groups runs by it and
never averages runs whose fingerprints differ (:mod:`fedgo_flwr.experiment.report`);
:func:`config_differences` names the keys two configs differ in, for the message that says so.

``env.json`` (:func:`write_environment`) records the code and machine a run used: the git
commit of this package's checkout and whether it had uncommitted changes, the Python, torch,
Flower and Ray versions, the host, the torch device, the command line and the fingerprint.
Standard library only (versions are read from the installed packages' metadata; torch is asked
for the device only when it is already imported), so the report can import it cheaply.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import platform
import subprocess
import sys
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = [
    "ENV_FILE",
    "RESULT_NEUTRAL_KEYS",
    "config_differences",
    "config_fingerprint",
    "environment",
    "git_state",
    "write_environment",
]

ENV_FILE = "env.json"
"""The provenance file in every run folder."""

RESULT_NEUTRAL_KEYS = (
    "seed",
    "name",
    "output_dir",
    "resume",
    "overwrite",
    "checkpoint",
    "logging",
    "strict",
)
"""Top-level config keys left out of the fingerprint: the seed (the seeds of one experiment are
its repeats), where and how the run writes its files, and ``strict`` (how the config was
checked). Every other key, ``rounds`` and the
resources included (``precision``, ``channels_last`` change the numbers), is part of what was
run."""

PACKAGES = ("torch", "flwr", "ray", "numpy", "fedgo-flwr")


def _comparable(config: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k not in RESULT_NEUTRAL_KEYS}


def config_fingerprint(config: Mapping[str, Any]) -> str:
    """12 hex digits of the SHA-256 of ``config`` less :data:`RESULT_NEUTRAL_KEYS`, as canonical
    JSON (sorted keys): equal for two configs exactly when they agree on every other key."""
    text = json.dumps(_comparable(config), sort_keys=True, default=repr, allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping) and value:
        for key, inner in value.items():
            _flatten(inner, f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = value


def config_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The dotted keys (``strategy.mu``, ``rounds``) whose values differ between two configs
    (or that only one has), less :data:`RESULT_NEUTRAL_KEYS`; sorted."""
    flat_a: dict[str, Any] = {}
    flat_b: dict[str, Any] = {}
    _flatten(_comparable(a), "", flat_a)
    _flatten(_comparable(b), "", flat_b)
    missing = object()
    return sorted(
        key
        for key in flat_a.keys() | flat_b.keys()
        if flat_a.get(key, missing) != flat_b.get(key, missing)
    )


def git_state(root: Path | None = None) -> dict[str, Any]:
    """``{"commit": sha, "dirty": bool}`` of the git checkout holding this package (or
    ``root``); both ``None`` when it is not a git checkout or git is not installed."""
    where = root or Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit or None, "dirty": bool(status.strip()) if commit else None}


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _device() -> str | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    return f"cpu: {torch.get_num_threads()} threads"


def environment(config: Mapping[str, Any], argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The provenance of a run of ``config`` started now by ``argv`` (default ``sys.argv``)."""
    return {
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "config_fingerprint": config_fingerprint(config),
        "git": git_state(),
        "python": platform.python_version(),
        "packages": {name: _version(name) for name in PACKAGES},
        "host": platform.node(),
        "platform": platform.platform(),
        "device": _device(),
        "command": list(sys.argv if argv is None else argv),
    }


def write_environment(
    out_dir: Path, config: Mapping[str, Any], resumed: bool = False
) -> dict[str, Any]:
    """Write ``out_dir/env.json`` (atomically) and return what it holds. A resumed run keeps
    the provenance of the starts before it, oldest first, under ``"earlier"`` (a resume may run
    other code on another machine)."""
    from fedgo_flwr.runtime.fileio import atomic_write_text

    env = environment(config)
    if resumed:
        try:
            before = json.loads((out_dir / ENV_FILE).read_text())
        except (OSError, ValueError):
            before = None
        if isinstance(before, dict):
            earlier = before.pop("earlier", [])
            env["earlier"] = [*(earlier if isinstance(earlier, list) else []), before]
    atomic_write_text(out_dir / ENV_FILE, json.dumps(env, indent=2, sort_keys=False) + "\n")
    return env
