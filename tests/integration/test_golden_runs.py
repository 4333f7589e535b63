"""Golden runs: every strategy's tiny in-process run must reproduce the recorded results exactly.

Every strategy found by name (:func:`strategies.available`) gets one case (its id is the
strategy's name), plus a case for each scenario that goes through other reply paths
(:data:`SCENARIOS`): ``fedgo_g3`` (G3: no server data, FedGAN at the clients, D2),
``fedgo_reference_server`` (discriminators against the server's images), ``cpfl_2_cohorts``
(stage 2: distillation of two cohorts), ``cpfl_fedgo`` (CPFL distilled with FedGO's odds: the
discriminator round), ``feddf_mixed_models`` (two client architectures) and
``coboosting_fedgo_odds`` (``combine: odds``). Each case runs on the digits data cut to a
stratified 400 training and 120 test images, through :func:`fedgo_app.inprocess.run_inprocess`:
4 clients, 1 local epoch, ``conf/default.yaml`` with 2 rounds at fraction 0.5, or, for the
one-shot strategies, ``conf/coboosting.yaml`` (every client, no server data) with 1 round; each
strategy's expensive knobs are cut (:data:`KNOBS`). The record keeps the config file and the
overrides it ran with.

What is recorded per case (``tests/golden/runs.json``), all compared exactly (floats equal, NaN
written ``null`` as the run writes it):

- the rows of ``metrics.jsonl`` and ``summary.json``, without wall-clock figures (at any depth:
  every key ``elapsed`` or containing ``time``, and ``seconds``/``disc_seconds``) and without
  the process's peak memory (:data:`UNSTABLE_KEYS`); byte counts and simulated clocks stay;
- every other JSON file of the run folder (``partition.json``, ``prefl.json``) alike, but
  ``env.json`` (the machine, the time and the commit the run used);
- a sha256 of every saved ``.pt`` file (final ``model.pt``, ``generator.pt``,
  ``discriminators.pt``, ``client_models.pt``, the clients' state files), not of the file's
  bytes (pickles carry metadata) but of its content: keys in sorted order, each key, dtype,
  shape and the tensor's raw bytes. The checkpoints (``checkpoint*.pt``, ``fedgan.pt``) are
  left out: they hold timings and RNG states, and the resume tests cover them.

The run folder's path inside a recorded string is written ``<out>``, and the random run token
in the clients' state folders (``client-state/<run>/...``) ``<run>``. On a mismatch the test
names each key path that differs (golden and new value).

A case without a golden entry (a new strategy) is skipped, saying so and how to record it
(``FEDGO_WRITE_GOLDEN=1`` records it): a new algorithm passes without a hand-edited entry. A
golden entry of a case that no longer exists fails. Regenerate on purpose (only after a change
that is *meant* to change results), from the repository root, with either of::

    PYTHONPATH=$PWD python tests/integration/test_golden_runs.py --write [CASE_ID ...]
    FEDGO_WRITE_GOLDEN=1 python -m pytest tests/integration/test_golden_runs.py

``--write`` with case ids rewrites only those entries; the pytest form rewrites the entries of
the cases it ran (under ``-n`` too: the file is updated under a lock). ``--check [CASE_ID ...]``
runs the cases and prints the differences without pytest. A case whose settings change must be
regenerated too: its record keeps them.

The figures are this machine's: an AMD EPYC CPU, torch 2.14.1 (MKL, oneDNN) with AVX2 kernels
(on an AVX-512 machine ``tests/conftest.py`` caps torch, oneDNN, MKL and NumPy's OpenBLAS at
AVX2, which gives the same bits), with torch's default thread count, which the ServerApp sets to
``os.cpu_count()`` (here 2) for the server; the clients use ``resources.client_cpus`` (1).
Another core count, a CPU without AVX2 or another torch build may round differently and fail
these tests without any change of the code; the failure names the kernels it ran with. They
were written by commit 000eebc's code.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # the script form: the kernel level pytest runs at, set first
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from conftest import KERNEL_LEVEL  # tests/conftest.py: before torch or NumPy is imported

    for _key, _value in KERNEL_LEVEL.items():
        os.environ.setdefault(_key, _value)

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
if __name__ == "__main__" and str(ROOT) not in sys.path:  # as a script: this checkout's code
    sys.path.insert(0, str(ROOT))

from fedgo_app.inprocess import run_inprocess  # noqa: E402
from strategies import available, load_experiment, strategy_class  # noqa: E402
from strategies.oneshot import OneShot  # noqa: E402

# Recorded with the ServerApp's own thread count (all cores), not the tier's one thread.
pytestmark = pytest.mark.torch_threads

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "runs.json"
WRITE_ENV = "FEDGO_WRITE_GOLDEN"
REGENERATE = (
    "regenerate it on purpose with "
    "`PYTHONPATH=$PWD python tests/integration/test_golden_runs.py --write` "
    f"(or {WRITE_ENV}=1 python -m pytest tests/integration/test_golden_runs.py) and commit "
    "tests/golden/runs.json"
)

# -- the cases -------------------------------------------------------------------------------

DATA = ["data.num_clients=4", "data.train_subset=400", "data.test_subset=120"]
"""Digits cut to a stratified 400 training and 120 test images (every case)."""

TINY = [*DATA, "fraction=0.5", "train.local_epochs=1", "rounds=2"]
"""Every round-based case (conf/default.yaml)."""

ONE_SHOT = [*DATA, "train.local_epochs=1", "rounds=1"]
"""Every one-shot case (conf/coboosting.yaml: every client, no server data, one round)."""

DATA_FREE = [
    "strategy.epochs=2",
    "strategy.nz=16",
    "strategy.ngf=8",
    "strategy.synthesis.batch_size=16",
    "strategy.synthesis.steps=2",
    "strategy.boost.batch_size=16",
]
GAN = [
    "strategy.generator.steps=2",
    "strategy.generator.n_critic=2",
    "strategy.generator.batch_size=32",
    "strategy.generator.latent_dim=16",
    "strategy.generator.width=8",
    "strategy.discriminator.epochs=1",
]
"""FedGO's WGAN-GP generator (G1) and the clients' discriminators, cut down."""

FEDGO = ["strategy.distill.epochs=1", *GAN]

KNOBS: dict[str, list[str]] = {
    "fedtgp": ["strategy.tgp_epochs=3"],
    "fedgkd": ["strategy.buffer_length=2"],
    "fedgkd_plus": ["strategy.buffer_length=2", "strategy.distill.epochs=1"],
    "feddf": ["strategy.distill.epochs=1"],
    "dafkd": [
        "strategy.generator.latent_dim=8",
        "strategy.generator.width=8",
        "strategy.distill_size=64",
        "strategy.distill.epochs=1",
    ],
    "fedgo": FEDGO,
    "cpfl": [
        "strategy.cohorts=1",
        "strategy.window=1",
        "strategy.patience=1",
        "strategy.distill.epochs=1",
    ],
    "coboosting": DATA_FREE,
    "coboosting_fedgo": [*DATA_FREE, "strategy.discriminator.epochs=1"],
    "dense": DATA_FREE,
    "fadi": [*DATA_FREE, "model.name=cnn_bn"],
}
"""Each strategy's expensive settings cut down (a strategy not named here runs with TINY or
ONE_SHOT alone)."""

CPFL_COHORTS = [
    "strategy.name=cpfl",
    "strategy.cohorts=2",
    "strategy.window=1",
    "strategy.patience=1",
    "strategy.cohort_eval_every=1",
    "strategy.distill.epochs=1",
]

SCENARIOS: dict[str, tuple[str, list[str]]] = {
    # G3 + D2: no server data, generator and critic trained by FedGAN at the clients.
    "fedgo_g3": (
        "default",
        [
            "strategy.name=fedgo",
            *FEDGO,
            "data.server_fraction=0",
            "strategy.generator.steps=0",
            "strategy.generator.federated_rounds=2",
            "strategy.generator.local_epochs=1",
            "strategy.distill_data=generated",
            "strategy.generated_size=64",
        ],
    ),
    # Discriminators against the server's own images (sent with the discriminator message).
    "fedgo_reference_server": (
        "default",
        [
            "strategy.name=fedgo",
            *FEDGO,
            "strategy.discriminator.reference=server",
            "strategy.discriminator.reference_size=20",
        ],
    ),
    "cpfl_2_cohorts": ("default", CPFL_COHORTS),
    # CPFL's distillation with FedGO's odds: the discriminator round of the cohorts' clients.
    "cpfl_fedgo": (
        "default",
        [
            *CPFL_COHORTS,
            "strategy.distill.weights=fedgo",
            *GAN,
        ],
    ),
    # FedDF on the clients' models of two architectures (logits only meet).
    "feddf_mixed_models": (
        "default",
        [
            "strategy.name=feddf",
            "strategy.distill.epochs=1",
            "model.client_models=[cnn, mlp]",
            "strategy.aggregation.rule=mean",  # the only rule across architectures
        ],
    ),
    # Co-Boosting with FedGO's odds alone (no learned scalar weights).
    "coboosting_fedgo_odds": (
        "coboosting",
        ["strategy.name=coboosting_fedgo", *KNOBS["coboosting_fedgo"], "strategy.combine=odds"],
    ),
}
"""Further cases: id -> (conf file stem, overrides)."""


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    conf: str
    overrides: tuple[str, ...]

    @property
    def path(self) -> str:
        return f"conf/{self.conf}.yaml"

    @property
    def all_overrides(self) -> list[str]:
        """The overrides of :attr:`path`, the base settings first (less ``output_dir``)."""
        return [*(ONE_SHOT if self.conf == "coboosting" else TINY), *self.overrides]

    def config(self, out_dir: Path):
        return load_experiment(ROOT / self.path, [*self.all_overrides, f"output_dir={out_dir}"])


def strategy_case(name: str) -> Case:
    """The case of strategy ``name``: one-shot strategies from conf/coboosting.yaml."""
    one_shot = issubclass(strategy_class(name), OneShot)
    conf = "coboosting" if one_shot else "default"
    return Case(name, conf, (f"strategy.name={name}", *KNOBS.get(name, [])))


def all_cases() -> list[Case]:
    strategies = [strategy_case(name) for name in available()]
    extra = [Case(cid, conf, tuple(overrides)) for cid, (conf, overrides) in SCENARIOS.items()]
    return strategies + extra


# -- what a run is reduced to ----------------------------------------------------------------

UNSTABLE_KEYS = ("server_peak_rss_mb", "seconds", "disc_seconds")
"""Keys without ``time`` in their name whose values differ between identical runs: the
process's peak memory, and wall-clock seconds of the GAN stages (``prefl.json``). CPFL's
``round_seconds`` and other simulated clocks are deterministic and stay."""

RUN_TOKEN = re.compile(r"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])")
"""A run token (32 hex digits, random per run): names the clients' state folders."""

PROVENANCE = ("env.json",)
"""Files not compared: what machine, code and command made the run (the start time, host and
versions differ between identical runs; tests/unit/test_provenance.py covers them)."""

SKIPPED_PT = ("checkpoint.pt", "checkpoint.prev.pt", "fedgan.pt")
"""Saved files not hashed: checkpoints (timings, RNG states; the resume tests cover them)."""


def unstable(key: str) -> bool:
    return key == "elapsed" or "time" in key or key in UNSTABLE_KEYS


def stable(value: Any, out_dir: str) -> Any:
    """``value`` without wall-clock keys (at any depth), the run folder's path as ``<out>``."""
    if isinstance(value, dict):
        return {k: stable(v, out_dir) for k, v in value.items() if not unstable(k)}
    if isinstance(value, list):
        return [stable(v, out_dir) for v in value]
    if isinstance(value, str):
        return value.replace(out_dir, "<out>")
    return value


def _feed(h: Any, value: Any, path: str) -> None:
    """Hash ``value`` (nested dicts and lists of tensors and plain data) into ``h``."""
    if isinstance(value, dict):
        h.update(f"{path}:dict{len(value)};".encode())
        for key in sorted(value, key=repr):
            _feed(h, value[key], f"{path}/{key!r}")
    elif isinstance(value, list | tuple):
        h.update(f"{path}:list{len(value)};".encode())
        for i, item in enumerate(value):
            _feed(h, item, f"{path}/{i}")
    elif isinstance(value, torch.Tensor | np.ndarray):
        t = torch.as_tensor(value).detach().cpu().contiguous()
        h.update(f"{path}:{t.dtype}{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    else:
        h.update(f"{path}:{value!r};".encode())


def tensor_hash(path: Path) -> str:
    """sha256 of a saved ``.pt`` file's content: keys sorted, dtype, shape and raw bytes."""
    h = hashlib.sha256()
    _feed(h, torch.load(path, map_location="cpu", weights_only=True), "")
    return h.hexdigest()


def record_of(out_dir: Path) -> dict[str, Any]:
    """What a finished run is compared by (see the module docstring)."""
    where = str(out_dir)
    metrics = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]
    files: dict[str, Any] = {}
    tensors: dict[str, str] = {}
    for path in sorted(out_dir.rglob("*")):
        name = RUN_TOKEN.sub("<run>", path.relative_to(out_dir).as_posix())
        if not path.is_file() or name in ("metrics.jsonl", "summary.json", *PROVENANCE):
            continue
        if path.suffix == ".json":
            files[name] = stable(json.loads(path.read_text()), where)
        elif path.suffix == ".pt" and path.name not in SKIPPED_PT:
            tensors[name] = tensor_hash(path)
    return {
        "metrics": stable(metrics, where),
        "summary": stable(json.loads((out_dir / "summary.json").read_text()), where),
        "files": files,
        "sha256": tensors,
    }


def run_case(case: Case, parent: Path) -> dict[str, Any]:
    out_dir = parent / case.id
    run_inprocess(case.config(out_dir))
    return {"config": case.path, "overrides": case.all_overrides, **record_of(out_dir)}


# -- comparison ------------------------------------------------------------------------------


def same(a: Any, b: Any) -> bool:
    """Exact equality; NaN equals NaN, and an int never equals a float."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def differences(want: Any, got: Any, path: str = "", limit: int = 20) -> list[str]:
    """Where ``got`` differs from ``want``, one line per key path (at most ``limit``)."""
    out: list[str] = []

    def show(value: Any) -> str:
        text = repr(value)
        return text if len(text) <= 200 else text[:200] + "..."

    def key(p: str, k: str) -> str:
        return f"{p}.{k}" if k.isidentifier() else f"{p}[{k!r}]"

    def walk(a: Any, b: Any, p: str) -> None:
        if len(out) >= limit:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(a.keys() - b.keys()):
                out.append(f"{key(p, k)}: missing (golden {show(a[k])})")
            for k in sorted(b.keys() - a.keys()):
                out.append(f"{key(p, k)}: not in golden (got {show(b[k])})")
            for k in sorted(a.keys() & b.keys()):
                walk(a[k], b[k], key(p, k))
        elif isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                out.append(f"{p}: {len(b)} items, golden {len(a)}")
            for i, (x, y) in enumerate(zip(a, b, strict=False)):
                walk(x, y, f"{p}[{i}]")
        elif not same(a, b):
            out.append(f"{p}: golden {show(a)}, got {show(b)}")

    walk(want, got, path)
    return out[:limit]


def load_golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}


def write_golden(entries: dict[str, Any]) -> None:
    """Update the golden file with ``entries`` (case id -> record), keys sorted; under a lock,
    so that pytest-xdist workers writing at once keep each other's entries."""
    import fcntl

    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    folder = os.open(GOLDEN.parent, os.O_RDONLY)  # the lock: on the folder, no extra file
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        golden = {**load_golden(), **entries}
        text = json.dumps(golden, indent=1, sort_keys=True, allow_nan=False) + "\n"
        GOLDEN.with_suffix(".tmp").write_text(text)
        GOLDEN.with_suffix(".tmp").replace(GOLDEN)
    finally:
        os.close(folder)  # and the lock with it


# -- the tests -------------------------------------------------------------------------------

CASES = all_cases()


def test_every_golden_run_is_a_case():
    """A recorded case that no longer exists fails (a strategy without a record is skipped by
    :func:`test_golden_run`)."""
    golden = load_golden()
    assert set(available()) & set(golden), f"no strategy has a golden run in {GOLDEN}"
    cases = {c.id for c in CASES}
    stale = sorted(set(golden) - cases)
    assert not stale, f"golden runs of cases that no longer exist: {stale}; {REGENERATE}"


RECORD = (
    f"record it with `{WRITE_ENV}=1 python -m pytest tests/integration/test_golden_runs.py "
    "-k <case>` (or `PYTHONPATH=$PWD python tests/integration/test_golden_runs.py --write "
    "<case>`) and commit tests/golden/runs.json"
)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_golden_run(case, tmp_path):
    got = run_case(case, tmp_path)
    if os.environ.get(WRITE_ENV) == "1":
        write_golden({case.id: got})
        return
    golden = load_golden()
    if case.id not in golden:
        pytest.skip(f"case {case.id!r} has no golden run yet (a new strategy?): {RECORD}")
    want = golden[case.id]
    if not same(want, got):
        lines = differences(want, got)
        pytest.fail(
            f"case {case.id!r} differs from its golden run ({len(lines)} shown):\n  "
            + "\n  ".join(lines)
            + f"\n(torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()} kernels, "
            f"{torch.get_num_threads()} threads: recorded with AVX2 and 2)"
            + f"\nIf the change is meant: {REGENERATE}"
        )


# -- regenerating ----------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    import argparse
    import time

    parser = argparse.ArgumentParser(
        prog="tests/integration/test_golden_runs.py", description=__doc__
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="run and write the golden file")
    action.add_argument("--check", action="store_true", help="run and compare, print diffs")
    parser.add_argument("cases", nargs="*", help="case ids (default: all)")
    parser.add_argument("--out", help="write the records here instead (a JSON file)")
    args = parser.parse_args(argv)
    known = {c.id: c for c in CASES}
    unknown = [c for c in args.cases if c not in known]
    if unknown:
        parser.error(f"unknown case ids {unknown}; known: {sorted(known)}")
    chosen = [known[c] for c in args.cases] if args.cases else CASES
    golden = load_golden()
    records, failed = {}, 0
    with tempfile.TemporaryDirectory(prefix="golden-") as tmp:
        for case in chosen:
            t0 = time.perf_counter()
            records[case.id] = got = run_case(case, Path(tmp))
            took = time.perf_counter() - t0
            if args.check:
                lines = differences(golden.get(case.id), got) if case.id in golden else ["none"]
                ok = case.id in golden and same(golden[case.id], got)
                failed += not ok
                print(f"{case.id}: {'same' if ok else 'DIFFERS'} ({took:.1f}s)", file=sys.stderr)
                for line in [] if ok else lines:
                    print(f"  {line}", file=sys.stderr)
            else:
                print(f"{case.id}: {took:.1f}s", file=sys.stderr)
    if args.write:
        if args.out:
            Path(args.out).write_text(
                json.dumps(records, indent=1, sort_keys=True, allow_nan=False) + "\n"
            )
        else:
            write_golden(records)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
