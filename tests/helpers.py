"""Helpers shared by the test modules (pytest puts this folder on ``sys.path``)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent

TINY_RUN = [
    "rounds=1",
    "data.num_clients=4",
    "data.train_subset=400",
    "data.test_subset=120",
    "fraction=0.5",
    "train.local_epochs=1",
    "resources.server_cpus=1",
]
"""One round of ``conf/default.yaml`` (FedAvg) on 4 clients, 2 of them sampled, 1 local epoch,
digits cut to a stratified 400 training and 120 test images as the golden runs cut them, the
server on one torch thread (tiny models: a second thread only waits, the more so beside other
work). A test that needs more says so with its own overrides: a later override of a key wins."""


def tiny_config(out_dir: Path, *overrides: str, conf: str = "default.yaml"):
    """``conf/<conf>`` with :data:`TINY_RUN`, writing to ``out_dir``, then ``overrides``."""
    from strategies import load_experiment

    return load_experiment(ROOT / "conf" / conf, [*TINY_RUN, f"output_dir={out_dir}", *overrides])


def log_messages(log) -> list[str]:
    """The messages of the records a ``caplog`` (or the ``flwr_log`` fixture) captured."""
    return [r.getMessage() for r in log.records]


def rows_of(out_dir: Path) -> list[dict]:
    """The rows of a run's ``metrics.jsonl``."""
    return [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]


def without_timing(rows: list[dict]) -> list[dict]:
    """Rows without wall-clock figures (``elapsed`` and every ``*time*`` key)."""
    return [{k: v for k, v in r.items() if k != "elapsed" and "time" not in k} for r in rows]


ONESHOT_TINY = [
    "data.train_subset=400",
    "data.test_subset=120",
    "data.num_clients=4",
    "train.local_epochs=2",
    "strategy.epochs=3",
    "strategy.nz=16",
    "strategy.ngf=8",
    "strategy.synthesis.batch_size=16",
    "strategy.synthesis.steps=3",
    "strategy.boost.batch_size=16",
    "eval.every=2",
    "checkpoint=false",
]
"""``conf/coboosting.yaml`` cut to seconds: 4 clients, 400 images, a small generator."""


SMALL_GAN = [
    "strategy.generator.latent_dim=16",
    "strategy.generator.width=8",
    "strategy.generator.batch_size=32",
    "strategy.generator.n_critic=2",
]
"""FedGO's generator (and its critic) cut as the golden runs cut them: at its defaults (width
64, 100 latent dimensions) the pre-FL stage of a tiny FedGO run takes 7 times the CPU of the
rest of the run (27 s against 4 s, measured on digits cut to 400 images)."""


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


@pytest.fixture(autouse=True)
def one_torch_thread(request):
    """Run a test on one torch thread and restore the count after it (autouse in the unit and
    integration tiers, whose ``conftest.py`` import it): tiny models gain nothing from a second
    thread, and beside other work on the machine the two threads wait for each other.

    The count stays 1 inside in-process runs too: ``torch.set_num_threads`` is held at 1 for the
    test, so the ServerApp's ``resources.server_cpus`` default (all cores) and the clients'
    counts do not raise it. A test marked ``torch_threads`` keeps torch's own thread handling:
    the golden runs (recorded with the ServerApp's all-cores default, whose sums round
    differently) and the tests of that handling."""
    with held_one_thread(hold=request.node.get_closest_marker("torch_threads") is None):
        yield


@contextmanager
def held_one_thread(hold: bool = True) -> Iterator[None]:
    """Torch on one thread inside, the count restored after; with ``hold``,
    ``torch.set_num_threads`` keeps it at 1 inside (an in-process run's own settings do not
    raise it). The autouse :func:`one_torch_thread`, and a module-scoped fixture's run, which
    is set up before (and so outside) that fixture."""
    threads = torch.get_num_threads()
    real = torch.set_num_threads
    real(1)
    try:
        with pytest.MonkeyPatch.context() as m:
            if hold:
                m.setattr(torch, "set_num_threads", lambda n: real(1))
            yield
    finally:
        real(threads)


class Linear(nn.Module):
    """f(x) = W flatten(x): its input gradient is known in closed form."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1) @ self.weight.t()
