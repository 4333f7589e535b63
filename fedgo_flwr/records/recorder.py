"""What a run writes: config.yaml, partition.json, metrics.jsonl, summary.json, model.pt.

``metrics.jsonl`` holds one JSON object per round (round 0 is the initial model) with at least
``round``, ``test_accuracy``, ``test_loss``, ``round_time`` (seconds since the previous line;
for round 0, since the strategy's set-up ended), ``eval_time`` (round 0's evaluation may have
run during the start-up: :class:`EarlyEvaluation`) and ``elapsed`` (seconds since
the run started, its start-up and pre-FL stage included: :data:`STAGES`), plus what the
strategy reports for the round (clients sampled/replied/failed, train loss, client and
aggregation times).
A relative ``output_dir`` is taken relative to ``$FEDGO_WORKDIR`` if set, else the current
directory of the ServerApp process. Unset, every run gets a new folder
``outputs/<name>/<date-time>`` (:func:`decide_output_dir`, :mod:`fedgo_flwr.records.runfolders`).

Nothing of an earlier run is replaced silently: :func:`check_output_dir` refuses a folder that
holds a run's results unless the config says ``resume: true`` (and there is a checkpoint to
resume from) or ``overwrite: true``. The final model is written before ``summary.json``, and
both atomically (:mod:`fedgo_flwr.runtime.fileio`), so a ``summary.json`` (what ``run.sh`` takes as
success) always comes with a complete ``model.pt``. JSON files are strict JSON
(:func:`fedgo_flwr.runtime.fileio.strict_json`): they hold ``null`` for NaN and infinite values
(``Infinity`` is not JSON); NaN is the rows' "no value" (e.g. a round not evaluated), an
infinity is also logged as a WARNING. The summary also gives the server process's peak resident
memory (``server_peak_rss_mb``).

The summary's ``total_time`` is the run's wall time from its start to its summary, and
``stage_times`` breaks it down (:data:`STAGES`; the stages add up to ``total_time``). A stage
done in an earlier process is counted in that process's time: a resumed run adds ``earlier``
(the ``elapsed`` of its checkpoint's last row, which includes the first process's start-up and
pre-FL stage); a generator loaded from ``strategy.generator.cache`` or a file counts the time
to load it (the cached entry's own training time stays in ``prefl.json``, ``generator.seconds``).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import threading
import time
from dataclasses import dataclass, field
from logging import INFO
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, MetricRecord
from flwr.supercore import log
from torch import nn

from fedgo_flwr.config.experiment import ConfigError, ExperimentConfig
from fedgo_flwr.data import ArrayDataset
from fedgo_flwr.learning.training import evaluate
from fedgo_flwr.records.checkpoint import CHECKPOINT_FILE, PREVIOUS_FILE
from fedgo_flwr.records.provenance import write_environment
from fedgo_flwr.records.runfolders import (
    LATEST,
    RUNS_ROOT,
    latest_problem,
    latest_run,
    new_run_folder,
    point_latest,
)
from fedgo_flwr.records.tracking import MlflowLog
from fedgo_flwr.runtime import profiling
from fedgo_flwr.runtime.fileio import (
    atomic_torch_save,
    atomic_write_text,
    open_append,
    strict_json,
)
from fedgo_flwr.runtime.kernels import inference_batch
from fedgo_flwr.runtime.messages import TRAFFIC


def resolve_output_dir(output_dir: str) -> Path:
    path = Path(output_dir).expanduser()
    if not path.is_absolute():
        path = Path(os.environ.get("FEDGO_WORKDIR", os.getcwd())) / path
    return path.resolve()


CHECKPOINTS = (CHECKPOINT_FILE, PREVIOUS_FILE)
# Files whose presence means the folder holds (part of) a run that a new run would replace.
RUN_FILES = (
    "metrics.jsonl",
    "summary.json",
    "model.pt",
    *CHECKPOINTS,
    "generator.pt",
    "discriminators.pt",
    "prefl.json",
)
# What ``overwrite: true`` removes before a fresh run: results that would otherwise pass for
# the new run's (the other files are rewritten by the run itself).
STALE_FILES = ("summary.json", "model.pt", *CHECKPOINTS, "prefl.json", "prefl-resume.json")


def check_output_dir(cfg: ExperimentConfig) -> Path:
    """The run folder, if this run may write there; else :class:`ConfigError` on output_dir.

    Called before anything is written (:func:`decide_output_dir`). A folder holding
    an earlier run's files is refused unless ``overwrite: true``, or ``resume: true`` with a
    checkpoint to continue from. ``resume: true`` also restarts a run that stopped before its
    first checkpoint (no checkpoint, no summary: nothing there to continue or to keep), so an
    interrupted sweep can go on; a finished run without a checkpoint is never replaced by it.
    """
    out_dir = resolve_output_dir(cfg.output_dir)
    found = [name for name in RUN_FILES if (out_dir / name).exists()]
    if not found or cfg.overwrite:
        return out_dir
    if cfg.resume and (any(name in found for name in CHECKPOINTS) or "summary.json" not in found):
        return out_dir
    why = " and has no checkpoint to resume from" if cfg.resume else ""
    raise ConfigError(
        "output_dir",
        cfg.output_dir,
        f"{out_dir} holds an earlier run ({', '.join(found)}){why}; choose another "
        "output_dir, or set resume=true to continue that run or overwrite=true to replace it",
    )


def decide_output_dir(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` with the folder this run writes to as its ``output_dir``; refused as
    :func:`check_output_dir` refuses, and logged when chosen here.

    The one place a run's folder is decided, before anything is written; every entry point
    calls it (``cli prepare`` for ``run.sh``, the ServerApp for a plain ``flwr run``,
    :mod:`fedgo_app.inprocess`), and a later one finds ``output_dir`` set by an earlier one:

    - ``output_dir`` set: that folder, kept as given;
    - unset, with ``resume: true``: the run ``outputs/<name>/latest`` points to (the folder it
      names, so that a newer run cannot move it), or a new folder if there is none;
    - unset: a new folder ``outputs/<name>/<date-time>``, and ``latest`` then points to it
      (:mod:`fedgo_flwr.records.runfolders`); a ``latest`` there that is not a link is
      refused (:class:`ConfigError` on ``output_dir``, before any folder is made).

    A folder chosen here is absolute, so the clients, which get ``cfg`` from the server, use
    the same one whatever their working directory.
    """
    if cfg.output_dir is not None:
        check_output_dir(cfg)
        return cfg
    parent = resolve_output_dir(RUNS_ROOT) / cfg.name
    problem = latest_problem(parent)
    if problem is not None:  # before a folder is made: a refused run leaves nothing behind
        raise ConfigError("output_dir", cfg.output_dir, problem)
    if cfg.resume:
        folder = latest_run(parent)
        if folder is not None:
            chosen = dataclasses.replace(cfg, output_dir=str(folder))
            check_output_dir(chosen)
            log(INFO, "fedgo-flwr: run folder %s (resume: %s)", folder, parent / LATEST)
            return chosen
        log(INFO, "fedgo-flwr: resume: no %s yet; starting a new run", parent / LATEST)
    folder = new_run_folder(parent)
    point_latest(folder)
    log(INFO, "fedgo-flwr: run folder %s", folder)
    return dataclasses.replace(cfg, output_dir=str(folder))


STAGES = {
    "earlier": "a resumed run: the earlier processes' time up to the checkpoint's round",
    "launch": "before the ServerApp started (run.sh: its checks, the SuperLink, Flower's "
    "packaging; --local: Python's imports); only for runs run.sh started",
    "startup": "the ServerApp's checks, data, partition, model and node discovery (round 0's "
    "evaluation runs beside discovery)",
    "generator": "FedGO's pre-FL generator: trained, loaded or taken from the cache",
    "discriminators": "FedGO's discriminator round (or loading them from a file)",
    "setup": "the rest of the strategy's set-up before round 1 (e.g. discriminator logits)",
    "rounds": "round 0 and the rounds (or a one-shot strategy's server epochs)",
    "finish": "writing the final model",
}
"""The stages of ``summary.json``'s ``stage_times``, in order; a stage a run does not have is
left out."""


@dataclass
class Row:
    """One row of ``metrics.jsonl`` as the strategy's round loop made it: what the round
    produced and everything the recorder writes of it (handed to :meth:`RunRecorder.record`).

    ``arrays``: the new global model (``None``: unchanged); ``metrics``: the row's training
    metrics; ``evaluated``: what the row's evaluation sees, if not the global model (an empty
    record: nothing to evaluate, e.g. CPFL's cohorts before distillation); ``due``: evaluate
    this row even if ``eval.every`` would skip it (one-shot FL's server epochs);
    ``checkpoint``: the arrays the row's checkpoint keeps, if not the global model;
    ``finished``: the run ends with this row, before ``rounds`` (CPFL, one-shot FL), and it is
    evaluated; ``fields``: the row's own figures (clients sampled/replied/failed, train loss,
    client and aggregation times, a strategy's extras), written as they are; ``label``: how
    the log line names the row (default ``round r/rounds``).
    """

    arrays: ArrayRecord | None = None
    metrics: MetricRecord | None = None
    evaluated: ArrayRecord | None = None
    due: bool = False
    checkpoint: ArrayRecord | None = None
    finished: bool = False
    fields: dict[str, Any] = field(default_factory=dict)
    label: str | None = None


class EarlyEvaluation:
    """Round 0's test evaluation, done in a thread while the ServerApp waits for its nodes.

    In a Flower simulation node discovery is Ray's start: for seconds the ServerApp only waits
    for the first reply (``benchmarks/studies/startup.md``). Round 0 evaluates the initial
    model, which needs no node, so it is computed then, on a copy of the model, and
    :meth:`RunRecorder.record` takes the result for round 0 when the arrays it records are
    the ones evaluated here (bit for bit); otherwise (a strategy that changes the model during
    its set-up, a resumed run, a failed evaluation) round 0 is evaluated as before. The
    evaluation draws nothing from any random generator, so the numbers are the ones an
    evaluation at round 0 gives. Not used while phases are profiled
    (:mod:`fedgo_flwr.runtime.profiling` counts one thread's work).
    """

    def __init__(
        self, model: nn.Module, test: ArrayDataset, batch_size: int, device: torch.device
    ) -> None:
        self.model = copy.deepcopy(model)  # evaluation changes none of its state
        self.test, self.batch_size, self.device = test, batch_size, device
        self.result: tuple[float, float, float] | None = None
        self.thread = threading.Thread(target=self._run, name="fedgo-round0-eval", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            loss, acc = evaluate(self.model, self.test, self.batch_size, self.device)
        except Exception:  # noqa: BLE001 - round 0 is evaluated again and raises there
            return
        self.result = (loss, acc, time.perf_counter() - t0)

    def take(self, arrays: ArrayRecord) -> tuple[float, float, float] | None:
        """``(loss, accuracy, seconds)`` if ``arrays`` hold exactly the evaluated state (after
        the evaluation ends), else ``None``. The copy of the model is let go either way."""
        self.thread.join()
        evaluated, self.model = self.model.state_dict(), None
        result, self.result = self.result, None
        if result is None:
            return None
        state = arrays.to_torch_state_dict()
        if state.keys() != evaluated.keys():
            return None
        for key, value in evaluated.items():
            given = state[key].cpu()
            if given.dtype != value.dtype or not torch.equal(given, value.cpu()):
                return None
        return result


class RunRecorder:
    """Writes a run's files; :meth:`record` takes each row the strategy's loop hands it."""

    def __init__(self, cfg: ExperimentConfig, out_dir: Path) -> None:
        self.cfg = cfg
        self.out_dir = out_dir
        self.rows: list[dict[str, Any]] = []
        self.start = time.perf_counter()
        self.last = self.attached = self.start
        self.stages: dict[str, float] = {}
        self.tensorboard = TensorBoardLog(out_dir) if cfg.logging.tensorboard else None
        self.mlflow: MlflowLog | None = None
        if cfg.logging.mlflow:
            self.mlflow = MlflowLog.start(cfg, out_dir, resolve_output_dir("."))

    @classmethod
    def create(
        cls,
        cfg: ExperimentConfig,
        rows: list[dict[str, Any]] | None = None,
        command: list[str] | tuple[str, ...] | None = None,
    ) -> RunRecorder:
        """Start the run's files; ``rows`` are the metrics of a resumed run's earlier rounds,
        ``command`` what the user typed (for ``env.json``; default this process's arguments).

        Checks the folder first (:func:`check_output_dir`). A resumed run's old summary no
        longer describes it and is removed; ``overwrite`` removes the old run's results.
        """
        out_dir = check_output_dir(cfg)
        out_dir.mkdir(parents=True, exist_ok=True)
        stale = ["summary.json"] if rows is not None else list(STALE_FILES) if cfg.overwrite else []
        for name in stale:
            (out_dir / name).unlink(missing_ok=True)
        atomic_write_text(out_dir / "config.yaml", cfg.to_yaml())
        write_environment(out_dir, cfg.to_dict(), resumed=rows is not None, command=command)
        restored = [dict(r) for r in rows or []]
        atomic_write_text(out_dir / "metrics.jsonl", "".join(json_line(r) for r in restored))
        recorder = cls(cfg, out_dir)
        recorder.rows = restored
        for row in restored if recorder.mlflow is not None else ():  # its own MLflow run
            recorder.mlflow.write(row)
        return recorder

    def write_partition(self, info: dict[str, Any]) -> None:
        atomic_write_text(self.out_dir / "partition.json", strict_json(info, name="partition.json"))

    def attach(
        self,
        model: nn.Module,
        test: ArrayDataset,
        device,
        started: float | None = None,
        stages: dict[str, float] | None = None,
        early: EarlyEvaluation | None = None,
    ) -> None:
        """Start recording rounds. ``started`` is the run's start (a :func:`time.perf_counter`
        time; default now) and ``stages`` the time of the stages until now (:data:`STAGES`);
        a resumed run's time goes on from its checkpoint's last ``elapsed`` (``earlier``).
        ``early``: round 0's evaluation, begun during the start-up (:class:`EarlyEvaluation`)."""
        self.model, self.test, self.device = model, test, device
        self.early = early
        self.attached = self.last = time.perf_counter()
        self.start = self.attached if started is None else started
        self.stages = {}
        if self.rows:  # resumed: elapsed time goes on from the checkpoint's
            earlier = float(self.rows[-1].get("elapsed") or 0.0)
            if math.isfinite(earlier) and earlier > 0:
                self.start -= earlier
                self.stages["earlier"] = earlier
        self.stages.update(stages or {})

    def evaluate(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        """Flower's ``evaluate_fn``: :meth:`record` of a row with nothing but ``arrays``."""
        return self.record(server_round, arrays, Row())

    def record(self, server_round: int, arrays: ArrayRecord, given: Row) -> MetricRecord:
        """Row ``server_round`` (``given``): the centralised evaluation of ``arrays``, and one
        line of metrics.jsonl with the row's ``fields``.

        Evaluated every ``eval.every`` rounds, in round ``cfg.rounds``, in a row that is
        ``finished`` (CPFL, one-shot FL end before ``cfg.rounds``) or ``due`` (one-shot FL's
        server epochs count epochs, not rounds); empty ``arrays`` (no global model this row,
        e.g. CPFL's cohorts) are not.
        """
        t0 = time.perf_counter()
        row: dict[str, Any] = {"round": server_round}
        due = server_round % self.cfg.eval.every == 0 or server_round == self.cfg.rounds
        due = due or given.finished or given.due
        early, self.early = self.early, None
        done = early.take(arrays) if early is not None and server_round == 0 else None
        eval_time = None
        if due and len(arrays) > 0:
            self.model.load_state_dict(arrays.to_torch_state_dict())
        if due and len(arrays) > 0 and done is not None:
            loss, acc, eval_time = done  # evaluated while the ServerApp waited for its nodes
        elif due and len(arrays) > 0:
            batch = inference_batch(self.cfg.eval.batch_size, self.device)
            with profiling.phase("server_eval", len(self.test), batch):
                loss, acc = evaluate(self.model, self.test, self.cfg.eval.batch_size, self.device)
        else:
            loss, acc = math.nan, math.nan
        now = time.perf_counter()
        row.update(test_accuracy=acc, test_loss=loss)
        if server_round > 0:
            row.update(given.fields)
        row["bytes_down"], row["bytes_up"] = TRAFFIC.take()
        row.update(
            eval_time=now - t0 if eval_time is None else eval_time,
            round_time=now - self.last,
            elapsed=now - self.start,
        )
        self.last = now
        self.rows.append(row)
        with open_append(self.out_dir / "metrics.jsonl") as fh:  # never through a link
            fh.write(json_line(row))
        if self.tensorboard is not None:
            self.tensorboard.write(row)
        if self.mlflow is not None:
            self.mlflow.write(row)
        log(
            INFO,
            "[%s] %s  test_acc %.4f  test_loss %.4f  round %.2fs%s",
            self.cfg.name,
            given.label or f"round {server_round}/{self.cfg.rounds}",
            acc,
            loss,
            row["round_time"],
            self._round_details(row, server_round),
        )
        return MetricRecord({"test_accuracy": acc, "test_loss": loss})

    def _round_details(self, row: dict[str, Any], server_round: int) -> str:
        """The rest of a round's log line: clients, ensemble accuracy, traffic and an ETA from
        the mean time of the rounds so far."""
        parts = []
        if "clients_replied" in row and "clients_sampled" in row:
            parts.append(f"clients {row['clients_replied']}/{row['clients_sampled']}")
        if not _missing(row.get("ensemble_test_accuracy")):
            parts.append(f"ens_acc {row['ensemble_test_accuracy']:.4f}")
        if row.get("bytes_down") or row.get("bytes_up"):
            parts.append(f"MB down/up {row['bytes_down'] / 1e6:.1f}/{row['bytes_up'] / 1e6:.1f}")
        done = [r["round_time"] for r in self.rows if r["round"] > 0]
        left = self.cfg.rounds - server_round
        if done and left > 0:
            parts.append(f"ETA {_duration(left * sum(done) / len(done))}")
        return "".join(f"  {p}" for p in parts)

    def finish(
        self, arrays: ArrayRecord | None, report: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Write the final model, then summary.json (both atomically); return the summary.

        In this order, a ``summary.json`` (the mark of a finished run) always has its model.
        ``report``, the strategy's own part (CPFL's simulated time, CPU-hours, bytes), joins
        the summary.
        """
        finishing = time.perf_counter()
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
            "total_time": math.nan,  # set last, with stage_times
            "mean_round_time": (sum(r["round_time"] for r in rounds) / len(rounds))
            if rounds
            else 0.0,
        }
        # The server process's (with the in-process grid: the clients' too).
        summary["server_peak_rss_mb"] = profiling.peak_rss_mb()
        summary["bytes_down"] = sum(int(r.get("bytes_down") or 0) for r in self.rows)
        summary["bytes_up"] = sum(int(r.get("bytes_up") or 0) for r in self.rows)
        target = self.cfg.eval.target_accuracy
        if target is not None:
            reached = [
                r["round"]
                for r in rounds
                if not _missing(r["test_accuracy"]) and r["test_accuracy"] >= target
            ]
            summary["target_accuracy"] = target
            summary["rounds_to_target"] = reached[0] if reached else None
        summary.update(report or {})
        if arrays is not None:
            atomic_torch_save(self.out_dir / "model.pt", arrays.to_torch_state_dict())
        if self.tensorboard is not None:
            self.tensorboard.close()
        now = time.perf_counter()
        stages = {**self.stages, "rounds": finishing - self.attached, "finish": now - finishing}
        summary["total_time"] = now - self.start
        summary["stage_times"] = {k: stages[k] for k in STAGES if k in stages}
        text = strict_json(summary, name="summary.json", nan_is_missing=True, indent=2)
        atomic_write_text(self.out_dir / "summary.json", text)
        if self.mlflow is not None:  # after summary.json: the artifacts hold it
            self.mlflow.finish(summary)
        log(
            INFO,
            "[%s] done: final accuracy %.4f, best %.4f (round %d), %.1fs%s; results in %s",
            self.cfg.name,
            summary["final_accuracy"],
            summary["best_accuracy"],
            summary["best_round"],
            summary["total_time"],
            stage_breakdown(summary["stage_times"], summary["total_time"]),
            self.out_dir,
        )
        return summary


TENSORBOARD_DIR = "tensorboard"


class TensorBoardLog:
    """Every round's numeric metrics as TensorBoard scalars in ``<out_dir>/tensorboard``, step =
    round, the tag grouped by kind (``accuracy/test_accuracy``, ``time/round_time``,
    ``traffic/bytes_up`` ...; ``logging.tensorboard: true``)."""

    GROUPS = (
        ("accuracy", ("accuracy", "acc")),
        ("loss", ("loss",)),
        ("time", ("time", "elapsed")),
        ("traffic", ("bytes",)),
        ("clients", ("clients",)),
    )

    def __init__(self, out_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # preflight refuses this before the run
            raise RuntimeError(
                "logging.tensorboard needs the tensorboard package: pip install -e '.[tensorboard]'"
            ) from exc
        self.writer = SummaryWriter(log_dir=str(out_dir / TENSORBOARD_DIR))

    @classmethod
    def tag(cls, key: str) -> str:
        parts = key.split("_")
        for group, words in cls.GROUPS:
            if any(w in parts for w in words):
                return f"{group}/{key}"
        return f"other/{key}"

    def write(self, row: dict[str, Any]) -> None:
        step = int(row["round"])
        for key, value in row.items():
            if key == "round" or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if math.isfinite(value):
                self.writer.add_scalar(self.tag(key), value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def stage_breakdown(stages: dict[str, float], total: float) -> str:
    """`` (generator 262.1s, rounds 20.5s)``: the stages of at least 5 % of ``total``, for the
    done line; empty when only one stage is."""
    big = [(k, v) for k, v in stages.items() if total > 0 and v >= 0.05 * total]
    if len(big) < 2:
        return ""
    return " (" + ", ".join(f"{k} {v:.1f}s" for k, v in big) + ")"


def _duration(seconds: float) -> str:
    """``1h02m``, ``3m20s`` or ``45s``."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def json_line(row: dict[str, Any]) -> str:
    """One line of metrics.jsonl: strict JSON (NaN and infinities are written ``null``)."""
    name = f"metrics.jsonl round {row.get('round')}"
    return strict_json(row, name=name, nan_is_missing=True) + "\n"
