"""benchmarks/headline_report_seeds.sh: which sweeps it starts, in which order, and where the
tables of the kept runs go (the sweep itself replaced by a stand-in that records its
arguments)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "headline_report_seeds.sh"

STAND_IN = """#!{python}
import json, pathlib, sys
args = sys.argv[1:]
with open({log!r}, "a") as f:
    f.write(json.dumps(args) + "\\n")
if "--table-only" in args:
    out = pathlib.Path(args[args.index("--out") + 1])
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text("table of " + str(out) + "\\n")
    (out / "table.json").write_text("{{}}\\n")
    sys.exit({table_exit})  # the real sweep: 1 while the table leaves runs out
"""


def _variants(args: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in args if "=conf/" in a]


def run_with_stand_in(
    tmp_path: Path, script: Path, env: dict[str, str], args: list[str], table_exit: int
) -> tuple[subprocess.CompletedProcess, list]:
    """``bash script *args`` with the stand-in as its Python (``FEDGO_PYTHON``) and ``env``
    added; the script's result and the arguments of every sweep it started."""
    log = tmp_path / "calls.jsonl"
    python = tmp_path / "python"
    python.write_text(STAND_IN.format(python=sys.executable, log=str(log), table_exit=table_exit))
    python.chmod(0o755)
    done = subprocess.run(
        ["bash", str(script), *args],
        env={**os.environ, "FEDGO_PYTHON": str(python), **env},
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    return done, calls


def _run(tmp_path: Path, table_exit: int) -> tuple[subprocess.CompletedProcess, list, Path, Path]:
    kept, out = tmp_path / "kept", tmp_path / "out"
    for alpha in ("a0.1", "a0.05"):
        (kept / alpha).mkdir(parents=True)
    args = [".cache/cifar10-jpg", str(out), "101", "102"]
    env = {"FEDGO_HEADLINE_KEPT": str(kept)}
    done, calls = run_with_stand_in(tmp_path, SCRIPT, env, args, table_exit)
    return done, calls, kept, out


def test_a_sweep_refusing_its_arguments_stops_the_script(tmp_path: Path) -> None:
    done, calls, _, _ = _run(tmp_path, table_exit=2)
    assert done.returncode == 2 and len(calls) == 3  # the first table's sweep, then no more


def test_each_seed_runs_both_alphas_then_writes_both_tables(tmp_path: Path) -> None:
    # the tables of the first seed leave the second seed's runs out: exit 1, and it goes on
    done, calls, kept, out = _run(tmp_path, table_exit=1)
    assert done.returncode == 0, done.stderr
    assert len(calls) == 8  # per seed: two sweeps, then two tables
    for seed, first in (("101", 0), ("102", 4)):
        a01, a005, t01, t005 = calls[first : first + 4]
        for call in (a01, a005, t01, t005):
            assert call[:2] == ["-m", "fedgo_app.sweep"]
            assert "data.path=.cache/cifar10-jpg" in call
            assert "resources.server_cpus=1" in call
            assert call[call.index("--baseline") + 1] == "feddf"
        assert _variants(a01) == _variants(t01) == ["fedavg", "feddf", "fedgo", "fedgo_server"]
        assert _variants(a005) == _variants(t005) == ["feddf", "fedgo_server"]
        assert a01[a01.index("--seeds") + 1] == a005[a005.index("--seeds") + 1] == seed
        assert t01[t01.index("--seeds") + 1] == t005[t005.index("--seeds") + 1] == "report"
        assert "--table-only" in t01 and "--table-only" not in a01
        for call, alpha in ((a01, "a0.1"), (a005, "a0.05"), (t01, "a0.1"), (t005, "a0.05")):
            assert call[call.index("--out") + 1] == str(out / alpha)
            assert call[call.index("--archive") + 1] == str(kept / alpha / "runs.tar.xz")
            assert ("data.alpha=0.05" in call) == (alpha == "a0.05")
        # the FedGO rows: the paper's 30 discriminator epochs; the server-referenced variant
        fedgo = next(a for a in a01 if a.startswith("fedgo="))
        assert "strategy.discriminator.epochs=30" in shlex.split(fedgo)
        server = shlex.split(next(a for a in a01 if a.startswith("fedgo_server=")))
        assert "strategy.discriminator.reference=server" in server
        assert "strategy.weighting_params={fedgo: {disc_mode: sigmoid}}" in server
    for alpha in ("a0.1", "a0.05"):
        assert (kept / alpha / "table.md").read_text() == f"table of {out / alpha}\n"
        assert (kept / alpha / "table.json").is_file()
