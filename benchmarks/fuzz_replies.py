"""The reply fuzzer's long profile: every mutation kind on every strategy and message type.

``tests/test_fuzz_replies.py`` runs a fixed-seed sample of a few cases per strategy in CI; this
runs, for every strategy found by name (:func:`strategies.available`), every mutation kind of
``tests/fuzz_replies.py`` (:data:`KINDS`) on every message type the strategy's clean run
exchanged (``--examples`` cases each, the round, client, record and key drawn with a seeded
``random.Random``), and prints what failed, by (strategy, mutation kind, message type), with
the first line of the reason (for a crash, the last line of the traceback)::

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python benchmarks/fuzz_replies.py
    PYTHONPATH=$PWD .venv/bin/python benchmarks/fuzz_replies.py --strategies fedavg,fedgo \\
        --kinds group_superscript,metric_nan --examples 3 --json /tmp/fuzz.json

``--json`` also writes every case (strategy, kind, message type, mutation, seconds, verdict,
traceback) to a file. Exit code 0 whatever was found (the findings are the output); 2 for a bug
of the fuzzer itself (an invalid tiny configuration).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import fuzz_replies as fr  # noqa: E402 - tests/ is put on the path above


def cases(
    names: list[str],
    kinds: list[str],
    examples: int,
    seed: int,
    scratch: Path,
    exhaustive: bool = False,
):
    """``(name, kind, message type, mutation, clean)`` of every case, strategy by strategy."""
    for name in names:
        clean = fr.clean_run(name, scratch)
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
    parser = argparse.ArgumentParser(prog="benchmarks/fuzz_replies.py")
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
    args = parser.parse_args(argv)
    names = [n for n in args.strategies.split(",") if n] or fr.strategy_names()
    kinds = [k for k in args.kinds.split(",") if k] or list(fr.KINDS)
    unknown = [k for k in kinds if k not in fr.KINDS]
    if unknown:
        parser.error(f"unknown kinds {unknown}; known: {', '.join(fr.KINDS)}")
    scratch = Path(tempfile.mkdtemp(prefix="fuzz-replies-"))
    records: list[dict] = []
    failures: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    t_start = time.perf_counter()
    try:
        for name, kind, mtype, mutation, clean in cases(
            names, kinds, args.examples, args.seed, scratch, args.exhaustive
        ):
            if args.list:
                print(f"  {mutation.describe()}")
                continue
            out = Path(tempfile.mkdtemp(dir=scratch))
            outcome = fr.run_case(name, out / "run", mutation)
            shutil.rmtree(out, ignore_errors=True)
            reason = fr.verdict(name, mutation, outcome, clean)
            status = "ok" if reason is None else "FAIL"
            line = fr.first_line(reason) if reason else ""
            print(
                f"  {status:4s} {outcome.seconds:5.1f}s {mutation.describe()}"
                + (f"\n         {line}" if line else ""),
                flush=True,
            )
            if reason is not None:
                failures[(name, kind, mtype)].append(line)
            records.append(
                {
                    "strategy": name,
                    "kind": kind,
                    "message_type": mtype,
                    "mutation": mutation.describe(),
                    "replay": replay_fields(mutation),
                    "seconds": outcome.seconds,
                    "applied": bool(outcome.applied),
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
    by_strategy = Counter(r["strategy"] for r in records if r["failure"])
    for name in names:
        n = sum(r["strategy"] == name for r in records)
        print(f"  {name:18s} {n:4d} cases, {by_strategy.get(name, 0):4d} failing")
    print()
    print("failures by (strategy, mutation kind, message type) -> first line:")
    for (name, kind, mtype), lines in sorted(failures.items()):
        for line, count in Counter(lines).most_common():
            times = f" (x{count})" if count > 1 else ""
            print(f"  {name:16s} {kind:18s} {mtype:20s} {line}{times}")
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
