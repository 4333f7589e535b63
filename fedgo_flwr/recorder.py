"""What a run writes: config.yaml, partition.json, metrics.jsonl, summary.json, model.pt.

``metrics.jsonl`` holds one JSON object per round (round 0 is the initial model) with at least
``round``, ``test_accuracy``, ``test_loss``, ``round_time`` (seconds since the previous line),
``eval_time`` and ``elapsed`` (seconds since the strategy started), plus what the strategy
reports for the round (clients sampled/replied/failed, train loss, client and aggregation times).
A relative ``output_dir`` is taken relative to ``$FEDGO_WORKDIR`` if set, else the current
directory of the ServerApp process.
"""

from __future__ import annotations

import json
import math
import os
import time
from logging import INFO
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, MetricRecord
from flwr.supercore import log
from torch import nn

from fedgo_flwr.config import ExperimentConfig
from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.training import evaluate


def resolve_output_dir(output_dir: str) -> Path:
    path = Path(output_dir).expanduser()
    if not path.is_absolute():
        path = Path(os.environ.get("FEDGO_WORKDIR", os.getcwd())) / path
    return path.resolve()


class RunRecorder:
    """Writes a run's files and serves as the strategy's ``evaluate_fn``."""

    def __init__(self, cfg: ExperimentConfig, out_dir: Path) -> None:
        self.cfg = cfg
        self.out_dir = out_dir
        self.rows: list[dict[str, Any]] = []
        self.start = time.perf_counter()
        self.last = self.start

    @classmethod
    def create(cls, cfg: ExperimentConfig, rows: list[dict[str, Any]] | None = None) -> RunRecorder:
        """Start the run's files; ``rows`` are the metrics of a resumed run's earlier rounds."""
        out_dir = resolve_output_dir(cfg.output_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.yaml").write_text(cfg.to_yaml())
        restored = [dict(r) for r in rows or []]
        (out_dir / "metrics.jsonl").write_text(
            "".join(json.dumps(_jsonable(r)) + "\n" for r in restored)
        )
        (out_dir / "summary.json").unlink(missing_ok=True)
        recorder = cls(cfg, out_dir)
        recorder.rows = restored
        return recorder

    def write_partition(self, info: dict[str, Any]) -> None:
        (self.out_dir / "partition.json").write_text(json.dumps(info))

    def attach(self, strategy: Any, model: nn.Module, test: ArrayDataset, device) -> None:
        self.strategy, self.model, self.test, self.device = strategy, model, test, device
        self.start = self.last = time.perf_counter()
        if self.rows:  # resumed: elapsed time goes on from the checkpoint's
            self.start -= float(self.rows[-1].get("elapsed") or 0.0)

    def evaluate(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        """Centralised evaluation of the global model; appends one line to metrics.jsonl."""
        t0 = time.perf_counter()
        row: dict[str, Any] = {"round": server_round}
        if server_round % self.cfg.eval.every == 0 or server_round == self.cfg.rounds:
            self.model.load_state_dict(arrays.to_torch_state_dict())
            loss, acc = evaluate(self.model, self.test, self.cfg.eval.batch_size, self.device)
        else:
            loss, acc = math.nan, math.nan
        now = time.perf_counter()
        row.update(test_accuracy=acc, test_loss=loss)
        if server_round > 0:
            row.update(getattr(self.strategy, "last_round", {}))
        row.update(
            eval_time=now - t0,
            round_time=now - self.last,
            elapsed=now - self.start,
        )
        self.last = now
        self.rows.append(row)
        with open(self.out_dir / "metrics.jsonl", "a") as fh:
            fh.write(json.dumps(_jsonable(row)) + "\n")
        log(
            INFO,
            "[%s] round %d/%d  test_acc %.4f  test_loss %.4f  round %.2fs",
            self.cfg.name,
            server_round,
            self.cfg.rounds,
            acc,
            loss,
            row["round_time"],
        )
        return MetricRecord({"test_accuracy": acc, "test_loss": loss})

    def finish(self, arrays: ArrayRecord | None) -> dict[str, Any]:
        """Write summary.json (and the final model); return the summary."""
        evaluated = [r for r in self.rows if not _missing(r["test_accuracy"])]
        best = max(evaluated, key=lambda r: r["test_accuracy"])
        rounds = [r for r in self.rows if r["round"] > 0]
        summary = {
            "name": self.cfg.name,
            "strategy": self.cfg.strategy.name,
            "rounds": len(rounds),
            "final_accuracy": evaluated[-1]["test_accuracy"],
            "final_loss": evaluated[-1]["test_loss"],
            "best_accuracy": best["test_accuracy"],
            "best_round": best["round"],
            "total_time": time.perf_counter() - self.start,
            "mean_round_time": (sum(r["round_time"] for r in rounds) / len(rounds))
            if rounds
            else 0.0,
        }
        (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        if arrays is not None:
            torch.save(arrays.to_torch_state_dict(), self.out_dir / "model.pt")
        log(
            INFO,
            "[%s] done: final accuracy %.4f, best %.4f (round %d), %.1fs; results in %s",
            self.cfg.name,
            summary["final_accuracy"],
            summary["best_accuracy"],
            summary["best_round"],
            summary["total_time"],
            self.out_dir,
        )
        return summary


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
