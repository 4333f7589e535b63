"""A benchmark as a short spec: its config, its methods and their overrides, its seeds, how one
run goes, its table; :class:`Bench` runs a spec with a command line (``python -m benchmarks run
NAME ...``, :mod:`benchmarks.__main__`).

A **method** is one variant of the spec's config (``spec.overrides(method)``: its k=v words);
``spec.methods(args)`` lists those a command line asks for, in the order a seed's runs go in.
Each (seed, method) is one run, named ``<method>-seed<N>``, into ``<scratch>/<name>/``
(default ``outputs/bench/<tag>/``), with the overrides, in this order: ``data.path`` (a config
on the CIFAR-10 JPEG tree, ``imagefolder``), ``seed``, ``resume=true`` (an interrupted run
continues from its checkpoint), the command line's ``k=v`` words, those the spec's own options
set (``spec.common(args)``), the method's (which win over those), what ``spec.reuse`` adds
(another run's files, e.g. ``strategy.teachers_from``), and ``output_dir`` last.
``spec.runner`` says how a run starts: ``"child"`` (the default) is
:func:`fedgo_app.inprocess.run_inprocess` in a process of its own (``python -m benchmarks
--child CONFIG k=v ...``), ``"run.sh"`` a Flower simulation through ``./run.sh``.

The runs go through :func:`benchmarks.sweep.run_grid` (the child-run engine,
:mod:`fedgo_app.sweep.engine`): a seed's methods before the next seed's, a run kept in the
results folder (default ``benchmarks/results/<tag>/``, its ``runs.tar.xz``) skipped, so a
second call runs nothing; ``--jobs N`` runs N at once (a run whose ``spec.after(method)`` names
another method waits for that method's run of its seed); a failed run is reported and the
others go on; ``--stop-after S`` starts no run after S seconds. Every method's config is loaded
first (``spec.check``, by default a load of each), so a bad key stops the sweep before any run.
The table (``spec.table(bench)``) is rebuilt from the kept runs only, so ``python -m benchmarks
table NAME`` makes the committed table again from its archive.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.sweep import (
    ROOT,
    add_data_arguments,
    child_command,
    ensure_data,
    load_config,
    parse_with_overrides,
    run_child,
    run_grid,
    run_name,
    write_table,
)

SCRATCH = "outputs/bench"
"""Where runs write, relative to the repository: ``<SCRATCH>/<tag>/<method>-seed<N>/``."""
RESULTS = "benchmarks/results"
"""Where results folders are by default, relative to the repository: ``<RESULTS>/<tag>/``."""


@dataclass(frozen=True)
class Spec:
    """One benchmark (see the module's doc).

    ``methods(args)``: the methods to run, in a seed's run order (``ValueError``: a bad option);
    ``overrides(method)``: the method's k=v words; ``table(bench)``: the table's text from the
    runs kept in ``bench.results`` (or ``{results folder: text}`` for several);
    ``options(parser)``: the spec's own options; ``common(args)``: the overrides those options
    set for every run;
    ``after(method)``: the method whose run of the same seed must be over first;
    ``reuse(bench, method, seed)``: overrides after the method's (another run's files);
    ``prepare(bench, method, seed)``: called before a run starts (``RunFailed``: it does not);
    ``check(bench, methods)``: every config checked before any run (returns the dataset's name);
    ``validate(args)``: what is wrong with the spec's options (``None``: nothing);
    ``run(bench)``: a spec that drives other specs itself (its exit status)."""

    name: str
    summary: str
    config: str
    tag: str
    methods: Callable[[argparse.Namespace], list[str]]
    overrides: Callable[[str], list[str]]
    table: Callable[[Bench], str | dict[Path, str]]
    seeds: tuple[int, ...] = (0, 1, 2)
    runner: str = "child"
    table_file: str = "table.md"
    results: str = RESULTS
    options: Callable[[argparse.ArgumentParser], None] | None = None
    common: Callable[[argparse.Namespace], list[str]] | None = None
    after: Callable[[str], str | None] | None = None
    reuse: Callable[[Bench, str, int], list[str]] | None = None
    prepare: Callable[[Bench, str, int], None] | None = None
    check: Callable[[Bench, Sequence[str]], str] | None = None
    validate: Callable[[argparse.Namespace], str | None] | None = None
    run: Callable[[Bench], int] | None = None

    def parser(self) -> argparse.ArgumentParser:
        """The options of ``run NAME`` and ``table NAME``: the common ones, then the spec's."""
        p = argparse.ArgumentParser(
            prog=f"python -m benchmarks run|table {self.name}",
            description=self.summary,
            epilog="k=v words: config overrides for every run",
            allow_abbrev=False,
        )
        p.add_argument("--config", default=self.config, help=f"(default {self.config})")
        p.add_argument("--seeds", nargs="+", type=int, default=list(self.seeds))
        p.add_argument("--tag", default=self.tag, help=f"results folder name (default {self.tag})")
        p.add_argument("--out", type=Path, help=f"results folder (default {self.results}/TAG)")
        p.add_argument("--scratch", type=Path, help=f"runs' folder (default {SCRATCH}/TAG)")
        p.add_argument("--jobs", type=int, default=1, help="runs at once (default 1)")
        p.add_argument(
            "--stop-after",
            type=float,
            metavar="S",
            help="start no run after S seconds (those under way finish and are kept)",
        )
        add_data_arguments(p)
        if self.options is not None:
            self.options(p)
        return p

    def bench(self, argv: Sequence[str] = ()) -> Bench:
        """This spec with a command line (argparse's exit 2 for a bad option)."""
        parser = self.parser()
        args = parse_with_overrides(parser, argv)
        if args.jobs < 1:
            parser.error("--jobs: at least 1")
        if args.stop_after is not None and not args.stop_after >= 0:
            parser.error("--stop-after: seconds >= 0")
        problem = None if self.validate is None else self.validate(args)
        if problem is not None:
            parser.error(problem)
        return Bench(self, args)


class Bench:
    """A spec with its command line: where its runs and results go, each run's overrides and
    command, the sweep and the table."""

    def __init__(self, spec: Spec, args: argparse.Namespace) -> None:
        self.spec, self.args = spec, args
        self.results = ROOT / (args.out or Path(spec.results) / args.tag)
        self.scratch = ROOT / (args.scratch or Path(SCRATCH) / args.tag)
        self.data: Path | None = None  # the JPEG tree, for a config on imagefolder (sweep)

    def methods(self) -> list[str]:
        return self.spec.methods(self.args)

    def run_dir(self, method: str, seed: int) -> Path:
        return self.scratch / run_name(method, seed)

    def overrides(self, method: str, seed: int) -> list[str]:
        """Every override of one run (the order is the module doc's)."""
        common = [] if self.spec.common is None else self.spec.common(self.args)
        reuse = [] if self.spec.reuse is None else self.spec.reuse(self, method, seed)
        return [
            *([f"data.path={self.data}"] if self.data is not None else []),
            f"seed={seed}",
            "resume=true",
            *self.args.overrides,
            *common,
            *self.spec.overrides(method),
            *reuse,
            f"output_dir={self.run_dir(method, seed)}",
        ]

    def command(self, method: str, seed: int) -> list[str]:
        """The process of one run: ``./run.sh`` or the in-process runner (``--child``)."""
        overrides = self.overrides(method, seed)
        if self.spec.runner == "run.sh":
            return [str(ROOT / "run.sh"), self.args.config, *overrides]
        return child_command("benchmarks", self.args.config, overrides)

    def execute(self, method: str, seed: int) -> Path:
        """One run in its own process; its folder (``RunFailed`` with its log's tail)."""
        return run_child(
            self.command(method, seed), self.run_dir(method, seed), run_name(method, seed)
        )

    def run_one(self, method: str, seed: int) -> Path:
        """One run after what it needs is in place (``spec.prepare``); its folder."""
        if self.spec.prepare is not None:
            self.spec.prepare(self, method, seed)
        return self.execute(method, seed)

    def check(self, methods: Sequence[str]) -> str:
        """Load every method's config (``SystemExit`` naming the method and the bad key);
        the dataset's name."""
        if self.spec.check is not None:
            return self.spec.check(self, methods)
        dataset = ""
        for method in methods:
            common = [] if self.spec.common is None else self.spec.common(self.args)
            words = [*self.args.overrides, *common, *self.spec.overrides(method)]
            try:
                cfg = load_config(self.args.config, words)
            except Exception as exc:  # noqa: BLE001 - reported with the method it concerns
                sys.exit(f"{method}: {exc}")
            dataset = cfg.data.dataset
        return dataset

    def sweep(self, methods: Sequence[str] | None = None) -> list[str]:
        """Run every (seed, method) not kept yet; the failures' first lines."""
        start = time.monotonic()
        methods = self.methods() if methods is None else list(methods)
        if self.check(methods) == "imagefolder":
            # absolute for the runs; kept records name it relative to the repository again
            self.data = ensure_data(ROOT / self.args.data, self.args.archive)
        stop_at = None if self.args.stop_after is None else start + self.args.stop_after
        return run_grid(
            methods,
            self.args.seeds,
            self.run_one,
            self.results,
            jobs=self.args.jobs,
            after=self.spec.after,
            stop_at=stop_at,
        )

    def table(self) -> None:
        """Write the table of the kept runs into the results folder (and print it); a spec
        whose ``table`` returns ``{folder: text}`` has one table per results folder."""
        tables = self.spec.table(self)
        if isinstance(tables, str):
            tables = {self.results: tables}
        for folder, text in tables.items():
            write_table(folder, text, self.spec.table_file)
