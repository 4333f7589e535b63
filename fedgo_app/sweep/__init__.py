"""Sweeps and claims: variants x seeds, one table with confidence intervals and paired tests.

``python -m fedgo_app.sweep VARIANT... --seeds tuning|report|N,N,... [--baseline NAME]
[--out DIR] [--archive PATH.tar.xz] [--jobs N] [--stop-after S] [--metric KEY] [--table-only]
[k=v ...]``
(``./run.sh --sweep``):

- a **variant** is ``PATH.yaml``, ``NAME=PATH.yaml`` or ``"NAME=PATH.yaml k=v ..."`` (one
  quoted word), ``k=v`` words outside a variant apply to every variant
  (:mod:`fedgo_app.sweep.variants`);
- the **seeds** are a named set, ``tuning`` (choose on these) or ``report`` (never choose on
  them), or a list (:mod:`fedgo_app.sweep.seeds`);
- each variant x seed runs as a child process into ``<out>/<variant>/seed<N>/``, several at a
  time where the CPUs allow, resumable, a failed run recorded and the others going on
  (:mod:`fedgo_app.sweep.runner`, on the child-run engine the benchmark specs use too,
  :mod:`fedgo_app.sweep.engine`); ``--archive`` keeps the finished runs' records in one
  file that a sweep on another machine restores first (:mod:`fedgo_app.sweep.archive`);
  ``--stop-after S`` starts no run after S seconds (the runs under way finish and are kept),
  and the table names the runs left;
- ``<out>/table.md``, ``table.json`` and ``curves.png``: mean, 95% t interval and sd of the
  final metric per variant, paired differences against the baseline (paired t-test), the curves
  with 95% bands; a table of tuning seeds says "tuning seeds: not for claims"
  (:mod:`fedgo_app.sweep.table`, :mod:`fedgo_app.sweep.stats`).

Example: FedAvg, FedDF and FedGO on one base YAML, chosen on the tuning seeds::

    python -m fedgo_app.sweep "fedavg=conf/default.yaml" \\
        "feddf=conf/default.yaml strategy.name=feddf" \\
        "fedgo=conf/default.yaml strategy.name=fedgo" \\
        --seeds tuning --baseline fedavg --out outputs/sweep-digits rounds=20
"""

from fedgo_app.sweep.seeds import REPORT_SEEDS, SEED_SETS, TUNING_SEEDS, SeedSet, parse_seeds
from fedgo_app.sweep.stats import Paired, Summary, paired, summarize

__all__ = [
    "REPORT_SEEDS",
    "SEED_SETS",
    "TUNING_SEEDS",
    "Paired",
    "SeedSet",
    "Summary",
    "paired",
    "parse_seeds",
    "summarize",
]
