"""Helpers shared by the test modules (pytest puts this folder on ``sys.path``)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def rows_of(out_dir: Path) -> list[dict]:
    """The rows of a run's ``metrics.jsonl``."""
    return [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]


def without_timing(rows: list[dict]) -> list[dict]:
    """Rows without wall-clock figures (``elapsed`` and every ``*time*`` key)."""
    return [{k: v for k, v in r.items() if k != "elapsed" and "time" not in k} for r in rows]


def run_sh(
    *args: str, timeout: float = 600, tag: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``./run.sh args`` from the repository root, output captured (``env`` added)."""
    return subprocess.run(
        [str(ROOT / "run.sh"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "FEDGO_WORKDIR": str(ROOT), "FEDGO_TEST_TAG": tag, **(env or {})},
    )


def run_context(**run_config):
    """The ServerApp's ``Context``: the run config of ``pyproject.toml`` updated with
    ``run_config`` (as ``flwr run --run-config`` sets it)."""
    import tomllib

    from flwr.app import Context, RecordDict
    from flwr.common.config import flatten_dict

    app = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    declared = flatten_dict(app["config"])
    return Context(
        run_id=1,
        node_id=1,
        node_config={},
        state=RecordDict(),
        run_config={**declared, **run_config},
    )
