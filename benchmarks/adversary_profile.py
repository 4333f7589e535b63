"""The adaptive adversary's long profile: every strategy x applicable kind x {once, every}.

``tests/integration/test_adversary_profile.py`` runs a fixed sample in CI; this runs, for every
strategy found by name (:func:`strategies.available`, and :data:`benchmarks.adversary.VARIANTS`),
every attack kind of :mod:`benchmarks.adversary` that applies to it, once and in every round,
judged against the strategy's clean run of the same seed (:func:`benchmarks.adversary.verdict`),
plus the yardstick run in which the attacker's model replies are withheld. It prints each case,
then per strategy: cases run, freezes, the largest accuracy drop below clean, the failures (known
ones, :data:`benchmarks.adversary.KNOWN_FAILURES`, marked), the kinds skipped and why, and a
markdown table::

    PYTHONPATH=$PWD nice -n 10 .venv/bin/python -m benchmarks.adversary_profile
    PYTHONPATH=$PWD .venv/bin/python -m benchmarks.adversary_profile --strategies fedavg,scaffold \\
        --kinds sign_flip,upload_scaled --json /tmp/adversary.json --markdown /tmp/table.md

Exit code 0 whatever was found (the findings are the output).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from benchmarks import adversary as adv
from fedgo_flwr.runtime.fileio import atomic_write_text


def profile(names: list[str], kinds: list[str], modes: list[str], seed: int) -> list[adv.Case]:
    cases: list[adv.Case] = []
    for name in names:
        base = adv.clean(name, seed)
        who = "no client" if base.node is None else f"attacker client {base.node - 2}"
        print(
            f"[{name}] clean: final accuracy {base.accuracy:.4f}, {who}, {base.seconds:.1f}s",
            flush=True,
        )
        for kind in [adv.WITHHOLD, *kinds]:
            for mode in ["every"] if kind == adv.WITHHOLD else modes:
                case = adv.run_case(name, kind, mode, seed)
                cases.append(case)
                print(f"  {line(case)}", flush=True)
    return cases


def line(case: adv.Case) -> str:
    head = f"{case.kind:<18} {case.mode:<5}"
    if case.skipped:
        return f"{head} skipped: {case.skipped}"
    drop = f"{case.drop:+.4f}" if case.drop is not None else "n/a"
    verdict = "ok" if case.failure is None else ("KNOWN " if case.known else "FAIL ") + case.failure
    return (
        f"{head} acc {case.accuracy} (drop {drop}) applied {','.join(case.applied)} "
        f"clipped {case.clipped} rolled back {case.rolled_back} warnings naming it "
        f"{case.named} {case.seconds:.1f}s: {verdict}"
    )


@dataclasses.dataclass
class Summary:
    name: str
    clean: float | None
    withheld: float | None = None  # the yardstick's drop
    cases: int = 0
    freezes: int = 0
    worst: float | None = None
    worst_case: str = ""
    failures: list[str] = dataclasses.field(default_factory=list)
    beyond: list[str] = dataclasses.field(default_factory=list)  # worse than withheld - MARGIN
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)


def summarise(cases: list[adv.Case]) -> list[Summary]:
    """Per strategy; a failure is also listed in ``beyond`` where its accuracy is more than
    MARGIN below the withheld run's too (what losing the attacker altogether costs)."""
    out: dict[str, Summary] = {}
    withheld = {c.case_id: c.accuracy for c in cases if c.kind == adv.WITHHOLD}
    for c in cases:
        s = out.setdefault(c.case_id, Summary(c.case_id, c.clean_accuracy))
        if c.kind == adv.WITHHOLD:
            s.withheld = c.drop
            continue
        if c.skipped:
            s.skipped[f"{c.kind}/every" if "'every' is 'once'" in c.skipped else c.kind] = c.skipped
            continue
        s.cases += 1
        s.freezes += c.froze is not None
        if c.drop is not None and (s.worst is None or c.drop > s.worst):
            s.worst, s.worst_case = c.drop, f"{c.kind}/{c.mode}"
        if c.failure:
            label = f"{c.kind}/{c.mode}{'' if c.known else ' (NEW)'}"
            s.failures.append(label)
            ref = withheld.get(c.case_id)
            if c.accuracy is None or ref is None or c.accuracy < ref - adv.MARGIN or c.froze:
                s.beyond.append(label)
    return list(out.values())


def markdown(summaries: list[Summary]) -> str:
    def f(x: float | None) -> str:
        return "n/a" if x is None else f"{x:+.3f}"

    rows = [
        "| strategy | clean acc | withheld drop | cases | freezes | largest drop (case) | "
        "failures (vs clean) | of which also vs withheld | skipped |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        clean = "n/a" if s.clean is None else f"{s.clean:.3f}"
        skipped = "; ".join(f"{k}: {v}" for k, v in s.skipped.items()) or "-"
        worst = f"{f(s.worst)} ({s.worst_case})" if s.worst_case else "n/a"
        rows.append(
            f"| {s.name} | {clean} | {f(s.withheld)} | {s.cases} | {s.freezes} | {worst} | "
            f"{', '.join(s.failures) or '-'} | {', '.join(s.beyond) or '-'} | {skipped} |"
        )
    return "\n".join(rows) + "\n"


def case_table(cases: list[adv.Case]) -> str:
    """Every case that ran: its accuracy, drop below clean and verdict."""
    rows = [
        "| strategy | kind | mode | accuracy | drop below clean | clipped | rolled back "
        "| verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        if c.skipped:
            continue
        acc = "n/a" if c.accuracy is None else f"{c.accuracy:.3f}"
        drop = "n/a" if c.drop is None else f"{c.drop:+.3f}"
        if c.kind == adv.WITHHOLD:
            verdict = "yardstick"
        elif c.failure is None:
            verdict = "ok"
        else:
            verdict = ("known: " if c.known else "FAIL: ") + c.failure.split(" (margin")[0]
        rows.append(
            f"| {c.case_id} | {c.kind} | {c.mode} | {acc} | {drop} | {c.clipped} | "
            f"{c.rolled_back} | {verdict} |"
        )
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strategies", default="", help="comma-separated (default: all)")
    ap.add_argument("--kinds", default="", help="comma-separated (default: all)")
    ap.add_argument("--modes", default="once,every")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override for every run, clean and attacked (e.g. the robust rules)",
    )
    ap.add_argument("--json", type=Path, help="write every case here")
    ap.add_argument("--markdown", type=Path, help="write the table here")
    ap.add_argument(
        "--merge", type=Path, nargs="+", help="run nothing: summarise these --json files"
    )
    args = ap.parse_args(argv)
    if args.merge:
        fields = {f.name for f in dataclasses.fields(adv.Case)}
        cases = [
            adv.Case(**{k: v for k, v in row.items() if k in fields})
            for path in args.merge
            for row in json.loads(path.read_text())
        ]
        for c in cases:  # judged by this checkout's list of known failures
            c.known = adv.KNOWN_FAILURES.get((c.case_id, c.kind, c.mode)) if c.failure else None
        return report(cases, args, 0.0)
    names = args.strategies.split(",") if args.strategies else adv.strategy_names()
    kinds = args.kinds.split(",") if args.kinds else list(adv.KINDS)
    modes = args.modes.split(",")
    unknown = [n for n in names if n not in adv.strategy_names()]
    unknown += [k for k in kinds if k not in adv.KINDS] + [m for m in modes if m not in adv.MODES]
    if unknown:
        ap.error(f"unknown strategies, kinds or modes: {unknown}")
    adv.EXTRA[:] = args.set
    t0 = time.perf_counter()
    cases = profile(names, kinds, modes, args.seed)
    return report(cases, args, time.perf_counter() - t0)


def report(cases: list[adv.Case], args: argparse.Namespace, seconds: float) -> int:
    summaries = summarise(cases)
    print(f"\nmargin {adv.MARGIN}; {seconds:.0f}s in all")
    for s in summaries:
        print(
            f"{s.name}: {s.cases} cases, {s.freezes} freezes, largest drop below clean "
            f"{s.worst if s.worst is None else round(s.worst, 4)} ({s.worst_case}), "
            f"failures: {', '.join(s.failures) or 'none'}; also below the withheld run: "
            f"{', '.join(s.beyond) or 'none'}"
        )
        for kind, why in s.skipped.items():
            print(f"    skipped {kind}: {why}")
    table = markdown(summaries)
    print("\n" + table)
    if args.markdown:
        atomic_write_text(args.markdown, f"{table}\n## Every case\n\n{case_table(cases)}")
    if args.json:
        rows = [{**dataclasses.asdict(c), "drop": c.drop} for c in cases]
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
