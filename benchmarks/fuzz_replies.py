"""The reply fuzzer's long profile: every mutation kind on every strategy and message type.

``tests/integration/test_fuzz_replies.py`` runs a fixed-seed sample of a few cases per strategy
in CI; this runs, for every strategy found by name (:func:`strategies.available`), every
mutation kind of
``fedgo_app/fuzz`` (:data:`KINDS`) on every message type the strategy's clean run
exchanged (``--examples`` cases each, the round, client, record and key drawn with a seeded
``random.Random``), once with the strategy's defaults and once with the robust options
(``--mode``), and prints what failed, by (mode, strategy, mutation kind, message type), with
the first line of the reason (for a crash, the last line of the traceback), then per mode how
many mutated replies were dropped and kept, and how far the final accuracy moved::

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python -m benchmarks.fuzz_replies
    PYTHONPATH=$PWD .venv/bin/python -m benchmarks.fuzz_replies --strategies fedavg,fedgo \\
        --kinds group_superscript,metric_nan --examples 3 --json /tmp/fuzz.json

``--json`` also writes every case (strategy, kind, message type, mutation, seconds, verdict,
traceback) to a file. Exit code 0 whatever was found (the findings are the output); 2 for a bug
of the fuzzer itself (an invalid tiny configuration).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from fedgo_app import fuzz as fr


def cases(
    names: list[str],
    kinds: list[str],
    examples: int,
    seed: int,
    scratch: Path,
    exhaustive: bool = False,
    robust: bool = False,
):
    """``(name, kind, message type, mutation, clean)`` of every case, strategy by strategy.
    Both modes draw from the robust clean run's replies (the options change how replies are
    combined, not which are asked for); the defaults' verdict does not read its accuracy."""
    for name in names:
        clean = fr.clean_run(name, scratch, robust=True)
        if not robust:
            clean = dataclasses.replace(clean, robust=False)
        types = sorted({t.message_type for t in clean.targets})
        if not types:
            print(f"[{name}] exchanges no messages with clients: nothing to fuzz", flush=True)
            continue
        print(
            f"[{name}] clean run {clean.outcome.seconds:.1f}s, final accuracy "
            f"{clean.outcome.accuracy:.4f}, message types {types}",
            flush=True,
        )
        for kind in kinds:
            for mtype in types:
                targets = [
                    t for t in clean.targets if t.message_type == mtype and fr.applicable(kind, t)
                ]
                if not targets:
                    continue
                for i in range(examples):
                    rng = random.Random(f"{seed}/{name}/{kind}/{mtype}/{i}")
                    target = rng.choice(targets)
                    if exhaustive:
                        for mutation in variants(kind, target, rng, clean.others(target)):
                            yield name, kind, mtype, mutation, clean
                    else:
                        mutation = fr.choose(kind, target, rng.choice, clean.others(target))
                        yield name, kind, mtype, mutation, clean


def variants(kind: str, target: fr.Target, rng: random.Random, others: list[int]):
    """``--exhaustive``: every metric key for the scalar kinds (each key is read by other code),
    every record for the array kinds (a random key in it), one case for the others."""
    slots = target.slots
    scalars = [s for s in slots if s.kind in ("metric", "config")]
    if kind == "metric_string":  # the whole record becomes a ConfigRecord: one case
        yield fr.choose(kind, target, rng.choice, others)
        return
    if kind.startswith("metric_") or kind == "missing_key":
        for slot in scalars:
            for key in slot.keys:
                yield fr.Mutation(target, kind, slot.name, key)
        if kind == "missing_key":
            for slot in slots:
                if slot.kind == "array" and slot.keys:
                    yield fr.Mutation(target, kind, slot.name, rng.choice(slot.keys))
        return
    per_record = {
        "array": lambda s: bool(s.float_keys),
        "scale": lambda s: bool(s.float_keys),
        "dtype": lambda s: s.kind == "array" and bool(s.keys),
        "shape": lambda s: s.kind == "array" and bool(s.keys),
    }.get(kind.split("_")[0])
    if per_record is None and kind not in ("extra_key", "missing_record"):
        yield fr.choose(kind, target, rng.choice, others)
        return
    for slot in slots:
        if per_record is not None and not per_record(slot):
            continue

        def pick(options, _slot=slot):
            # the record is this one; any other choice is random
            return _slot.name if _slot.name in options else rng.choice(options)

        yield fr.choose(kind, target, pick, others)


def replay_fields(mutation: fr.Mutation) -> dict:
    """The mutation as ``fuzz_replies.replay`` takes it (``KNOWN_FAILURES``' cases)."""
    out: dict = {"reply": mutation.target.label()}
    for key, default in (("record", None), ("key", None), ("whole", True), ("other", "")):
        value = getattr(mutation, key)
        if value != default:
            out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fuzz_replies")
    parser.add_argument("--strategies", default="", help="comma-separated (default: all)")
    parser.add_argument("--kinds", default="", help="comma-separated (default: all)")
    parser.add_argument("--examples", type=int, default=1, help="cases per kind x message type")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default="", help="write every case here")
    parser.add_argument(
        "--exhaustive",
        action="store_true",
        help="every metric key (scalar kinds) and every record (array kinds) of the drawn reply",
    )
    parser.add_argument("--list", action="store_true", help="print the cases, run none")
    parser.add_argument(
        "--mode",
        choices=("default", "robust", "both"),
        default="both",
        help="the strategies' defaults, the robust options (fuzz_replies.ROBUST), or both",
    )
    args = parser.parse_args(argv)
    names = [n for n in args.strategies.split(",") if n] or fr.strategy_names()
    kinds = [k for k in args.kinds.split(",") if k] or list(fr.KINDS)
    unknown = [k for k in kinds if k not in fr.KINDS]
    if unknown:
        parser.error(f"unknown kinds {unknown}; known: {', '.join(fr.KINDS)}")
    modes = ["default", "robust"] if args.mode == "both" else [args.mode]
    scratch = Path(tempfile.mkdtemp(prefix="fuzz-replies-"))
    records: list[dict] = []
    failures: dict[tuple[str, str, str, str], list[str]] = defaultdict(list)
    t_start = time.perf_counter()
    try:
        for mode in modes:
            print(f"== {mode} options", flush=True)
            for name, kind, mtype, mutation, clean in cases(
                names, kinds, args.examples, args.seed, scratch, args.exhaustive, mode == "robust"
            ):
                if args.list:
                    print(f"  {mutation.describe()}")
                    continue
                out = Path(tempfile.mkdtemp(dir=scratch))
                outcome = fr.run_case(name, out / "run", mutation, robust=clean.robust)
                shutil.rmtree(out, ignore_errors=True)
                reason = fr.judge(name, mutation, outcome, clean, scratch)
                status = "ok" if reason is None else "FAIL"
                line = fr.first_line(reason) if reason else ""
                print(
                    f"  {status:4s} {outcome.seconds:5.1f}s {mutation.describe()}"
                    + (f"\n         {line}" if line else ""),
                    flush=True,
                )
                if reason is not None:
                    failures[(mode, name, kind, mtype)].append(line)
                records.append(
                    {
                        "mode": mode,
                        "strategy": name,
                        "kind": kind,
                        "message_type": mtype,
                        "mutation": mutation.describe(),
                        "replay": replay_fields(mutation),
                        "seconds": outcome.seconds,
                        "applied": bool(outcome.applied),
                        "dropped": bool(outcome.applied) and fr.dropped(mutation, outcome, clean),
                        "accuracy": outcome.accuracy,
                        "clean_accuracy": clean.outcome.accuracy,
                        "failure": reason,
                    }
                )
    except fr.FuzzerBug as exc:
        print(f"fuzzer bug: {exc}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    elapsed = time.perf_counter() - t_start
    print()
    print(
        f"cases run: {len(records)} in {elapsed:.0f}s; failing cases: "
        f"{sum(r['failure'] is not None for r in records)}"
    )
    for mode in modes:
        print(f"\n{mode} options:")
        print(summary(mode, names, [r for r in records if r["mode"] == mode]))
    print()
    print("failures by (mode, strategy, mutation kind, message type) -> first line:")
    for (mode, name, kind, mtype), lines in sorted(failures.items()):
        for line, count in Counter(lines).most_common():
            times = f" (x{count})" if count > 1 else ""
            print(f"  {mode:7s} {name:16s} {kind:18s} {mtype:20s} {line}{times}")
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
    return 0


def summary(mode: str, names: list[str], records: list[dict]) -> str:
    """Per strategy: cases, failing, mutated replies dropped / kept (of those that came), and
    the largest drop of the final accuracy below the clean run's, over all cases and over the
    kept ones."""
    lines = [
        f"  {'strategy':18s} {'cases':>5s} {'fail':>4s} {'drop':>4s} {'kept':>4s} "
        f"{'max drop':>8s} {'kept: max drop':>14s}"
    ]

    def worst(rs: list[dict]) -> str:
        drops = [
            r["clean_accuracy"] - r["accuracy"]
            for r in rs
            if r["accuracy"] is not None and r["clean_accuracy"] is not None
        ]
        return f"{max(drops):+.4f}" if drops else "-"

    for name in [*names, "all"]:
        rs = [r for r in records if name in ("all", r["strategy"])]
        if not rs:
            continue
        came = [r for r in rs if r["applied"]]
        kept = [r for r in came if not r["dropped"]]
        lines.append(
            f"  {name:18s} {len(rs):5d} {sum(r['failure'] is not None for r in rs):4d} "
            f"{len(came) - len(kept):4d} {len(kept):4d} {worst(came):>8s} {worst(kept):>14s}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
