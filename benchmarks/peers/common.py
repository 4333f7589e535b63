"""What every peer runner of ``benchmarks/peers_speed.py`` shares (torch and numpy only).

A runner is started by the driver as ``<peer venv>/bin/python benchmarks/peers/<runner>.py
RUN_DIR``; ``RUN_DIR/setting.json`` holds the experiment, the peer's own translated config and
the folder of the files written once per experiment (``data.npz``, ``partition.json``,
``init.pt``: ``benchmarks/peers_setting.py``). This module loads them, defines the model once
(:class:`SmallCNN`, the project's ``cnn`` on 3x32x32 images: the same layers, parameter names
and shapes, so ``init.pt`` loads into it), and gives the plain SGD loop and the evaluation that
runners without a trainer of their own use. :func:`scheduled_clients` and
:class:`ScheduleSampler` give the clients ``partition.json``'s ``schedule`` trains each round
(the project's own draw), for the runners that hand them to their framework's sampler.
:class:`Clock` writes ``rounds.jsonl`` (one Unix time per finished round, with the clients
trained and their training images) and ``result.json`` (final test accuracy and loss), which
the driver reads; times are taken here, in the runner, with ``time.time()``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


class SmallCNN(nn.Module):
    """The project's ``cnn`` (``fedgo_flwr.models.classifiers.SmallCNN``) on 3x32x32 images:
    ``Conv(3->32, 3x3, pad 1) -> ReLU -> MaxPool(2) -> Conv(32->64) -> ReLU -> MaxPool(2) ->
    AdaptiveAvgPool(4x4) -> Linear(1024, 128) -> ReLU -> Linear(128, classes)``; 151,882
    parameters for 10 classes."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.AdaptiveAvgPool2d((4, 4)),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(start_dim=1),
            nn.Linear(64 * 4 * 4, 128),
            nn.ReLU(inplace=True),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def run_dir_from_argv() -> Path:
    """The run folder, the runner's one argument."""
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} RUN_DIR")
    return Path(sys.argv[1]).resolve()


def load_setting(run_dir: Path) -> dict:
    """``setting.json``: ``experiment`` (the :class:`Experiment` fields), ``shared`` (folder of
    the common files), ``config`` (this peer's translated settings)."""
    return json.loads((run_dir / "setting.json").read_text())


def set_threads(threads: int) -> None:
    """The same threads in every framework: torch's intra-op pool (OMP/MKL come from the env)."""
    torch.set_num_threads(int(threads))


def images(x: np.ndarray) -> torch.Tensor:
    """``uint8`` ``(N, 3, H, W)`` -> ``float32`` in ``[-1, 1]``, as the project normalises."""
    return torch.from_numpy(np.ascontiguousarray(x)).to(torch.float32).div_(127.5).sub_(1.0)


class Shared:
    """The files written once per experiment: data, partition and schedule, initial weights."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        with np.load(self.folder / "data.npz") as npz:
            self.train_x = np.asarray(npz["train_x"])
            self.train_y = np.asarray(npz["train_y"]).astype(np.int64)
            self.test_x = np.asarray(npz["test_x"])
            self.test_y = np.asarray(npz["test_y"]).astype(np.int64)
        record = json.loads((self.folder / "partition.json").read_text())
        self.num_classes = int(record["num_classes"])
        self.clients = [np.asarray(c, dtype=np.int64) for c in record["clients"]]
        self.schedule = [list(map(int, r)) for r in record["schedule"]]

    def images_of(self, clients) -> int:
        """Training images of ``clients`` (ids into :attr:`clients`), summed."""
        return sum(len(self.clients[int(k)]) for k in clients)

    def client_tensors(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Client ``k``'s normalised images and labels."""
        idx = self.clients[k]
        return images(self.train_x[idx]), torch.from_numpy(self.train_y[idx])

    def test_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        return images(self.test_x), torch.from_numpy(self.test_y)

    def new_model(self) -> SmallCNN:
        """The model every framework starts from: :class:`SmallCNN` with ``init.pt``'s weights."""
        model = SmallCNN(self.num_classes)
        model.load_state_dict(torch.load(self.folder / "init.pt", weights_only=True))
        return model


def scheduled_clients(schedule: list[list[int]], server_round: int) -> list[int]:
    """The clients round ``server_round`` (1-based) trains: ``schedule[server_round - 1]``, in
    the schedule's order. Raises ``ValueError`` for a round the schedule does not hold."""
    if not 1 <= int(server_round) <= len(schedule):
        raise ValueError(
            f"round {server_round} is not in partition.json's schedule (rounds 1 to "
            f"{len(schedule)})"
        )
    return [int(k) for k in schedule[int(server_round) - 1]]


class ScheduleSampler:
    """A sampler that is called once per client and returns the schedule's clients one after
    another: round 1's, then round 2's, and so on (pfl's user-sampler interface: a callable
    with no argument that returns one user id). Asking for more clients than the schedule
    holds raises ``RuntimeError``, rather than going on with clients of no round."""

    def __init__(self, schedule: list[list[int]]) -> None:
        self._clients = [int(k) for round_ in schedule for k in round_]
        self._next = 0

    def __call__(self) -> int:
        if self._next >= len(self._clients):
            raise RuntimeError(
                f"the schedule's {len(self._clients)} client slots are all used: the framework "
                "asked for more clients than rounds x clients_per_round"
            )
        self._next += 1
        return self._clients[self._next - 1]


def local_train(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    generator: torch.Generator | None = None,
) -> float:
    """``epochs`` of shuffled minibatch SGD with cross-entropy (a new optimiser per call, as the
    project's clients); a last batch of one sample is dropped, as the project does. Returns the
    mean training loss."""
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    n = len(y)
    drop_last = n % batch_size == 1 and n > 1
    total, count = 0.0, 0
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            if drop_last and len(idx) == 1:
                continue
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
            count += len(idx)
    return total / max(count, 1)


@torch.no_grad()
def evaluate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int
) -> tuple[float, float]:
    """Accuracy and mean cross-entropy of ``model`` on ``(x, y)``."""
    model.eval()
    correct, loss = 0, 0.0
    for start in range(0, len(y), batch_size):
        logits = model(x[start : start + batch_size])
        target = y[start : start + batch_size]
        loss += float(F.cross_entropy(logits, target, reduction="sum"))
        correct += int((logits.argmax(1) == target).sum())
    return correct / max(len(y), 1), loss / max(len(y), 1)


class Clock:
    """The runner's records: ``rounds.jsonl`` (``{"round": r, "time": unix}`` when round ``r``
    ended, with ``accuracy`` after an evaluation, and for a training round ``clients``, the
    client ids that trained, and ``images``, their training images; round 0: the initial
    evaluation) and ``result.json``."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path = run_dir / "rounds.jsonl"
        self.path.write_text("")

    def round_done(self, server_round: int, **extra: Any) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"round": int(server_round), "time": time.time(), **extra}) + "\n")

    def finish(self, accuracy: float, loss: float, **extra) -> None:
        result = {"final_accuracy": float(accuracy), "final_loss": float(loss), **extra}
        result["pid"] = os.getpid()
        (self.run_dir / "result.json").write_text(json.dumps(result, indent=1) + "\n")
