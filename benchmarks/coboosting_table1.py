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

``--teachers DIR`` takes the clients' models from :mod:`benchmarks.oneshot_teachers` (its work
folder) instead of a training in the oneshot run: oneshot and the methods reusing its uploads
read the milestone ``DIR/seed<N>/e<E>`` for the run's ``train.local_epochs`` ``E``, the same
models bit for bit as oneshot's training would upload (that module's test), trained epoch by
epoch and resumable across sessions, where one oneshot run of hundreds of local epochs is not.
The methods that train their own clients (``feddf``, ``coboosting_fedgo``) still do.

``--methods`` runs a subset (the runs whose uploads they reuse come along) and adds
``coboosting_sign``: Co-Boosting with the authors' diversification step (``boost.variant:
code``, a signed step of size epsilon) instead of eq. 10's normalised one (the default), and
``coboosting_uncapped``: eq. 12 as published (``share_cap: false``, no mean-share cap on the
learned weights); each reuses oneshot's uploads and gets a column where a run of it is kept.
Besides the paper's tables (mean ± sd), the table gives every server model's mean with its 95% t
interval over the seeds and the paired differences the paper's Table 1 claims (Co-Boosting
against DENSE, FedDF and FedAvg; each variant against Co-Boosting) with a paired t-test, and
says which seed set the runs come from (:mod:`fedgo_app.sweep.seeds`: only report seeds back a
claim).

Every run of a seed has the same ``data.server_fraction`` (the preset's; FedDF distils on that
share, the data-free methods ignore it), so every method's clients hold the same data. A run
that reuses uploads needs its source's scratch folder (``outputs/bench/<tag>/<source>-seed<N>/``)
at its start: if that folder was cleaned, or its uploads were made with other settings, the
source runs again there first (its kept record stays; the rerun must reproduce its
accuracies). The benchmark is the spec :data:`SPEC` (:mod:`benchmarks.spec`): runs are
resumable and kept as CPFL's are, each :func:`fedgo_app.inprocess.run_inprocess` in a
subprocess of its own, its summary and raw records kept in
``benchmarks/results/<tag>/runs.tar.xz``; a kept run is skipped, a failed one reported while
the others go on. ``--jobs N`` runs up to N at once (a run that reuses uploads starts once its
source is over; give each run its share of the cores, e.g. ``resources.server_cpus=1``), e.g.
on a GPU, where one run of this preset leaves the card mostly idle.

This module holds the runs' reuse of uploads and the spec; the methods (names, overrides, run
order, whose uploads each reuses) are :mod:`benchmarks.coboosting_grid`'s, and ``table.md``
(Tables 1, 2 and 7 with the paper's rows, intervals, paired tests and wall times) is built by
:mod:`benchmarks.coboosting_tables`. The names the tests use stay importable from here.

    .venv/bin/python -m benchmarks run coboosting_table1 [--seeds 0 1 2] \
        [--alphas 0.05 0.1 0.3] [--ablation-alphas 0.05] \
        [--methods oneshot dense coboosting coboosting_sign ...] \
        [--config conf/bench/coboosting-cifar10-cpu.yaml] [--tag coboosting-cifar10-cpu] \
        [--teachers DIR] [--jobs N] [--stop-after S] [k=v ...]
    .venv/bin/python -m benchmarks table coboosting_table1 [--config ...] [--tag ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shutil
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from benchmarks.coboosting_grid import (
    ABLATION,
    ABLATION_ALPHAS,
    ALL_METHODS,
    ALPHAS,
    BASE_OVERRIDES,
    DEFAULT_CONFIG,
    DEFAULT_METHODS,
    DEFAULT_TAG,
    EXTRA_METHODS,
    ablation_name,
    method_grid,
    method_name,
    method_overrides,
    parse_method,
    source_method,
)
from benchmarks.coboosting_tables import ANCHOR, reference_of, table
from benchmarks.spec import Bench, Spec
from benchmarks.sweep import SUMMARY, Kept, RunFailed, load_config, load_runs, run_name

# The grid's, the tables' and the runner's names the tests and coboosting_budget.py use as this
# module's (``driver.<name>``) that it does not use itself.
__all__ = [
    "ABLATION",
    "ALL_METHODS",
    "ANCHOR",
    "BASE_OVERRIDES",
    "ablation_name",
    "load_runs",
    "method_name",
]

UPLOADS = "client_models.pt"  # strategies.oneshot.UPLOADS_FILE
ACCURACIES = (
    "final_accuracy",
    "ensemble_accuracy_uniform",
    "ensemble_accuracy_data_size",
    "ensemble_accuracy_fedgo",
    "ensemble_accuracy_learned",
)
"""Summary keys a source's rerun must reproduce (a run repeats exactly per seed on CPU)."""


# -- a run's reuse of uploads ------------------------------------------------------------------


def reuse(bench: Bench, method: str, seed: int) -> list[str]:
    """``strategy.teachers_from``: the source's scratch folder (the sibling of the run's own)
    for a method that reuses uploads, or the ``--teachers`` milestone for oneshot and the
    methods reusing its uploads; nothing for one that trains its clients."""
    milestone = teachers_of(bench, method, seed)
    if milestone is not None:
        return [f"strategy.teachers_from={milestone}"]
    source = source_method(method)
    if source is None:
        return []
    return [f"strategy.teachers_from={scratch_of(bench.run_dir(method, seed), source)}"]


def teachers_of(bench: Bench, method: str, seed: int) -> Path | None:
    """With ``--teachers DIR``: the client models ``method`` starts from, the milestone of
    :mod:`benchmarks.oneshot_teachers` for the seed and the run's local epochs
    (``DIR/seed<N>/e<E>``), for oneshot and every method that reuses oneshot's uploads;
    ``None`` otherwise (no ``--teachers``, or a method that trains its own clients)."""
    if bench.args.teachers is None:
        return None
    alpha, base = parse_method(method)
    if base != "oneshot" and source_method(method) != method_name(alpha, "oneshot"):
        return None
    with quiet_library():
        cfg = load_config(bench.args.config, [*bench.args.overrides, *method_overrides(method)])
    return Path(bench.args.teachers) / f"seed{seed}" / f"e{cfg.train.local_epochs}"


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


def uploads_problem(bench: Bench, method: str, seed: int) -> str | None:
    """Why ``method``'s run could not reuse its source's uploads now (``None``: it can): the
    check its own preflight makes (the file is there and was made with this run's settings)."""
    with quiet_library():
        cfg = load_config(bench.args.config, bench.overrides(method, seed))
        from strategies import strategy_class
        from strategies.oneshot import read_client_models

        extra = strategy_class(cfg.strategy.name).extra_fingerprint(cfg)
        try:
            read_client_models(cfg.strategy.params.teachers_from, cfg, extra)
        except ValueError as exc:
            return str(exc)
    return None


def prepare_source(bench: Bench, method: str, seed: int) -> None:
    """Make sure the uploads ``method`` reuses are in its source's scratch folder (with
    ``--teachers``: that the milestone it reads fits its settings, ``RunFailed`` otherwise).

    The source must have finished (its record kept: it runs first in the grid); if its
    folder was cleaned since, or holds uploads made with other settings, it runs again there.
    Its kept record stays, and the rerun must reproduce its accuracies: a difference means the
    record was made with other settings, which the sweep must not mix into one table.
    """
    if teachers_of(bench, method, seed) is not None:  # not a run's output: nothing to rerun
        problem = uploads_problem(bench, method, seed)
        if problem is not None:
            raise RunFailed(f"{run_name(method, seed)} not run: --teachers: {problem}")
        return
    source = source_method(method)
    if source is None:
        return
    with _source_lock(run_name(source, seed)):  # its dependents may start at once (--jobs)
        _prepare(bench, method, source, seed)


_SOURCE_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_LOCK = threading.Lock()


def _source_lock(name: str) -> threading.Lock:
    with _LOCKS_LOCK:
        return _SOURCE_LOCKS.setdefault(name, threading.Lock())


def _prepare(bench: Bench, method: str, source: str, seed: int) -> None:
    results = bench.results
    record = Kept(results).json(run_name(source, seed))
    if record is None:
        raise RunFailed(
            f"{run_name(method, seed)} not run: it reuses the uploads of "
            f"{run_name(source, seed)}, which has not finished"
        )
    problem = uploads_problem(bench, method, seed)
    if problem is None:
        return
    note = f"note: {problem}; running {run_name(source, seed)} again for its uploads"
    print(note, file=sys.stderr, flush=True)
    shutil.rmtree(bench.run_dir(source, seed), ignore_errors=True)
    rerun = json.loads((bench.execute(source, seed) / SUMMARY).read_text())
    differ = [k for k in ACCURACIES if k in record and rerun.get(k) != record[k]]
    if differ:
        raise RunFailed(
            f"{run_name(method, seed)} not run: {run_name(source, seed)} ran again for its "
            f"uploads, but differs from its kept record ({results / run_name(source, seed)}) in "
            f"{', '.join(differ)}: that record was made with other settings; remove it (and the "
            "records of the runs that reused it) and run the sweep again"
        )


# -- the spec --------------------------------------------------------------------------------


def options(parser: argparse.ArgumentParser) -> None:
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
    parser.add_argument(
        "--teachers",
        type=Path,
        default=None,
        help="the work folder of benchmarks.oneshot_teachers: oneshot, and every method reusing "
        "its uploads, start from its milestone DIR/seed<N>/e<E> (E: train.local_epochs) instead "
        "of training the clients",
    )


def methods(args: argparse.Namespace) -> list[str]:
    """The grid of ``--alphas``, ``--ablation-alphas`` and ``--methods`` (``ValueError`` for
    an unknown method)."""
    try:
        return method_grid(args.alphas, args.ablation_alphas, args.methods)
    except ValueError as exc:
        raise ValueError(f"--methods: {exc}") from exc


def tables(bench: Bench) -> str:
    """``table.md``: Tables 1, 2 and 7 of the kept runs, against the paper's figures of the
    config's dataset."""
    args = bench.args
    with quiet_library():
        cfg = load_config(
            args.config, [*args.overrides, *method_overrides(f"a{args.alphas[0]:g}-oneshot")]
        )
    reference = reference_of(cfg.data.dataset)
    return table(
        bench.results, args.alphas, args.ablation_alphas, title=args.tag, reference=reference
    )


SPEC = Spec(
    name="coboosting_table1",
    summary="Co-Boosting's Tables 1, 2 and 7 at CPU scale: one-shot FL with and without data",
    config=DEFAULT_CONFIG,
    tag=DEFAULT_TAG,
    methods=methods,
    overrides=method_overrides,
    table=tables,
    options=options,
    after=source_method,
    reuse=reuse,
    prepare=prepare_source,
    check=lambda bench, methods: check_grid(bench.args.config, methods, bench.args.overrides),
)


if __name__ == "__main__":  # the command before the specs: say what replaced it
    raise SystemExit(f"{__spec__.name} is a spec: python -m benchmarks run|table coboosting_table1")
