"""Co-Boosting's Tables 1, 2 and 7 at CPU scale: one-shot FL with and without data.

Dai et al., "Enhancing One-Shot Federated Learning Through Data and Ensemble Co-Boosting",
ICLR 2024 (paper 004): Table 1 (the server model's test accuracy: one-shot FedAvg, FedDF,
DENSE, Co-Boosting, per Dirichlet alpha), Table 2 (the ensemble's test accuracy under
uniform weights, FedENS, against Co-Boosting's learned weights) and Table 7 (the ablation of
its three components: GHS, the hardness-weighted generator loss, ``synthesis.hardness`` 1 vs
0; DHS, the diversification of pool samples, ``boost.diversify``; EE, the learned ensemble
weights, ``boost.reweight``). Beyond the paper, Co-Boosting with FedGO's discriminator odds
(``strategies/coboosting_fedgo.py``) joins both tables.

For every seed and alpha the runs go in this order (methods are named ``a<alpha>-<name>``):

1. ``oneshot``: the clients train once; one-shot FedAvg (its ``final_accuracy``) and the
   FedENS / DW-FedENS ensemble accuracies; it saves the uploads (``client_models.pt``);
2. ``dense``, ``coboosting`` and, for the ``--ablation-alphas``, the seven other subsets of
   {GHS, DHS, EE} (``abl-none``, ``abl-ghs``, ..., ``abl-dhs_ee``; all three is
   ``coboosting``): each with ``strategy.teachers_from`` set to the oneshot run's scratch
   folder, so every server method starts from the very same client models;
3. ``feddf`` (``rounds=1``): FedDF's one-shot baseline distils on the server's real share. It
   trains its own clients, but with the same data, model, training and seed settings their
   models are the oneshot run's (the table checks it: FedDF's initial average and ensemble
   must equal one-shot FedAvg and FedENS);
4. ``coboosting_fedgo`` (``combine: odds_learned``): the clients also train a discriminator
   in their one round, so it trains its own clients; then ``coboosting_fedgo_odds``
   (``combine: odds``) reuses that run's uploads (models and discriminators).

``--methods`` runs a subset (the runs whose uploads they reuse come along) and adds
``coboosting_sign``: Co-Boosting with the authors' diversification step (``boost.variant:
code``, a signed step of size epsilon) instead of eq. 10's normalised one (the default); it
reuses oneshot's uploads and gets a column where a run of it is kept. Besides the paper's
tables (mean ± sd), the table gives every server model's mean with its 95% t interval over the
seeds and the paired differences the paper's Table 1 claims (Co-Boosting against DENSE, FedDF
and FedAvg; each variant against Co-Boosting) with a paired t-test, and says which seed set
the runs come from (:mod:`fedgo_flwr.app.sweep.seeds`: only report seeds back a claim).

Every run of a seed has the same ``data.server_fraction`` (the preset's; FedDF distils on that
share, the data-free methods ignore it), so every method's clients hold the same data. A run
that reuses uploads needs its source's scratch folder (``outputs/bench/<tag>/<source>-seed<N>/``)
at its start: if that folder was cleaned, or its uploads were made with other settings, the
source runs again there first (its kept record stays; the rerun must reproduce its
accuracies). Runs are resumable and kept as in :mod:`benchmarks.cpfl_cohorts`: each is
:func:`fedgo_flwr.app.inprocess.run_inprocess` in a subprocess of its own (``--child``), its
summary and raw records kept in ``benchmarks/results/<tag>/runs.tar.xz``; a kept run is
skipped, a failed one reported while the others go on. ``--jobs N`` runs up to N at once
(a run that reuses uploads after its source), e.g. on a GPU, where one run of this preset leaves
the card mostly idle.

    .venv/bin/python -m benchmarks.coboosting_table1 [--seeds 0 1 2] [--alphas 0.05 0.1 0.3] \
        [--ablation-alphas 0.05] [--methods oneshot dense coboosting coboosting_sign ...] \
        [--config conf/bench/coboosting-cifar10-cpu.yaml] [--tag coboosting-cifar10-cpu] \
        [--jobs N] [k=v ...]
    .venv/bin/python -m benchmarks.coboosting_table1 --table-only [--tag ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shutil
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from benchmarks.sweep import (
    MISSING,
    SUMMARY,
    Kept,
    Run,
    RunFailed,
    add_data_arguments,
    child,
    child_command,
    ensure_data,
    final_accuracy,
    fmt,
    load_config,
    load_runs,
    mean_ci,
    paired_cell,
    parse_with_overrides,
    run_child,
    run_grid,
    run_name,
    seed_note,
    seeds_of,
    write_table,
)

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = "conf/bench/coboosting-cifar10-cpu.yaml"
DEFAULT_TAG = "coboosting-cifar10-cpu"
SCRATCH = ROOT / "outputs" / "bench"  # runs write to SCRATCH/<tag>/<method>-seed<N>/
ALPHAS = (0.05, 0.1, 0.3)
ABLATION_ALPHAS = (0.05,)
UPLOADS = "client_models.pt"  # strategies.oneshot.UPLOADS_FILE
ANCHOR = (
    "Paper anchor (CIFAR-10, alpha 0.1, 10 clients, 5-layer CNN, full scale): server "
    "accuracy Co-Boosting 57.09, DENSE 47.80, FedDF 49.63, FedAvg 27.54; ensemble accuracy "
    "learned weights 59.86 vs uniform (FedENS) 49.99."
)

# -- the methods -----------------------------------------------------------------------------

COMPONENTS = ("GHS", "DHS", "EE")
ABLATION = [  # (GHS, DHS, EE): none, each alone, each pair, all three (= coboosting)
    (False, False, False),
    (True, False, False),
    (False, True, False),
    (False, False, True),
    (True, True, False),
    (True, False, True),
    (False, True, True),
    (True, True, True),
]
BASE_OVERRIDES: dict[str, list[str]] = {
    "oneshot": ["strategy.name=oneshot"],
    "dense": ["strategy.name=dense"],
    "coboosting": ["strategy.name=coboosting"],
    # The authors' diversification (their ``cb_kd_train``): a step of eps * sign(grad) on
    # softmax at temperature 4, against eq. 10's L2-normalised step (the default, "paper").
    "coboosting_sign": ["strategy.name=coboosting", "strategy.boost.variant=code"],
    "feddf": ["strategy.name=feddf", "rounds=1", "strategy.weighting=uniform"],
    "coboosting_fedgo": ["strategy.name=coboosting_fedgo", "strategy.combine=odds_learned"],
    "coboosting_fedgo_odds": ["strategy.name=coboosting_fedgo", "strategy.combine=odds"],
}
REUSED = {"coboosting_fedgo_odds": "coboosting_fedgo"}
"""Whose uploads a method reuses (``strategy.teachers_from``) when not the oneshot run's."""
TRAINS_CLIENTS = ("oneshot", "feddf", "coboosting_fedgo")
"""Methods whose run trains the clients itself (no ``teachers_from``)."""
ACCURACIES = (
    "final_accuracy",
    "ensemble_accuracy_uniform",
    "ensemble_accuracy_data_size",
    "ensemble_accuracy_fedgo",
    "ensemble_accuracy_learned",
)
"""Summary keys a source's rerun must reproduce (a run repeats exactly per seed on CPU)."""


def ablation_name(ghs: bool, dhs: bool, ee: bool) -> str:
    """``abl-none``, ``abl-ghs``, ``abl-ghs_ee``, ...; all three on is ``coboosting``."""
    on = [name.lower() for name, flag in zip(COMPONENTS, (ghs, dhs, ee), strict=True) if flag]
    if len(on) == len(COMPONENTS):
        return "coboosting"
    return "abl-" + ("_".join(on) if on else "none")


def ablation_overrides(ghs: bool, dhs: bool, ee: bool) -> list[str]:
    """Co-Boosting with each component on or off (paper Table 7)."""
    return [
        "strategy.name=coboosting",
        f"strategy.synthesis.hardness={1 if ghs else 0}",
        f"strategy.boost.diversify={str(dhs).lower()}",
        f"strategy.boost.reweight={str(ee).lower()}",
    ]


def base_overrides(base: str) -> list[str]:
    """The overrides that make method ``base`` of the preset (``ValueError`` if unknown)."""
    if base in BASE_OVERRIDES:
        return list(BASE_OVERRIDES[base])
    for flags in ABLATION:
        if ablation_name(*flags) == base:
            return ablation_overrides(*flags)
    raise ValueError(f"unknown method {base!r}")


def source_of(base: str) -> str | None:
    """The method whose uploads ``base`` reuses (``None``: it trains its clients)."""
    if base in TRAINS_CLIENTS:
        return None
    return REUSED.get(base, "oneshot")


DEFAULT_METHODS = (
    "oneshot",
    "dense",
    "coboosting",
    "feddf",
    "coboosting_fedgo",
    "coboosting_fedgo_odds",
)
"""The methods of a seed by default (the paper's Table 1 and 2, and Co-Boosting with FedGO)."""
EXTRA_METHODS = ("coboosting_sign",)
"""Methods run only when ``--methods`` names them."""
ALL_METHODS = (*DEFAULT_METHODS, *EXTRA_METHODS)


def base_methods(ablation: bool, chosen: Iterable[str] | None = None) -> list[str]:
    """One (alpha, seed)'s methods in run order: every source before the runs reusing it.

    ``chosen``: the methods to run (default :data:`DEFAULT_METHODS`); the sources they reuse
    uploads from are added. The ablation's runs come with ``ablation``."""
    chosen = set(DEFAULT_METHODS if chosen is None else chosen)
    unknown = sorted(chosen - set(ALL_METHODS))
    if unknown:
        raise ValueError(f"unknown methods {unknown}: choose from {list(ALL_METHODS)}")
    for base in list(chosen):
        while (source := source_of(base)) is not None:
            chosen.add(source)
            base = source
    order = ["oneshot", "dense", "coboosting", "coboosting_sign"]
    methods = [m for m in order if m in chosen]
    if ablation:
        methods += [ablation_name(*f) for f in ABLATION if ablation_name(*f) != "coboosting"]
    later = ["feddf", "coboosting_fedgo", "coboosting_fedgo_odds"]
    return [*methods, *(m for m in later if m in chosen)]


def method_name(alpha: float, base: str) -> str:
    """``a0.1-coboosting`` for alpha 0.1."""
    return f"a{alpha:g}-{base}"


def parse_method(method: str) -> tuple[float, str]:
    """``(alpha, base)`` of a method name (``ValueError`` for another name)."""
    a, sep, base = method.partition("-")
    if not (a.startswith("a") and sep and base):
        raise ValueError(f"method {method!r} is not named a<alpha>-<method>")
    return float(a[1:]), base


def method_grid(
    alphas: Iterable[float],
    ablation_alphas: Iterable[float] = (),
    chosen: Iterable[str] | None = None,
) -> list[str]:
    """Every method of a seed, alpha-major; the ablation only for ``ablation_alphas``;
    ``chosen``: as :func:`base_methods`."""
    ablation = {float(a) for a in ablation_alphas}
    chosen = None if chosen is None else list(chosen)
    return [method_name(a, b) for a in alphas for b in base_methods(float(a) in ablation, chosen)]


def method_overrides(method: str) -> list[str]:
    """The config overrides that make ``method`` of the base config."""
    alpha, base = parse_method(method)
    return [f"data.alpha={alpha:g}", *base_overrides(base)]


def source_method(method: str) -> str | None:
    """The full name of the run whose uploads ``method`` reuses (same alpha)."""
    alpha, base = parse_method(method)
    source = source_of(base)
    return None if source is None else method_name(alpha, source)


def run_overrides(
    method: str, seed: int, extra: Sequence[str], run_dir: Path, data: Path | None
) -> list[str]:
    """Every override of one run: data path, seed, the user's ``extra``, the method's (which
    win over ``extra``), the source's scratch folder (its sibling ``run_dir.parent/<source>``)
    for a method that reuses uploads, and the output folder last."""
    source = source_method(method)
    reuse = [] if source is None else [f"strategy.teachers_from={scratch_of(run_dir, source)}"]
    return [
        *([f"data.path={data}"] if data is not None else []),
        f"seed={seed}",
        "resume=true",
        *extra,
        *method_overrides(method),
        *reuse,
        f"output_dir={run_dir}",
    ]


def scratch_of(run_dir: Path, method: str) -> Path:
    """The scratch folder of ``method``'s run of the same seed as ``run_dir``'s."""
    seed = run_dir.name.rsplit("-seed", 1)[1]
    return run_dir.parent / f"{method}-seed{seed}"


# -- configs ---------------------------------------------------------------------------------


@contextlib.contextmanager
def quiet_library() -> Iterator[None]:
    """Hide the library's warnings while the driver loads configs (each preset holds keys of
    every method, and each method warns that it ignores the others')."""
    logger = logging.getLogger("fedgo_flwr")
    old = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(old)


def check_grid(config: str, methods: Sequence[str], extra: Sequence[str]) -> str:
    """Load every method's config once before any run (a bad override stops the sweep here,
    not hours in) and check that all methods of an alpha train the very same clients (data,
    model, training, seed and sampling settings: those a saved upload is checked against);
    return the dataset's name."""
    dataset = ""
    first: dict[float, tuple[str, dict]] = {}
    with quiet_library():
        for method in methods:
            try:
                cfg = load_config(config, [*extra, *method_overrides(method)])
            except Exception as exc:  # noqa: BLE001 - reported with the method it concerns
                sys.exit(f"{method}: {exc}")
            from strategies.oneshot import fingerprint

            dataset = cfg.data.dataset
            mine = fingerprint(cfg)
            alpha = parse_method(method)[0]
            other, theirs = first.setdefault(alpha, (method, mine))
            differ = sorted(k for k in mine if mine[k] != theirs[k])
            if differ:
                sys.exit(
                    f"{method}: its clients would not be {other}'s ({', '.join(differ)} "
                    "differ); every method of an alpha must train the same clients"
                )
    return dataset


# -- running ---------------------------------------------------------------------------------


def execute(method: str, seed: int, args: argparse.Namespace) -> Path:
    """One run in its own subprocess; its output folder (``RunFailed`` if it failed)."""
    run_dir = SCRATCH / args.tag / run_name(method, seed)
    overrides = run_overrides(method, seed, args.overrides, run_dir, args.data)
    cmd = child_command(__spec__.name, args.config, overrides)
    return run_child(cmd, run_dir, run_name(method, seed))


def uploads_problem(method: str, seed: int, args: argparse.Namespace) -> str | None:
    """Why ``method``'s run could not reuse its source's uploads now (``None``: it can): the
    check its own preflight makes (the file is there and was made with this run's settings)."""
    run_dir = SCRATCH / args.tag / run_name(method, seed)
    with quiet_library():
        cfg = load_config(
            args.config, run_overrides(method, seed, args.overrides, run_dir, args.data)
        )
        from strategies import strategy_class
        from strategies.oneshot import read_client_models

        extra = strategy_class(cfg.strategy.name).extra_fingerprint(cfg)
        try:
            read_client_models(cfg.strategy.params.teachers_from, cfg, extra)
        except ValueError as exc:
            return str(exc)
    return None


def prepare_source(method: str, seed: int, args: argparse.Namespace, results: Path) -> None:
    """Make sure the uploads ``method`` reuses are in its source's scratch folder.

    The source must have finished (its record kept: it runs first in the grid); if its
    folder was cleaned since, or holds uploads made with other settings, it runs again there.
    Its kept record stays, and the rerun must reproduce its accuracies: a difference means the
    record was made with other settings, which the sweep must not mix into one table.
    """
    source = source_method(method)
    if source is None:
        return
    with _source_lock(run_name(source, seed)):  # its dependents may start at once (--jobs)
        _prepare(method, source, seed, args, results)


_SOURCE_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_LOCK = threading.Lock()


def _source_lock(name: str) -> threading.Lock:
    with _LOCKS_LOCK:
        return _SOURCE_LOCKS.setdefault(name, threading.Lock())


def _prepare(method: str, source: str, seed: int, args: argparse.Namespace, results: Path) -> None:
    record = Kept(results).json(run_name(source, seed))
    if record is None:
        raise RunFailed(
            f"{run_name(method, seed)} not run: it reuses the uploads of "
            f"{run_name(source, seed)}, which has not finished"
        )
    problem = uploads_problem(method, seed, args)
    if problem is None:
        return
    note = f"note: {problem}; running {run_name(source, seed)} again for its uploads"
    print(note, file=sys.stderr, flush=True)
    shutil.rmtree(SCRATCH / args.tag / run_name(source, seed), ignore_errors=True)
    rerun = json.loads((execute(source, seed, args) / SUMMARY).read_text())
    differ = [k for k in ACCURACIES if k in record and rerun.get(k) != record[k]]
    if differ:
        raise RunFailed(
            f"{run_name(method, seed)} not run: {run_name(source, seed)} ran again for its "
            f"uploads, but differs from its kept record ({results / run_name(source, seed)}) in "
            f"{', '.join(differ)}: that record was made with other settings; remove it (and the "
            "records of the runs that reused it) and run the sweep again"
        )


def run_one(method: str, seed: int, args: argparse.Namespace, results: Path) -> Path:
    """One run, after its source's uploads are in place; its output folder."""
    prepare_source(method, seed, args, results)
    return execute(method, seed, args)


# -- the tables ------------------------------------------------------------------------------

PAPER_TABLE1 = {  # paper Table 1, 10 clients: FedAvg, FedDF, DENSE, Co-Boosting
    "cifar10": {
        0.05: (17.49, 37.53, 38.37, 47.20),
        0.1: (27.54, 49.63, 47.80, 57.09),
        0.3: (46.39, 67.18, 66.77, 70.24),
    },
    "mnist": {
        0.05: (46.35, 80.73, 81.06, 93.93),
        0.1: (75.68, 87.91, 87.83, 94.44),
        0.3: (78.97, 97.66, 96.96, 97.25),
    },
}
PAPER_TABLE2 = {  # paper Tables 2 and 9: FedENS (uniform), DW-FedENS (not given), learned
    "cifar10": {0.05: (42.34, None, 48.75), 0.1: (49.99, None, 59.86), 0.3: (69.61, None, 72.67)},
    "mnist": {0.05: (81.52, None, 94.59), 0.1: (88.16, None, 94.47), 0.3: (97.75, None, 97.75)},
}
REFERENCE_NAMES = {"cifar10": "CIFAR-10", "mnist": "MNIST"}
TABLE1_COLUMNS = [  # (header, method, summary key)
    ("FedAvg", "oneshot", "final_accuracy"),
    ("FedDF", "feddf", "final_accuracy"),
    ("DENSE", "dense", "final_accuracy"),
    ("Co-Boosting", "coboosting", "final_accuracy"),
    ("Co-Boosting, sign step", "coboosting_sign", "final_accuracy"),
    ("CB + FedGO odds x learned", "coboosting_fedgo", "final_accuracy"),
    ("CB + FedGO odds", "coboosting_fedgo_odds", "final_accuracy"),
]
TABLE2_COLUMNS = [
    ("uniform (FedENS)", "oneshot", "ensemble_accuracy_uniform"),
    ("data size (DW-FedENS)", "oneshot", "ensemble_accuracy_data_size"),
    ("learned (Co-Boosting)", "coboosting", "ensemble_accuracy_learned"),
    ("FedGO odds", "coboosting_fedgo", "ensemble_accuracy_fedgo"),
    ("odds x learned", "coboosting_fedgo", "ensemble_accuracy_learned"),
]
SAME = 1e-7
"""Two test accuracies of the same models are equal up to float rounding (one test image of
10,000 is 1e-4)."""


def reference_of(dataset: str) -> str | None:
    """Which paper rows a preset's table shows: CIFAR-10 for the JPEG tree, MNIST for digits."""
    return {"imagefolder": "cifar10", "cifar10": "cifar10", "digits": "mnist"}.get(dataset)


def accuracies(runs: Iterable[Run], key: str) -> list[float]:
    """Summary ``key`` of each run that has it, in percent."""
    return [100.0 * float(r.summary[key]) for r in runs if r.summary.get(key) is not None]


def cell(runs: Sequence[Run], key: str, seeds: int) -> str:
    """``m ± sd`` of ``key`` in percent; ``(n=k)`` when only ``k`` of the row's ``seeds``
    have it; ``–`` when none has."""
    vals = accuracies(runs, key)
    text = fmt(vals, 2)
    return text + f" (n={len(vals)})" if vals and len(vals) < seeds else text


def seeds_at(alpha: float, runs: dict[str, list[Run]]) -> int:
    """How many seeds have any run at ``alpha`` (a row's full count)."""
    prefix = method_name(alpha, "")
    return len({r.seed for m, rs in runs.items() if m.startswith(prefix) for r in rs})


def accuracy_table(
    header: str,
    columns: list[tuple[str, str, str]],
    alphas: Sequence[float],
    runs: dict[str, list[Run]],
    paper: dict[float, tuple[float | None, ...]] | None,
    paper_name: str,
) -> list[str]:
    """Rows by alpha, one column per (method, key); a paper row under each alpha it has."""
    rows = [
        header,
        "",
        "| alpha | seeds | " + " | ".join(c[0] for c in columns) + " |",
        "|---" * (len(columns) + 2) + "|",
    ]
    for alpha in alphas:
        n = seeds_at(alpha, runs)
        cells = [cell(runs.get(method_name(alpha, m), []), key, n) for _, m, key in columns]
        rows.append(f"| {alpha:g} | {n} | " + " | ".join(cells) + " |")
        if paper and alpha in paper:
            ref = [MISSING if v is None else f"{v:.2f}" for v in paper[alpha]]
            ref += [MISSING] * (len(columns) - len(ref))
            rows.append(f"| {alpha:g} (paper, {paper_name}) | | " + " | ".join(ref) + " |")
    return rows


def last_metric(run: Run, key: str) -> float | None:
    """``key`` of the last ``metrics.jsonl`` row that has it."""
    for row in reversed(run.metrics):
        if row.get(key) is not None:
            return float(row[key])
    return None


def same_client_checks(alphas: Sequence[float], runs: dict[str, list[Run]]) -> list[str]:
    """Do the runs that train their own clients get the oneshot run's models? FedDF's
    initial parameter average must be one-shot FedAvg and its uniform ensemble FedENS;
    Co-Boosting + FedGO's FedENS must be oneshot's. Per (alpha, seed) with both runs."""
    checks = {  # name: (method, value of that run, oneshot's key)
        "FedDF initial average = one-shot FedAvg": (
            "feddf",
            lambda r: last_metric(r, "init_test_accuracy"),
            "final_accuracy",
        ),
        "FedDF ensemble = FedENS": (
            "feddf",
            lambda r: last_metric(r, "ensemble_test_accuracy"),
            "ensemble_accuracy_uniform",
        ),
        "CB + FedGO FedENS = FedENS": (
            "coboosting_fedgo",
            lambda r: r.summary.get("ensemble_accuracy_uniform"),
            "ensemble_accuracy_uniform",
        ),
    }
    out = []
    for name, (method, value, key) in checks.items():
        equal, differ = 0, []
        for alpha in alphas:
            base = {r.seed: r.summary.get(key) for r in runs.get(method_name(alpha, "oneshot"), [])}
            for r in runs.get(method_name(alpha, method), []):
                mine, theirs = value(r), base.get(r.seed)
                if mine is None or theirs is None:
                    continue
                if abs(mine - float(theirs)) <= SAME:
                    equal += 1
                else:
                    differ.append(f"{alpha:g}/{r.seed}: {100 * mine:.2f} vs {100 * theirs:.2f}")
        text = f"- {name}: {equal} of {equal + len(differ)} (alpha, seed) pairs"
        out.append(text + (f"; differ: {', '.join(differ)}" if differ else ""))
    return out


def ablation_rows(ablation_alphas: Sequence[float], runs: dict[str, list[Run]]) -> list[str]:
    """Table 7's shape: a check mark per component on, server accuracy per alpha."""
    rows = [
        "Ablation (paper Table 7; server test accuracy %; all three on is the Co-Boosting run; "
        "GHS: hardness-weighted generator loss, `strategy.synthesis.hardness` 1 vs 0; DHS: "
        "diversified pool samples, `strategy.boost.diversify`; EE: learned ensemble weights, "
        "`strategy.boost.reweight`). Paper, CIFAR-10 Dir(0.05), full scale: none 39.72, all "
        "three 47.20 (which of its six middle rows is which subset is lost in the text).",
        "",
        "| "
        + " | ".join(COMPONENTS)
        + " | "
        + " | ".join(f"alpha {a:g}" for a in ablation_alphas)
        + " |",
        "|---" * (len(COMPONENTS) + len(ablation_alphas)) + "|",
    ]
    for flags in ABLATION:
        marks = ["✓" if on else "" for on in flags]
        cells = [
            cell(
                runs.get(method_name(a, ablation_name(*flags)), []),
                "final_accuracy",
                seeds_at(a, runs),
            )
            for a in ablation_alphas
        ]
        rows.append("| " + " | ".join(marks + cells) + " |")
    return rows


PAIRS = (  # (variant, baseline): the paper's claims on Table 1, and what this project adds
    ("coboosting", "dense"),
    ("coboosting", "feddf"),
    ("coboosting", "oneshot"),
    ("dense", "oneshot"),
    ("coboosting_sign", "coboosting"),
    ("coboosting_fedgo_odds", "coboosting"),
    ("coboosting_fedgo", "coboosting"),
)
NAMES = {m: header for header, m, _ in TABLE1_COLUMNS}


def interval_rows(alphas: Sequence[float], runs: dict[str, list[Run]]) -> list[str]:
    """The server models' accuracies with 95% t intervals over seeds and the paired
    differences of :data:`PAIRS` (runs of one seed share their clients' models), under the
    seed set's note (:func:`benchmarks.sweep.seed_note`: only report seeds back a claim)."""
    seeds = seeds_of(runs)
    if not seeds:
        return []
    rows = [
        "Server model, test accuracy % with the half-width of its 95% t interval over seeds, "
        "and paired differences (variant minus baseline, on the seeds both ran: mean [95% CI], "
        f"two-sided paired t-test): {seed_note(seeds)}.",
        "",
        "| alpha | method | mean ± 95% CI | per seed |",
        "|---|---|---|---|",
    ]
    for alpha in alphas:
        for header, method, key in TABLE1_COLUMNS:
            rs = runs.get(method_name(alpha, method), [])
            if not rs:
                continue
            values = [r.summary.get(key) for r in rs]
            each = ", ".join(
                f"{r.seed.removeprefix('seed')}: {100 * v:.2f}"
                for r, v in zip(rs, values, strict=True)
                if v is not None
            )
            kept = [v for v in values if v is not None]
            rows.append(f"| {alpha:g} | {header} | {mean_ci(kept)} | {each} |")
    rows += ["", "| alpha | variant - baseline (points) | difference |", "|---|---|---|"]
    for alpha in alphas:
        for variant, baseline in PAIRS:
            a = runs.get(method_name(alpha, variant), [])
            b = runs.get(method_name(alpha, baseline), [])
            cell = paired_cell(b, a, final_accuracy)
            if cell != "-":
                rows.append(f"| {alpha:g} | {NAMES[variant]} - {NAMES[baseline]} | {cell} |")
    return rows


def time_rows(
    alphas: Sequence[float], ablation_alphas: Sequence[float], runs: dict[str, list[Run]]
) -> list[str]:
    """Mean ± sd wall time per run (``total_time``), by method and alpha."""
    rows = [
        "Wall time per run (s, mean ± sd over seeds; a run that reuses uploads does not train "
        "the clients: their training is in oneshot's time, and the FedGO runs' in "
        "coboosting_fedgo's, with the discriminators):",
        "",
        "| method | " + " | ".join(f"alpha {a:g}" for a in alphas) + " |",
        "|---" * (len(alphas) + 1) + "|",
    ]
    total = 0.0
    for base in base_methods(bool(ablation_alphas), ALL_METHODS):
        if base in EXTRA_METHODS and not any(runs.get(method_name(a, base)) for a in alphas):
            continue
        cells = []
        for alpha in alphas:
            rs = runs.get(method_name(alpha, base), [])
            times = [float(r.summary["total_time"]) for r in rs if "total_time" in r.summary]
            total += sum(times)
            cells.append(fmt(times, 1))
        rows.append(f"| {base} | " + " | ".join(cells) + " |")
    rows += ["", f"All kept runs: {total:.0f} s ({total / 3600:.2f} h) of run time."]
    return rows


def table(
    results: Path,
    alphas: Sequence[float] = ALPHAS,
    ablation_alphas: Sequence[float] = ABLATION_ALPHAS,
    *,
    title: str = DEFAULT_TAG,
    reference: str | None = None,
) -> str:
    """``table.md`` from the finished runs kept in ``results`` (missing ones show ``–``)."""
    ablation_alphas = [a for a in ablation_alphas if a in alphas]
    runs = load_runs(results, method_grid(alphas, ablation_alphas, ALL_METHODS))
    name = REFERENCE_NAMES.get(reference or "", "")
    # A method run only on request (``--methods``) has a column where some run of it is kept.
    shown = {m for m in ALL_METHODS if any(runs.get(method_name(a, m)) for a in alphas)}
    table1 = [c for c in TABLE1_COLUMNS if c[1] not in EXTRA_METHODS or c[1] in shown]
    rows = [
        f"# Co-Boosting at CPU scale: {title} (benchmarks/coboosting_table1.py)",
        "",
        ANCHOR,
        "",
        "Test accuracy %, mean ± sd over seeds (sample sd); (n=k): only k of the row's seeds "
        "have that run; –: none has. Every server method of a seed starts from the same "
        "client models (those of oneshot; the FedGO runs' own, checked below).",
        "",
        *accuracy_table(
            "Server model (paper Table 1; FedAvg: the one-shot parameter average):",
            table1,
            alphas,
            runs,
            PAPER_TABLE1.get(reference or ""),
            name,
        ),
        "",
        *accuracy_table(
            "Ensemble of the client models (paper Table 2; the paper reports FedENS and "
            "learned only):",
            TABLE2_COLUMNS,
            alphas,
            runs,
            PAPER_TABLE2.get(reference or ""),
            name,
        ),
        "",
        "Same client models in the runs that train their own (FedDF, CB + FedGO) as in "
        "oneshot: equal test accuracies, per (alpha, seed) with both runs:",
        "",
        *same_client_checks(alphas, runs),
    ]
    if ablation_alphas:
        rows += ["", *ablation_rows(ablation_alphas, runs)]
    rows += ["", *time_rows(alphas, ablation_alphas, runs)]
    intervals = interval_rows(alphas, runs)
    if intervals:
        rows += ["", *intervals]
    return "\n".join(rows)


# -- command line ----------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="k=v words: config overrides for every run"
    )
    parser.add_argument("--config", default=DEFAULT_CONFIG)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--alphas", nargs="+", type=float, default=list(ALPHAS))
    parser.add_argument(
        "--ablation-alphas",
        nargs="*",
        type=float,
        default=list(ABLATION_ALPHAS),
        help="alphas that also run the Table-7 ablation, those of --alphas only (none given: "
        "no ablation)",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=list(DEFAULT_METHODS),
        help=f"the methods to run (default: {' '.join(DEFAULT_METHODS)}; also "
        f"{' '.join(EXTRA_METHODS)}); the runs whose uploads they reuse are added",
    )
    parser.add_argument("--tag", default=DEFAULT_TAG)
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs at once (default 1); a run that reuses uploads starts once their source "
        "is over. Give each run its share of the cores (e.g. resources.server_cpus=1)",
    )
    add_data_arguments(parser)
    parser.add_argument("--table-only", action="store_true")
    args = parse_with_overrides(parser, argv)
    if args.jobs < 1:
        parser.error("--jobs: at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--child"]:
        child(argv[1:])
        return
    args = parse_args(argv)
    results = ROOT / "benchmarks" / "results" / args.tag
    try:
        methods = method_grid(args.alphas, args.ablation_alphas, args.methods)
    except ValueError as exc:
        sys.exit(f"--methods: {exc}")
    failed: list[str] = []
    dataset = check_grid(args.config, methods, args.overrides)
    if not args.table_only:
        # Absolute for the runs; kept records name it relative to the repository again.
        imagefolder = dataset == "imagefolder"
        args.data = ensure_data(ROOT / args.data, args.archive) if imagefolder else None
        run: Callable[[str, int], Path] = lambda m, s: run_one(m, s, args, results)  # noqa: E731
        failed = run_grid(methods, args.seeds, run, results, jobs=args.jobs, after=source_method)
    text = table(
        results,
        args.alphas,
        args.ablation_alphas,
        title=args.tag,
        reference=reference_of(dataset),
    )
    write_table(results, text)
    if failed:
        sys.exit("failed runs (run the sweep again to retry them):\n" + "\n".join(failed))


if __name__ == "__main__":
    main()
