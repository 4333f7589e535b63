"""CPFL's stage 2 again, on a finished run's own teachers, with other distillation budgets.

A CPFL run with more than one cohort keeps the teachers it distilled in its run folder
(``cpfl_teachers.pt``: each distilled cohort's index, label counts and model;
:meth:`strategies._cpfl_distill.CohortDistillation.keep_teachers`). :func:`replay` rebuilds the
run's server from its ``config.yaml`` (data, partition, public set, initial model, seed) and runs
stage 2 alone on those identical teachers, with ``strategy.distill.*`` overrides as the budget
(``steps``, ``epochs``, ``batch_size``, ``public_size``, ``lr``, ...): so budgets are compared on
the same teachers, without stage 1's cost. With the run's own budget the student is the run's
(the same seeded student, order of mini-batches and arithmetic).

Each budget gives one JSON object: the student's test accuracy, its ensemble's (the teachers
combined as the target is) and the teachers', the step count, the public set's size, the L1
loss of every pass over the public set (``epoch_losses``) and the wall time; ``--out`` writes
them all as a JSON list.

    .venv/bin/python -m benchmarks.cpfl_replay outputs/bench/<tag>/<run> \\
        --budget steps=9800,batch_size=512 --budget epochs=30,batch_size=128 [--out r.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.sweep import load_runs, mean_ci, paired_text, seed_note, write_table
from fedgo_app.sweep.stats import paired
from fedgo_flwr.config.experiment import ConfigError
from fedgo_flwr.learning.cohorts import Cohort, PlateauStopper
from fedgo_flwr.learning.task import load_bundle, make_partition, new_model
from fedgo_flwr.learning.training import get_device
from fedgo_flwr.runtime.fileio import strict_json
from fedgo_flwr.runtime.kernels import use_channels_last, use_deterministic, use_precision
from strategies import load_experiment
from strategies._cpfl_distill import TEACHERS_FILE
from strategies.base import ServerResources
from strategies.cpfl import CPFL


class ReplayError(ValueError):
    """A run folder, teachers file or budget that cannot be replayed (one line, no traceback)."""


def parse_budget(text: str) -> list[str]:
    """``steps=9800,batch_size=512`` -> ``strategy.distill.steps=9800``, ... (``ReplayError``
    for a word that is not ``key=value``)."""
    words = [w.strip() for w in text.split(",") if w.strip()]
    out = []
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key or not value:
            raise ReplayError(f"--budget {text!r}: {word!r} is not key=value")
        out.append(f"strategy.distill.{key}={value}")
    return out


def load_teachers(path: Path) -> dict[str, Any]:
    """The teachers file of a run, checked for its keys (``ReplayError`` otherwise)."""
    if not path.is_file():
        raise ReplayError(f"{path}: no teachers file (a CPFL run of more than one cohort)")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is reported as such
        raise ReplayError(f"{path}: not a teachers file ({type(exc).__name__}: {exc})") from None
    if not isinstance(saved, dict) or not {"cohorts", "counts", "teachers"} <= saved.keys():
        raise ReplayError(f"{path}: not a teachers file (needs cohorts, counts and teachers)")
    if not (len(saved["cohorts"]) == len(saved["teachers"]) == len(saved["counts"]) > 0):
        raise ReplayError(f"{path}: cohorts, counts and teachers differ in number")
    return saved


def rebuild(
    run_dir: Path, overrides: Sequence[str], out_dir: Path, threads: int | None = None
) -> CPFL:
    """The run's CPFL server (its config with ``overrides``), writing nothing to ``run_dir``;
    ``threads``: torch's threads instead of the run's (the result may then differ from the
    run's by float rounding)."""
    config = run_dir / "config.yaml"
    if not config.is_file():
        raise ReplayError(f"{run_dir}: no config.yaml (not a run folder)")
    try:
        cfg = load_experiment(config, [*overrides, f"output_dir={out_dir}"])
    except ConfigError as exc:
        raise ReplayError(f"{run_dir}: {exc}") from None
    if cfg.strategy.name != "cpfl":
        raise ReplayError(f"{run_dir}: a {cfg.strategy.name} run, not a CPFL one")
    if cfg.strategy.params.distill.weights == "fedgo":
        raise ReplayError(f"{run_dir}: distill.weights fedgo needs the clients' discriminators")
    # The run's kernel settings (as the ServerApp sets them), so its own budget gives its student.
    torch.set_num_threads(threads or cfg.resources.server_cpus or os.cpu_count() or 1)
    use_channels_last(cfg.resources.channels_last)
    use_precision(cfg.resources.precision)
    use_deterministic(cfg.resources.deterministic)
    bundle = load_bundle(cfg.data)
    resources = ServerResources(bundle, make_partition(cfg), get_device(cfg.device), out_dir)
    return CPFL(cfg, {}, new_model(cfg, bundle), resources)


def saved_cohorts(strategy: CPFL, saved: dict[str, Any], path: Path) -> list[Cohort]:
    """The distilled cohorts as the run had them: index, members and label counts, which must
    be the ones the config gives (else the teachers come from another run)."""
    cohorts = []
    for i, counts, arrays in zip(saved["cohorts"], saved["counts"], saved["teachers"], strict=True):
        i = int(i)
        groups = strategy.cohorts.groups
        if not 0 <= i < len(groups):
            raise ReplayError(f"{path}: cohort {i}, but the config has {len(groups)}")
        members = groups[i]
        want = strategy.cohorts.class_counts[members].sum(axis=0)
        if not np.array_equal(np.asarray(counts), want):
            raise ReplayError(f"{path}: cohort {i}'s label counts are not the config's")
        teacher = {k: v.numpy() for k, v in arrays.items()}
        problem = strategy.model_problem(teacher, f"cohort {i}'s teacher")
        if problem:
            raise ReplayError(f"{path}: {problem}")
        cohorts.append(
            Cohort(
                index=i,
                members=list(members),
                counts=want,
                arrays=teacher,
                stopper=PlateauStopper(1, 1),
            )
        )
    return cohorts


def replay(run_dir: Path, budget: Sequence[str] = (), threads: int | None = None) -> dict[str, Any]:
    """Stage 2 of the run in ``run_dir`` on its kept teachers, with the ``budget`` overrides
    (``strategy.distill.<key>=<value>``) and ``threads`` (:func:`rebuild`); the result as
    described in the module docstring."""
    path = run_dir / TEACHERS_FILE
    saved = load_teachers(path)
    with tempfile.TemporaryDirectory() as tmp:
        strategy = rebuild(run_dir, budget, Path(tmp), threads)
        cohorts = saved_cohorts(strategy, saved, path)
        config = strategy.params.distill
        teachers = [c.arrays for c in cohorts]
        start = time.perf_counter()
        evaluated = strategy.distillation.evaluate_teachers(teachers, cohorts, config)
        student, distilled = strategy.distillation.distill(teachers, cohorts, config)
        accuracy = strategy.distillation.accuracy(student)
    return {
        "run": run_dir.name,
        "budget": list(budget),
        "steps": distilled["distill_steps"],
        "batch_size": config.batch_size,
        "public_size": distilled["public_size"],
        "student_accuracy": accuracy,
        "ensemble_accuracy": evaluated["ensemble_accuracy"],
        "teacher_accuracies": evaluated["teacher_accuracies"],
        "distill_loss": distilled["distill_loss"],
        "epoch_losses": distilled["distill_epoch_losses"],
        "seconds": time.perf_counter() - start,
        "threads": torch.get_num_threads(),
    }


def stop_round(losses: Sequence[float | None], window: int, patience: int) -> int | None:
    """The round (1-based) in which :class:`PlateauStopper` ``(window, patience)`` stops on a
    cohort's per-round validation signal ``losses``, ``None`` if not within them.

    A cohort's training does not depend on its stopping rule until the rule stops it, so the
    signal a run recorded (``metrics.jsonl``) shows what another rule would have done up to the
    round the run's own rule stopped it."""
    stopper = PlateauStopper(window, patience)
    for i, loss in enumerate(losses, start=1):
        stopper.observe(loss)
        if stopper.stopped:
            return i
    return None


def cohort_signals(metrics: Path) -> dict[int, list[float | None]]:
    """Per cohort, its validation signal of every round it ran, from a run's ``metrics.jsonl``."""
    signals: dict[int, list[float | None]] = {}
    for line in metrics.read_text().splitlines():
        for c in json.loads(line).get("cohorts", []):
            signals.setdefault(int(c["cohort"]), []).append(c.get("val_loss"))
    return signals


def stopping_lines(run_dir: Path, rules: Sequence[tuple[int, int]]) -> list[str]:
    """One line per cohort of the run: the rounds it ran, and the round each ``(window,
    patience)`` rule would have stopped it in (``> R``: not within the R rounds recorded)."""
    lines = []
    for cohort, losses in sorted(cohort_signals(run_dir / "metrics.jsonl").items()):
        stops = []
        for w, p in rules:
            at = stop_round(losses, w, p)
            stops.append(f"{w}/{p}: {at if at is not None else f'> {len(losses)}'}")
        lines.append(f"{run_dir.name} cohort {cohort}: ran {len(losses)}; " + ", ".join(stops))
    return lines


def seed_of(run: str) -> int:
    """The seed of a run folder's name, ``<method>-seed<N>`` (``ReplayError`` otherwise)."""
    _, sep, seed = run.rpartition("-seed")
    if not sep or not seed.isdigit():
        raise ReplayError(f"run {run!r} is not named <method>-seed<N>")
    return int(seed)


def budget_table(results: Sequence[dict[str, Any]], baseline: dict[int, float]) -> str:
    """A markdown table of replay ``results`` by run method (the run's name less its seed) and
    budget, in first-seen order: steps, batch and public size, the seeds, the student's
    accuracy (mean with its 95% t interval), its ensemble's, the student minus its ensemble
    and the student minus ``baseline`` (per seed, e.g. n = 1's accuracy), both paired by seed
    with their intervals and the paired t-test."""
    by_budget: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        method = r["run"].rpartition("-seed")[0]
        by_budget.setdefault((method, ",".join(r["budget"]) or "the run's own"), []).append(r)
    seeds = sorted({seed_of(r["run"]) for r in results})
    rows = [
        f"Stage 2 replayed on each run's own teachers ({seed_note(seeds)}); accuracy in %, "
        "mean ± half-width of the 95% t interval; differences paired by seed: mean [interval] "
        "p (paired t-test).",
        "",
        "| runs | budget | steps | batch | public | seeds | student | ensemble "
        "| student - ensemble | student - baseline |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (method, budget), rs in by_budget.items():
        student = {seed_of(r["run"]): r["student_accuracy"] for r in rs}
        ensemble = {seed_of(r["run"]): r["ensemble_accuracy"] for r in rs}
        cells = [
            method,
            budget.replace("strategy.distill.", ""),
            ", ".join(str(v) for v in sorted({r["steps"] for r in rs})),
            ", ".join(str(v) for v in sorted({r["batch_size"] for r in rs})),
            ", ".join(str(v) for v in sorted({r["public_size"] for r in rs})),
            str(len(rs)),
            mean_ci(list(student.values())),
            mean_ci(list(ensemble.values())),
            paired_text(paired(ensemble, student)),
            paired_text(paired(baseline, student)),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def baseline_of(results_dir: Path, method: str) -> dict[int, float]:
    """Per seed, the ``final_accuracy`` of ``method``'s runs kept in ``results_dir``
    (:func:`benchmarks.sweep.load_runs`)."""
    runs = load_runs(results_dir, [method]).get(method, [])
    if not runs:
        raise ReplayError(f"{results_dir}: no {method} runs kept")
    return {int(r.seed.removeprefix("seed")): r.summary["final_accuracy"] for r in runs}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", type=Path, help="CPFL run folders")
    parser.add_argument(
        "--budget",
        action="append",
        default=None,
        help="distill keys, k=v,k=v (repeat for several budgets; none: the run's own)",
    )
    parser.add_argument("--out", type=Path, help="write every result as a JSON list here")
    parser.add_argument(
        "--stopping",
        nargs=2,
        type=int,
        action="append",
        metavar=("WINDOW", "PATIENCE"),
        help="instead of replaying: when this stopping rule would have stopped each cohort, "
        "on the validation signal in the run's metrics.jsonl (repeatable)",
    )
    parser.add_argument(
        "--threads", type=int, help="torch threads (default: the run's, as its ServerApp set them)"
    )
    parser.add_argument(
        "--table", type=Path, help="write the results' table by budget here (markdown)"
    )
    parser.add_argument(
        "--results", type=Path, help="a JSON list of earlier results to add before the runs'"
    )
    parser.add_argument(
        "--baseline",
        nargs=2,
        metavar=("RESULTS_DIR", "METHOD"),
        help="the table's baseline: METHOD's runs kept in RESULTS_DIR (e.g. a0.1-n1)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        results = []
        if args.results:
            results = json.loads(args.results.read_text())
        budgets = [parse_budget(b) for b in (args.budget or [""])]
        if args.stopping:
            for run in args.runs:
                print("\n".join(stopping_lines(run, [tuple(r) for r in args.stopping])))
            return
        baseline = baseline_of(Path(args.baseline[0]), args.baseline[1]) if args.baseline else {}
        for run in args.runs:
            for budget in budgets:
                r = replay(run, budget, args.threads)
                results.append(r)
                print(
                    f"{r['run']} {','.join(budget) or 'own budget'}: {r['steps']} steps, "
                    f"public {r['public_size']}, student {100 * r['student_accuracy']:.1f}%, "
                    f"ensemble {100 * r['ensemble_accuracy']:.1f}%, L1 {r['distill_loss']:.4f}, "
                    f"{r['seconds']:.0f} s",
                    flush=True,
                )
                if args.out:  # after each budget, so an interrupted replay keeps what it did
                    args.out.write_text(strict_json(results, name=str(args.out), indent=1))
        if args.table:
            write_table(args.table.parent, budget_table(results, baseline), args.table.name)
    except ReplayError as exc:
        sys.exit(str(exc))


if __name__ == "__main__":
    main()
