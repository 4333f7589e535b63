"""What was run, and where: a config's fingerprint and a run folder's ``env.json``.

Two runs are runs *of the same experiment* when their resolved configs (``config.yaml``) agree
on every key that can change a result: :func:`config_fingerprint` hashes a config less the keys
in :data:`RESULT_NEUTRAL_KEYS` (the seed, which the seeds of one experiment differ in, and the
keys that only say where and how a run writes its files). The report groups runs by it and
never averages runs whose fingerprints differ (:mod:`fedgo_flwr.records.report`);
:func:`config_differences` names the keys two configs differ in, for the message that says so.

``env.json`` (:func:`write_environment`) records the code and machine a run used: the git
commit of this package's checkout and whether it had uncommitted changes, the Python, torch,
Flower and Ray versions, the host, the torch device, the command line and the fingerprint.
The command line is what the user typed when ``run.sh`` started the run (:class:`Launch`: ``run.sh``
puts it in ``$FEDGO_COMMAND``, and hands it to the ServerApp in the run config's ``launch``
key, as it does the time it started, ``$FEDGO_STARTED``); other entry points record their own
``sys.argv`` (a plain ``flwr run``: Flower's process).
Standard library only (versions are read from the installed packages' metadata; torch is asked
for the device only when it is already imported), so the report can import it cheaply.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, MutableMapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = [
    "ENV_FILE",
    "LAUNCH_KEY",
    "Launch",
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
    """The provenance of a run of ``config`` started now by ``argv`` (default ``sys.argv``;
    when ``argv`` is given, this process's own ``sys.argv`` is kept too, as ``"process"``)."""
    env = {
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
    if argv is not None and list(argv) != sys.argv:
        env["process"] = list(sys.argv)
    return env


def write_environment(
    out_dir: Path,
    config: Mapping[str, Any],
    resumed: bool = False,
    command: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Write ``out_dir/env.json`` (atomically) and return what it holds; ``command`` is what
    the user typed (default: this process's ``sys.argv``). A resumed run keeps the provenance
    of the starts before it, oldest first, under ``"earlier"`` (a resume may run other code on
    another machine)."""
    from fedgo_flwr.runtime.fileio import atomic_write_text

    env = environment(config, command)
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


LAUNCH_KEY = "launch"
"""The run-config key (``pyproject.toml``) in which ``run.sh`` hands its :class:`Launch` to the
ServerApp: one JSON string, ``""`` when the run was not started by ``run.sh``."""

COMMAND_VAR, STARTED_VAR = "FEDGO_COMMAND", "FEDGO_STARTED"
"""What ``run.sh`` exports for its ``--local`` runs and for ``cli prepare``: the command line it
was started with, shell-quoted (``printf %q``), and the Unix time it started."""

LONGEST_LAUNCH = 24 * 3600.0
"""A launch longer than this (a start time left over in an environment) is not believed."""


@dataclasses.dataclass(frozen=True)
class Launch:
    """How the user started a run: the command line they typed (``None``: unknown) and when
    (Unix time; ``None``: unknown)."""

    command: tuple[str, ...] | None = None
    started: float | None = None

    @classmethod
    def from_environ(cls, environ: MutableMapping[str, str] | None = None) -> Launch:
        """The launch ``run.sh`` exported (:data:`COMMAND_VAR`, :data:`STARTED_VAR`), taken out
        of ``environ`` (default ``os.environ``) so that no process started later inherits it."""
        env = os.environ if environ is None else environ
        text, started = env.pop(COMMAND_VAR, None), env.pop(STARTED_VAR, None)
        command = None
        if text:
            try:
                command = tuple(shlex.split(text))
            except ValueError:  # a quoting shlex does not know ($'...'): kept as one string
                command = (text.strip(),)
        return cls(command, _number(started))

    @classmethod
    def from_json(cls, text: str) -> Launch:
        """The launch in a run config's :data:`LAUNCH_KEY` (``""`` or unreadable: unknown)."""
        try:
            raw = json.loads(text) if text else {}
        except ValueError:
            raw = {}
        if not isinstance(raw, dict):
            raw = {}
        command = raw.get("command")
        ok = isinstance(command, list) and all(isinstance(a, str) for a in command)
        return cls(tuple(command) if ok else None, _number(raw.get("started")))

    def to_json(self) -> str:
        return json.dumps(
            {
                "command": None if self.command is None else list(self.command),
                "started": self.started,
            }
        )

    def seconds_before(self, now: float | None = None) -> float:
        """Seconds from the launch to ``now`` (Unix time, default the present): what the run
        took before its ServerApp started (``run.sh``: the SuperLink, the config's checks,
        Flower's packaging; ``--local``: Python's imports); 0 when the start is unknown, in
        the future or over :data:`LONGEST_LAUNCH` ago."""
        if self.started is None:
            return 0.0
        seconds = (time.time() if now is None else now) - self.started
        return seconds if 0.0 <= seconds <= LONGEST_LAUNCH else 0.0


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None
