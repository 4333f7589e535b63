"""The reply fuzzer's runs and verdicts: one case run in process, its outcome, the clean run
it is compared with, and the verdict (the package's docstring: :mod:`fedgo_app.fuzz`)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedgo_app.fuzz.cases import (
    ROBUST_MARGIN,
    ROOT,
    TOKEN_KINDS,
    TOKEN_REFUSALS,
    WITHHOLD,
    FuzzerBug,
    Mutation,
    Target,
    intercepted,
    tiny_config,
)
from fedgo_app.fuzz.logs import warnings_logged
from fedgo_app.inprocess import run_inprocess
from fedgo_flwr.config.experiment import ConfigError
from strategies import available


def _snapshot(*dirs: Path) -> dict[str, float]:
    """Files under ``dirs`` (not .git, .venv, caches) -> mtime."""
    skip = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache"}
    out: dict[str, float] = {}
    for top in dirs:
        for base, subdirs, files in os.walk(top):
            subdirs[:] = [d for d in subdirs if d not in skip]
            for f in files:
                p = os.path.join(base, f)
                with contextlib.suppress(OSError):
                    out[p] = os.stat(p).st_mtime_ns
    return out


def strict_json_problems(out_dir: Path) -> list[str]:
    """Every ``*.json`` / ``*.jsonl`` under ``out_dir`` that does not parse strictly."""

    def refuse(constant: str):
        raise ValueError(f"non-standard constant {constant}")

    problems = []
    for path in sorted([*out_dir.rglob("*.json"), *out_dir.rglob("*.jsonl")]):
        try:
            text = path.read_text()
            lines = text.splitlines() if path.suffix == ".jsonl" else [text]
            for line in lines:
                if line.strip():
                    json.loads(line, parse_constant=refuse)
        except Exception as exc:  # noqa: BLE001 - reported
            problems.append(f"{path.relative_to(out_dir)}: {type(exc).__name__}: {exc}")
    return problems


def _final(out_dir: Path) -> tuple[float | None, float | None]:
    """The final test accuracy and loss (``summary.json``, else the last metrics row)."""
    acc = loss = None
    with contextlib.suppress(Exception):
        rows = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines() if x]
        rows = [r for r in rows if r.get("test_accuracy") is not None]
        acc, loss = rows[-1]["test_accuracy"], rows[-1].get("test_loss")
    with contextlib.suppress(Exception):
        summary = json.loads((out_dir / "summary.json").read_text())
        acc, loss = summary.get("final_accuracy", acc), summary.get("final_loss", loss)
    return acc, loss


@dataclass
class Outcome:
    """What one run did."""

    error: BaseException | None = None
    trace: str = ""
    warnings: list[str] = field(default_factory=list)
    answer: list[str] = field(default_factory=list)  # the warnings in Interception.window
    applied: list[str] = field(default_factory=list)
    json_problems: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)
    accuracy: float | None = None
    loss: float | None = None
    seconds: float = 0.0


def run_case(name: str, out_dir: Path, mutation: Mutation | None, robust: bool = False) -> Outcome:
    """One tiny run of ``name`` into ``out_dir`` (fresh) with ``mutation`` applied, with the
    robust options (:data:`ROBUST`) or the defaults."""
    cfg = tiny_config(name, out_dir, robust)
    watched = sorted({ROOT.resolve(), Path.cwd().resolve()})
    watched = [d for d in watched if not any(o in d.parents for o in watched)]
    before = _snapshot(*watched)
    outcome = Outcome()
    t0 = time.perf_counter()
    with warnings_logged() as lines, intercepted(mutation, lines=lines) as state:
        try:
            run_inprocess(cfg)
        except ConfigError as exc:
            raise FuzzerBug(f"{name}: ConfigError out of the run: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - the finding
            outcome.error = exc
            outcome.trace = traceback.format_exc()
    outcome.seconds = time.perf_counter() - t0
    outcome.warnings, outcome.applied = list(lines), list(state.applied)
    if state.window:
        outcome.answer = lines[state.window[0] : state.window[1]]
    after = _snapshot(*watched)
    out = str(out_dir.resolve())
    outcome.outside = sorted(
        p
        for p, m in after.items()
        if before.get(p) != m and not os.path.abspath(p).startswith(out + os.sep)
    )
    outcome.json_problems = strict_json_problems(out_dir) if out_dir.is_dir() else []
    outcome.accuracy, outcome.loss = _final(out_dir)
    return outcome


@dataclass
class Clean:
    """A strategy's clean run: its outcome and every reply it got."""

    name: str
    outcome: Outcome
    targets: list[Target]
    robust: bool = False

    def others(self, target: Target) -> list[int]:
        """Partition ids other than the target's (for a relabelled group id)."""
        pids = sorted({t.pid for t in self.targets} | set(range(4)))
        return [p for p in pids if p != target.pid]


_CLEAN: dict[tuple[str, bool], Clean] = {}


def clean_run(name: str, scratch: Path | None = None, robust: bool = False) -> Clean:
    """``name``'s clean run with the robust options or the defaults, once per process
    (cached)."""
    if (name, robust) not in _CLEAN:
        base = Path(tempfile.mkdtemp(prefix=f"fuzz-clean-{name}-", dir=scratch))
        seen: list[Target] = []
        cfg = tiny_config(name, base / "run", robust)
        t0 = time.perf_counter()
        with warnings_logged() as lines, intercepted(None, seen):
            run_inprocess(cfg)  # a clean run must finish: anything else is a plain error
        outcome = Outcome(warnings=list(lines), seconds=time.perf_counter() - t0)
        outcome.accuracy, outcome.loss = _final(base / "run")
        outcome.json_problems = strict_json_problems(base / "run")
        unique: dict[tuple[str, int, int], Target] = {}
        for t in seen:
            unique.setdefault((t.message_type, t.server_round, t.pid), t)
        _CLEAN[name, robust] = Clean(name, outcome, list(unique.values()), robust)
        shutil.rmtree(base, ignore_errors=True)
    return _CLEAN[name, robust]


_WITHHELD: dict[tuple[str, str, bool], float | None] = {}


def replay(clean: Clean, kind: str, reply: str, **fields: Any) -> Mutation:
    """The mutation of ``kind`` on the clean run's reply labelled ``reply``
    (:meth:`Target.label`, e.g. ``"train@1/client 0"``) with ``fields`` of :class:`Mutation`
    (``record``, ``key``, ``whole``, ``other``): a known case, replayed as it was found."""
    targets = {t.label(): t for t in clean.targets}
    if reply not in targets:
        raise FuzzerBug(f"{clean.name}: no reply {reply!r} in the clean run ({sorted(targets)})")
    return Mutation(targets[reply], kind, **fields)


def withheld_accuracy(name: str, target: Target, robust: bool, scratch: Path | None = None):
    """The final test accuracy of ``name``'s tiny run in which ``target``'s reply never came
    (cached per process)."""
    key = (name, target.label(), robust)
    if key not in _WITHHELD:
        out = Path(tempfile.mkdtemp(prefix=f"fuzz-withheld-{name}-", dir=scratch))
        try:
            outcome = run_case(name, out / "run", Mutation(target, WITHHOLD), robust)
        finally:
            shutil.rmtree(out, ignore_errors=True)
        if outcome.error is not None:
            raise FuzzerBug(f"{name}: the run without {target.label()} failed: {outcome.trace}")
        _WITHHELD[key] = outcome.accuracy
    return _WITHHELD[key]


def judge(
    name: str, mutation: Mutation, outcome: Outcome, clean: Clean, scratch: Path | None = None
) -> str | None:
    """:func:`verdict`, with the run without the mutated reply (:func:`withheld_accuracy`)
    as the robust options' yardstick, run only when the verdict asks for it."""
    return verdict(
        name,
        mutation,
        outcome,
        clean,
        lambda: withheld_accuracy(name, mutation.target, clean.robust, scratch),
    )


def _names_client(line: str, target: Target) -> bool:
    return bool(
        re.search(rf"\bclient {target.pid}\b", line) or re.search(rf"\bnode {target.node}\b", line)
    )


def dropped(mutation: Mutation, outcome: Outcome, clean: Clean) -> bool:
    """Whether the server dropped the mutated reply: a WARNING naming the client (partition or
    node id) logged while the server dealt with that reply, and not one the clean run logged
    (a reply accepted and then poisoning the model makes every client fail later, and that
    names the client too, but in a later round)."""
    usual = set(clean.outcome.warnings)
    return any(_names_client(w, mutation.target) and w not in usual for w in outcome.answer)


def verdict(
    name: str,
    mutation: Mutation,
    outcome: Outcome,
    clean: Clean,
    withheld: Callable[[], float | None] | None = None,
) -> str | None:
    """Why the case fails (the first line is the summary), or ``None``.

    With the defaults (``clean.robust`` false) the mutated reply must have been dropped or
    have left the final model usable (a finite test loss): FedAvg's mean is not meant to
    withstand a client that sends a valid-looking bad model (Blanchard et al., NeurIPS 2017:
    no linear combination can), only one that breaks the protocol or the model's scale
    (``strategy.aggregation.update_bound``). With the robust options the final accuracy must
    stay within :data:`ROBUST_MARGIN` of the lower of the clean robust run's and the one
    without the mutated reply (``withheld()``, asked for only when the clean run's alone is
    not met), dropped or not.
    """
    if outcome.error is not None:
        last = outcome.trace.strip().splitlines()[-1] if outcome.trace else repr(outcome.error)
        return f"run raised: {last}\n{outcome.trace}"
    if outcome.json_problems:
        return f"non-strict JSON: {outcome.json_problems[0]}\n" + "\n".join(outcome.json_problems)
    if outcome.outside:
        return f"wrote outside the run folder: {outcome.outside[0]}\n" + "\n".join(outcome.outside)
    if not outcome.applied:
        return None  # the target reply never came (the strategy took another path): no finding
    target = mutation.target
    if mutation.kind not in TOKEN_KINDS:
        for line in outcome.answer:
            if _names_client(line, target) and any(t in line for t in TOKEN_REFUSALS):
                return f"refused for its reply token, not for its mutation: {line}"
    was_dropped = dropped(mutation, outcome, clean)
    acc, ref = outcome.accuracy, clean.outcome.accuracy
    if acc is None or ref is None:
        return f"no final test accuracy (clean {ref}, mutated {acc})"
    if clean.robust:
        if acc >= ref - ROBUST_MARGIN:
            return None
        without = withheld() if withheld is not None else None
        if without is not None and acc >= min(ref, without) - ROBUST_MARGIN:
            return None
        return (
            f"robust options on, and the final accuracy fell {acc - ref:+.4f} (clean "
            f"{ref:.4f}, without the reply {without}; margin {ROBUST_MARGIN}; the reply was "
            f"{'' if was_dropped else 'not '}dropped)"
        )
    if was_dropped:
        return None
    if outcome.loss is None or not math.isfinite(outcome.loss):
        return (
            f"kept without a warning naming client {target.pid} (node {target.node}), and the "
            f"final test loss is {outcome.loss}"
        )
    return None


def first_line(reason: str) -> str:
    return reason.splitlines()[0][:300]


def strategy_names() -> list[str]:
    return available()
