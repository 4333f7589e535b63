"""Does a run repeat exactly? The same config run twice with ``resources.deterministic`` off
and twice with it on (:func:`fedgo_flwr.runtime.kernels.use_deterministic`).

Each run is its own process (``python -m fedgo_app.inprocess``), one after another, so
the pairs see the same machine. A pair repeats when every row of ``metrics.jsonl`` is equal
without its wall-clock keys; otherwise the table gives the largest difference in test
accuracy and test loss over the rows. The operations PyTorch has no deterministic kernel for
on the device (its "does not have a deterministic implementation" warnings) are listed, and
the runs' wall times compared (the deterministic kernels' cost). On a CPU both pairs repeat;
the question is a GPU's (cuDNN's default convolution algorithms are not deterministic).

    python -m benchmarks.determinism [--config conf/bench/coboosting-cifar10-cpu.yaml] \\
        [--out benchmarks/results/determinism] [k=v ...]

Writes ``table.md`` and ``summary.json`` (per run: wall time, final accuracy, the warnings)
in ``--out``; the runs' own folders go to ``outputs/determinism/``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.sweep import RunFailed, run_command

ROOT = Path(__file__).resolve().parents[1]
SCRATCH = ROOT / "outputs" / "determinism"
WARNING = re.compile(r"(\w+) does not have a deterministic implementation")


def rows(run_dir: Path) -> list[dict]:
    """The run's metrics rows without wall-clock keys (``elapsed`` and every ``*time*``)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [
        {k: v for k, v in json.loads(x).items() if k != "elapsed" and "time" not in k}
        for x in lines
    ]


def largest_difference(a: list[dict], b: list[dict], key: str) -> float | None:
    """The largest ``|a - b|`` of ``key`` over the rows both have (None: in neither)."""
    pairs = [(x[key], y[key]) for x, y in zip(a, b, strict=False) if key in x and key in y]
    return max((abs(x - y) for x, y in pairs), default=None)


def run_once(config: str, overrides: Sequence[str], out: Path) -> dict:
    """One run in its own process (:func:`benchmarks.sweep.run_command`, its output in
    ``out/run.log``): wall time, final accuracy and the operations warned of."""
    cmd = [sys.executable, "-m", "fedgo_app.inprocess", config, *overrides,
           f"output_dir={out}", "overwrite=true"]  # fmt: skip
    log = out / "run.log"
    log.unlink(missing_ok=True)  # the warnings read below are this run's
    wall = run_command(cmd, log)
    summary = json.loads((out / "summary.json").read_text())
    ops = sorted(set(WARNING.findall(log.read_text())))
    return {"wall_s": round(wall, 2), "final_accuracy": summary["final_accuracy"], "warned": ops}


def compare(first: Path, second: Path) -> dict:
    a, b = rows(first), rows(second)
    return {
        "repeats": a == b,
        "test_accuracy": largest_difference(a, b, "test_accuracy"),
        "test_loss": largest_difference(a, b, "test_loss"),
    }


def _number(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def table(config: str, overrides: Sequence[str], result: dict) -> str:
    lines = [
        f"# Does a run repeat exactly? `{config}` {' '.join(overrides)}".rstrip(),
        "",
        "Two runs per setting, one after another, each its own process "
        "(`benchmarks/determinism.py`).",
        "",
        "| resources.deterministic | repeats | largest difference, test accuracy | "
        "test loss | wall s (run 1, run 2) | ops without a deterministic kernel |",
        "|---|---|---|---|---|---|",
    ]
    for setting in ("false", "true"):
        r = result[setting]
        walls = ", ".join(f"{x['wall_s']:.1f}" for x in r["runs"])
        ops = ", ".join(sorted({o for x in r["runs"] for o in x["warned"]})) or "-"
        diff = r["compare"]
        acc, loss = (_number(diff[k]) for k in ("test_accuracy", "test_loss"))
        repeats = "yes" if diff["repeats"] else "no"
        lines.append(f"| {setting} | {repeats} | {acc} | {loss} | {walls} | {ops} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="conf/bench/coboosting-cifar10-cpu.yaml")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/determinism")
    parser.add_argument("overrides", nargs="*", help="k=v config overrides for every run")
    args = parser.parse_args(argv)
    if any(o.split("=", 1)[0] == "resources.deterministic" for o in args.overrides):
        parser.error("resources.deterministic is what this compares: leave it out")
    result = {}
    for setting in ("false", "true"):
        dirs = [SCRATCH / f"{setting}-{i}" for i in (1, 2)]
        overrides = [*args.overrides, f"resources.deterministic={setting}"]
        try:
            runs = [run_once(args.config, overrides, d) for d in dirs]
        except RunFailed as exc:
            sys.exit(str(exc))
        result[setting] = {"runs": runs, "compare": compare(*dirs)}
        print(f"determinism: {setting}: {result[setting]}", file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    payload = {"config": args.config, "overrides": args.overrides, **result}
    (args.out / "summary.json").write_text(json.dumps(payload, indent=1) + "\n")
    text = table(args.config, args.overrides, result)
    (args.out / "table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
