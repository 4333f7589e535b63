"""The largest ratios honest clients reach under the round-relative reply bounds.

Every bound on a client's upload that is relative to its round (``strategy.aggregation.
clip_factor`` on the classifier's updates, ``upload_bound`` on the other uploads, the teachers'
and discriminators' logit scales) must sit above what honest clients send, so that a clean run
never meets it. This runs honest in-process digits runs and records, per run and per kind, the
largest ratio of one client's figure to its round's lower median:

- ``update``: a client's update norm ``||y_k - x||`` (:class:`ClippedMean`);
- ``upload``: the other uploads (:func:`bound_uploads`: SCAFFOLD's control deltas, FedGAN's
  generator and critic, DaFKD's generator and heads, FedTGP's prototypes);
- ``teacher``: a teacher's logit scale (:func:`teacher_scales`, every ensemble of client models);
- ``discriminator``: a discriminator's logit scale (FedGO's weighting);
- ``array``: one array's update norm ``||y_k^a - x^a||`` against the round's lower median of
  that array (:func:`array_outliers`: which teachers of FedDF's family are left out under the
  rules that keep the round's models, the default consensus rule among them).

``update`` is read from the mean's :class:`ClippedMean` and from the consensus rule's whole-update
norms alike.

The runs: every golden case (``tests/integration/test_golden_runs.py``: every strategy and
scenario, 4 clients, 2 per round) and a grid of strategies x Dirichlet alpha (0.01, 0.1, 1.0)
with 20 clients (10 at alpha 0.01, which cannot split digits over 20), 8 per round, 3 rounds,
2 local epochs, every digits image::

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python -m benchmarks.honest_ratios --json ratios.json
    PYTHONPATH=$PWD .venv/bin/python -m benchmarks.honest_ratios --only grid --strategies fedavg
    PYTHONPATH=$PWD .venv/bin/python -m benchmarks.honest_ratios \
        --config conf/paper/fedavg-cifar10-a0.1.yaml --set rounds=2 ...

``--config`` runs the given experiments with the ``--set`` overrides instead (a paper preset
at a cut that a CPU affords: ``benchmarks/studies/trust.md`` gives the command it was
measured with).

Each run is deterministic (accuracy-only: it may run beside other work). The figures of the
bounds' defaults are in ``benchmarks/studies/trust.md``, "Honest ratios under the reply
bounds".
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

GRID_STRATEGIES = ["fedavg", "fedprox", "scaffold", "feddisco", "feddf", "fedgo", "dafkd", "fedtgp"]
GRID_ALPHAS = [0.01, 0.1, 1.0]
GRID = [
    "data.num_clients=20",
    "fraction=0.4",
    "rounds=3",
    "train.local_epochs=2",
    "data.min_client_size=1",  # alpha 0.01 leaves clients with one sample
    "data.test_subset=200",
]

KINDS = ("update", "upload", "teacher", "discriminator", "array")


class Recorder:
    """The largest ratio seen per kind while installed (module attributes patched)."""

    def __init__(self) -> None:
        self.largest: dict[str, float] = defaultdict(float)

    def see(self, kind: str, values: list[float]) -> None:
        from fedgo_flwr.learning.aggregation import lower_median

        values = [v for v in values if math.isfinite(v)]
        if len(values) < 2:
            return
        median = lower_median(values)
        if median > 0:
            self.largest[kind] = max(self.largest[kind], max(values) / median)


def _patch_everywhere(original: Callable, replacement: Callable) -> list[tuple[Any, str]]:
    """Replace ``original`` by ``replacement`` in every loaded module of this project that
    holds it under its name (``from x import f`` binds it in the importer)."""
    patched = []
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(("fedgo_flwr", "strategies", "clients")):
            continue
        if getattr(module, original.__name__, None) is original:
            setattr(module, original.__name__, replacement)
            patched.append((module, original.__name__))
    return patched


def install(rec: Recorder) -> Callable[[], None]:
    """Patch the bounds' functions to report their ratios to ``rec``; returns the undo."""
    import strategies  # noqa: F401 - every strategy module loaded before patching
    from fedgo_flwr.gan import sampling
    from fedgo_flwr.learning import aggregation, clipping, consensus, distill

    for name in strategies.available():
        strategies.strategy_class(name)
    undo: list[Callable[[], None]] = []

    original_result = clipping.ClippedMean.result

    def result(self):
        rec.see("update", list(self.norms.values()))
        return original_result(self)

    clipping.ClippedMean.result = result
    undo.append(lambda: setattr(clipping.ClippedMean, "result", original_result))

    original_consensus = consensus.ConsensusStack.result

    def consensus_result(self):
        out = original_consensus(self)
        rec.see("update", list(self.norms.values()))
        return out

    consensus.ConsensusStack.result = consensus_result
    undo.append(lambda: setattr(consensus.ConsensusStack, "result", original_consensus))

    def wrap(original: Callable, kind: str, values_of: Callable) -> None:
        def replacement(*args, **kwargs):
            try:
                rec.see(kind, values_of(*args, **kwargs))
            except Exception:  # noqa: BLE001 - measuring must not change the run
                pass
            return original(*args, **kwargs)

        replacement.__name__ = original.__name__
        patched = _patch_everywhere(original, replacement)
        undo.append(lambda: [setattr(m, n, original) for m, n in patched])

    def upload_values(uploads, factor, *, reference=None, clients=None, groups=None):
        return [float(aggregation.upload_norm(u, reference)) for u in uploads]

    def teacher_values(logits, *args, **kwargs):
        return [float(s) for s in distill.teacher_scales(logits.detach().double())]

    def disc_values(logits, clients, *args, **kwargs):
        return [float(logits[k].double().pow(2).mean().sqrt()) for k in clients]

    def array_values(models, reference, factor):
        for norms in clipping.array_update_norms(models, reference).values():
            rec.see("array", norms)
        return []

    wrap(clipping.array_outliers, "array", array_values)
    wrap(aggregation.bound_uploads, "upload", upload_values)
    wrap(distill.teacher_scale_outliers, "teacher", teacher_values)
    wrap(sampling.discriminator_scale_outliers, "discriminator", disc_values)
    return lambda: [u() for u in reversed(undo)]


def _golden_module() -> Any:
    """``tests/integration/test_golden_runs.py``, whose cases these runs reuse."""
    name = "golden_runs_cases"
    if name not in sys.modules:
        path = ROOT / "tests" / "integration" / "test_golden_runs.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules[name]


def golden_cases() -> list[tuple[str, str, list[str]]]:
    """``(id, config path, overrides)`` of every golden case."""
    return [(c.id, c.path, list(c.all_overrides)) for c in _golden_module().all_cases()]


def grid_cases(
    names: list[str], alphas: list[float] = GRID_ALPHAS
) -> list[tuple[str, str, list[str]]]:
    """``(id, config path, overrides)`` of the strategies x alpha grid, with the golden
    runs' cuts of each strategy's expensive knobs."""
    module = _golden_module()
    out = []
    for name in names:
        for alpha in alphas:
            knobs = module.KNOBS.get(name, [])
            overrides = [*GRID, f"data.alpha={alpha}", f"strategy.name={name}", *knobs]
            if alpha < 0.05:  # digits cannot be split over 20 clients at alpha 0.01
                overrides += ["data.num_clients=10", "fraction=0.8"]
            out.append((f"{name}-a{alpha}", "conf/default.yaml", overrides))
    return out


def run(cases: list[tuple[str, str, list[str]]]) -> list[dict[str, Any]]:
    from fedgo_app.inprocess import run_inprocess
    from strategies import load_experiment

    rows = []
    for cid, conf, overrides in cases:
        rec = Recorder()
        undo = install(rec)
        t0 = time.perf_counter()
        error = None
        try:
            with tempfile.TemporaryDirectory() as tmp:
                cfg = load_experiment(ROOT / conf, [*overrides, f"output_dir={tmp}/run"])
                run_inprocess(cfg)
        except Exception as exc:  # noqa: BLE001 - a setting that cannot run is a row too
            error = f"{type(exc).__name__}: {str(exc)[:200]}"
        finally:
            undo()
        row = {"case": cid, **{k: round(rec.largest.get(k, 0.0), 3) for k in KINDS}}
        if error:
            row["error"] = error
        row["seconds"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| run | " + " | ".join(KINDS) + " |", "|---" * (len(KINDS) + 1) + "|"]
    for r in rows:
        cells = [f"{r[k]:.2f}" if r[k] else "-" for k in KINDS]
        if r.get("error"):
            cells = [f"did not run: {r['error']}", *([""] * (len(KINDS) - 1))]
        lines.append(f"| {r['case']} | " + " | ".join(cells) + " |")
    most = {k: max((r[k] for r in rows), default=0.0) for k in KINDS}
    lines.append("| **largest** | " + " | ".join(f"**{most[k]:.2f}**" for k in KINDS) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("golden", "grid", "both"), default="both")
    parser.add_argument("--strategies", default=",".join(GRID_STRATEGIES))
    parser.add_argument("--alphas", default=",".join(str(a) for a in GRID_ALPHAS))
    parser.add_argument("--json", type=Path, help="write the rows to this file")
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        help="run this experiment (e.g. a paper preset) instead of --only's cases; repeatable",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override for every --config run (e.g. a cut that a CPU affords)",
    )
    args = parser.parse_args(argv)
    import logging

    logging.getLogger("flwr").setLevel(logging.ERROR)
    cases = [(Path(c).stem, c, list(args.set)) for c in args.config]
    if args.config:
        args.only = None
    if args.only in ("golden", "both"):
        cases += golden_cases()
    if args.only in ("grid", "both"):
        alphas = [float(a) for a in args.alphas.split(",") if a]
        cases += grid_cases([s for s in args.strategies.split(",") if s], alphas)
    rows = run(cases)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
