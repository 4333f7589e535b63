"""Co-Boosting's server budget chosen on the tuning seeds, then reported on the report seeds.

Issue 36 asks for Co-Boosting's Table 1 (paper 004, Dai et al., ICLR 2024, Sec. 4) at "the
smallest server budget where the data-free students clear 20%": at the grid's 8 epochs every
data-free student sits at chance. The budget is a choice, so it is made on the tuning seeds
and the table is built on report seeds that no choice used (:mod:`fedgo_app.sweep.seeds`).
The rule, fixed before any of its runs (``benchmarks/studies/coboosting.md``,
"Co-Boosting's learning budget"):

1. **Pilot**: for each budget in ``--budgets`` (server epochs, ascending), DENSE and
   Co-Boosting (with the one-shot run whose uploads they share) on every tuning seed
   (``python -m benchmarks run coboosting_table1``, tag ``coboosting-budget-pilot-e<E>``).
2. **Choice** (:func:`choose_budget`): the smallest budget at which both students' final test
   accuracy is above ``--threshold`` on every tuning seed; if none is, the largest budget,
   marked as not clearing (the table then states the gap). Budgets after the chosen one are not
   run.
3. **Report**: the report seeds at the chosen budget, one seed at a time (every method of a
   seed before the next seed; with ``--jobs N``, N runs at once over all of them), tag
   ``coboosting-report-e<E>``, with ``--report-methods``
   (default: one-shot FedAvg, DENSE, Co-Boosting with eq. 10's normalised step and with the
   authors' signed step, FedDF, Co-Boosting + FedGO odds).

Resumable as the table driver is (kept runs are skipped), so a stopped run goes on where it
stopped; ``--stop-after S`` starts no new run after S seconds (a device lease ends at a fixed
time; the runs under way finish and are kept), and ``choice.json`` in the report's results
folder says what was chosen from what.

The benchmark is the spec :data:`SPEC` (:mod:`benchmarks.spec`), which drives the spec
``coboosting_table1``, each call a process of its own:

    python -m benchmarks run coboosting_budget [--budgets 40 80] [--tuning-seeds 0 1] \
        [--report-seeds 100 101 102] [--alpha 0.1] [--archive cifar10-jpg.tar.gz] [--jobs N] \
        [k=v ...]
    python -m benchmarks table coboosting_budget [--budgets 20 40 80]   # pilot, report tables
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from benchmarks.coboosting_grid import DEFAULT_CONFIG, method_name, method_overrides
from benchmarks.coboosting_tables import reference_of, table
from benchmarks.spec import Bench, Spec
from benchmarks.sweep import final_accuracy, load_config, load_runs
from fedgo_app.sweep.seeds import REPORT_SEEDS, TUNING_SEEDS

ROOT = Path(__file__).resolve().parents[1]
STUDENTS = ("dense", "coboosting")
"""The data-free students whose accuracy sets the budget."""
REPORT_METHODS = ("oneshot", "dense", "coboosting", "coboosting_sign", "feddf",
                  "coboosting_fedgo_odds")  # fmt: skip
THRESHOLD = 0.20


def pilot_tag(budget: int) -> str:
    return f"coboosting-budget-pilot-e{budget}"


def report_tag(budget: int) -> str:
    return f"coboosting-report-e{budget}"


def choose_budget(
    pilot: Mapping[int, Mapping[str, Mapping[int, float | None]]], threshold: float = THRESHOLD
) -> tuple[int, bool]:
    """``(budget, cleared)``: the smallest budget whose every student's accuracy is above
    ``threshold`` on every seed (``pilot[budget][student][seed]``; a missing accuracy does not
    clear), else the largest budget with ``cleared`` False."""
    if not pilot:
        raise ValueError("no pilot budget to choose from")
    for budget in sorted(pilot):
        by_student = [pilot[budget].get(s) or {} for s in STUDENTS]
        accs = [a for by_seed in by_student for a in by_seed.values()]
        if all(by_student) and all(a is not None and a > threshold for a in accs):
            return budget, True
    return max(pilot), False


def pilot_accuracies(
    results: Path, alpha: float, seeds: Sequence[int]
) -> dict[str, dict[int, float | None]]:
    """The students' final accuracies kept under ``results``, by student and seed."""
    methods = [method_name(alpha, s) for s in STUDENTS]
    runs = load_runs(results, methods)
    out: dict[str, dict[int, float | None]] = {}
    for student, method in zip(STUDENTS, methods, strict=True):
        by_seed = {int(r.seed.removeprefix("seed")): final_accuracy(r) for r in runs[method]}
        out[student] = {s: by_seed.get(s) for s in seeds}
    return out


def table_driver(
    args: argparse.Namespace,
    tag: str,
    seeds: Sequence[int],
    methods: Sequence[str],
    budget: int,
    left: float | None = None,
) -> int:
    """One call of the spec ``coboosting_table1`` (its own process); its exit status.
    ``left``: the seconds of ``--stop-after`` still to go, its own ``--stop-after``."""
    cmd = [sys.executable, "-m", "benchmarks", "run", "coboosting_table1", "--config", args.config,
           "--seeds", *map(str, seeds), "--alphas", f"{args.alpha:g}", "--ablation-alphas",
           "--methods", *methods, "--tag", tag, "--data", args.data,
           "--jobs", str(args.jobs)]  # fmt: skip
    if args.archive:
        cmd += ["--archive", args.archive]
    if left is not None:
        cmd += ["--stop-after", f"{max(left, 0.0):.0f}"]
    cmd += [*args.overrides, f"strategy.epochs={budget}"]
    print("coboosting_budget:", " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.call(cmd, cwd=ROOT)


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budgets", nargs="+", type=int, default=[40, 80])
    parser.add_argument("--tuning-seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--report-seeds", nargs="+", type=int, default=[100, 101, 102])
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--threshold", type=float, default=THRESHOLD)
    parser.add_argument("--report-methods", nargs="+", default=list(REPORT_METHODS))


def validate(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line (``None``: nothing); sorts ``--budgets``."""
    if not set(args.tuning_seeds) <= set(TUNING_SEEDS):
        return f"--tuning-seeds: a budget is chosen on tuning seeds {TUNING_SEEDS} only"
    if not set(args.report_seeds) <= set(REPORT_SEEDS):
        return f"--report-seeds: report seeds are {REPORT_SEEDS}"
    if any(b < 1 for b in args.budgets):
        return "--budgets: server epochs >= 1"
    if any(o.split("=", 1)[0] == "strategy.epochs" for o in args.overrides):
        return "strategy.epochs is the budget: give --budgets"
    args.budgets = sorted(set(args.budgets))
    return None


def run(bench: Bench) -> int:
    """The pilot, the choice and the report (the module's doc); 0, or 1 when a call of the
    table spec failed or the time ran out."""
    args = bench.args
    start = time.monotonic()

    def left() -> float | None:
        return None if args.stop_after is None else args.stop_after - (time.monotonic() - start)

    def out_of_time() -> bool:
        late = (remaining := left()) is not None and remaining <= 0
        if late:
            print("coboosting_budget: --stop-after reached; run again to go on", file=sys.stderr)
        return late

    results = ROOT / "benchmarks" / "results"
    pilot: dict[int, dict[str, dict[int, float | None]]] = {}
    for budget in args.budgets:
        if out_of_time():
            return 1
        if table_driver(args, pilot_tag(budget), args.tuning_seeds, STUDENTS, budget, left()):
            return 1
        pilot[budget] = pilot_accuracies(results / pilot_tag(budget), args.alpha, args.tuning_seeds)
        chosen, cleared = choose_budget(pilot, args.threshold)
        if cleared:
            break
    chosen, cleared = choose_budget(pilot, args.threshold)
    report = results / report_tag(chosen)
    report.mkdir(parents=True, exist_ok=True)
    choice = {"budget": chosen, "cleared": cleared, "threshold": args.threshold,
              "tuning_seeds": args.tuning_seeds, "alpha": args.alpha, "students": STUDENTS,
              "pilot": {str(b): v for b, v in pilot.items()}}  # fmt: skip
    (report / "choice.json").write_text(json.dumps(choice, indent=1, sort_keys=True) + "\n")
    print(f"coboosting_budget: {chosen} server epochs (clears {args.threshold:.0%}: {cleared})",
          file=sys.stderr, flush=True)  # fmt: skip
    # One seed at a time, so that a stop leaves whole seeds; with --jobs, all at once.
    batches = [args.report_seeds] if args.jobs > 1 else [[s] for s in args.report_seeds]
    for seeds in batches:
        if out_of_time():
            return 1
        if table_driver(args, report_tag(chosen), seeds, args.report_methods, chosen, left()):
            return 1
    return 0


def tables(bench: Bench) -> dict[Path, str]:
    """The table of every pilot and report folder of ``--budgets`` that is there (the table
    spec's, on ``--alpha`` without the ablation, as this spec's calls of it make them)."""
    args = bench.args
    alpha = [args.alpha]
    cfg = load_config(args.config, [*args.overrides, *method_overrides(f"a{args.alpha:g}-oneshot")])
    reference = reference_of(cfg.data.dataset)
    out = {}
    for budget in args.budgets:
        for tag in (pilot_tag(budget), report_tag(budget)):
            folder = ROOT / "benchmarks" / "results" / tag
            if folder.is_dir():
                out[folder] = table(folder, alpha, [], title=tag, reference=reference)
    return out


SPEC = Spec(
    name="coboosting_budget",
    summary="Co-Boosting's server budget chosen on the tuning seeds, reported on the report seeds",
    config=DEFAULT_CONFIG,
    tag="coboosting-budget",
    methods=lambda args: [],
    overrides=method_overrides,
    table=tables,
    options=options,
    validate=validate,
    run=run,
)


if __name__ == "__main__":  # the command before the specs: say what replaced it
    raise SystemExit(f"{__spec__.name} is a spec: python -m benchmarks run|table coboosting_budget")
