"""The Co-Boosting benchmark driver (``benchmarks/coboosting_table1.py``): grid, sweep, tables.

The grid's order and overrides are checked on the presets' real configs; the sweep's handling
of reused uploads (a source that failed, one whose scratch folder was cleaned, one whose kept
record no longer matches) runs with a stand-in for the subprocess that writes genuine
``client_models.pt`` headers; the tables are built from hand-made records whose figures a
wrong mean, sd, seed count or column would change. One real tiny sweep runs on digits
(``test_real_*``), its runs in this process through the children's own entry
(:func:`in_process_runs`): a subprocess start costs more than a tiny run, and the subprocess
path itself is the shared ``benchmarks/sweep.py``'s, run for real in ``test_benchmark_cpfl.py``.
The driver is a spec (``benchmarks.coboosting_table1.SPEC``, :mod:`benchmarks.spec`): a sweep
here is its :class:`~benchmarks.spec.Bench` with a command line, through the engine's grid.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from benchmark_scripts import load_benchmark

DIGITS = "conf/bench/coboosting-digits.yaml"
# The sweep keeps a finished run in the results' archive: read and dropped through these.
Kept, forget = load_benchmark("sweep").Kept, load_benchmark("sweep").forget
run_grid = load_benchmark("sweep").run_grid


def bench_of(driver, tmp_path: Path, *argv: str):
    """The spec with a command line, its runs in ``tmp_path/scratch/t`` and its results in
    ``tmp_path/results``."""
    where = ["--scratch", str(tmp_path / "scratch" / "t"), "--out", str(tmp_path / "results")]
    return driver.SPEC.bench([*where, *argv])


def in_process_runs(monkeypatch) -> None:
    """``benchmarks/sweep.py``'s ``run_command`` replaced by the run it starts (``python -m
    DRIVER --child CONFIG k=v ...``, :func:`benchmarks.sweep.child`) in this process, with
    Flower's log of the run appended to its ``run.log`` as the subprocess's output would be;
    everything around it (``run_child``'s checks, the driver's reuse of uploads) unchanged."""
    sweep = load_benchmark("sweep")

    def run_command(cmd, log, *, root=None, env=None, label=None) -> float:
        log.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(log)
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        logger = logging.getLogger("flwr")
        logger.addHandler(handler)
        try:
            sweep.child(cmd[cmd.index("--child") + 1 :])
        finally:
            logger.removeHandler(handler)
            handler.close()
        return 0.0

    monkeypatch.setattr(sweep, "run_command", run_command)


@pytest.fixture(scope="module")
def driver():
    return load_benchmark("coboosting_table1")


# -- the grid ------------------------------------------------------------------------------

ABLATION_RUNS = [
    "abl-none",
    "abl-ghs",
    "abl-dhs",
    "abl-ee",
    "abl-ghs_dhs",
    "abl-ghs_ee",
    "abl-dhs_ee",
]
LAST = ["feddf", "coboosting_fedgo", "coboosting_fedgo_odds"]


def test_grid_runs_every_source_before_the_runs_that_reuse_its_uploads(driver) -> None:
    grid = driver.method_grid([0.05, 0.1], [0.05])
    assert grid == [
        *(f"a0.05-{m}" for m in ["oneshot", "dense", "coboosting", *ABLATION_RUNS, *LAST]),
        *(f"a0.1-{m}" for m in ["oneshot", "dense", "coboosting", *LAST]),
    ]
    sources = {m: driver.source_method(m) for m in grid}
    assert sources["a0.1-dense"] == "a0.1-oneshot"
    assert sources["a0.05-abl-dhs_ee"] == "a0.05-oneshot"
    assert sources["a0.1-coboosting_fedgo_odds"] == "a0.1-coboosting_fedgo"
    assert [m for m, s in sources.items() if s is None] == [
        f"a{a}-{m}" for a in ("0.05", "0.1") for m in ("oneshot", "feddf", "coboosting_fedgo")
    ]
    for method, source in sources.items():
        if source is not None:
            assert grid.index(source) < grid.index(method)
    # The ablation only where asked, and only for alphas of the grid.
    assert driver.method_grid([0.3], []) == [
        f"a0.3-{m}" for m in ["oneshot", "dense", "coboosting", *LAST]
    ]
    assert driver.method_grid([0.3], [0.05]) == driver.method_grid([0.3])
    assert driver.parse_method("a0.05-abl-ghs_ee") == (0.05, "abl-ghs_ee")
    with pytest.raises(ValueError, match="a<alpha>-<method>"):
        driver.parse_method("coboosting")
    with pytest.raises(ValueError, match="unknown method"):
        driver.method_overrides("a0.1-fedavg")


def test_methods_choose_the_runs_and_bring_the_sources_they_reuse(driver) -> None:
    assert driver.method_grid([0.1], [], ["coboosting_sign"]) == [
        "a0.1-oneshot",
        "a0.1-coboosting_sign",
    ]
    assert driver.method_grid([0.1], [], ["coboosting_fedgo_odds", "dense"]) == [
        "a0.1-oneshot",
        "a0.1-dense",
        "a0.1-coboosting_fedgo",
        "a0.1-coboosting_fedgo_odds",
    ]
    assert driver.method_grid([0.1], [], driver.DEFAULT_METHODS) == driver.method_grid([0.1])
    assert "a0.1-coboosting_sign" not in driver.method_grid([0.1])  # only when asked
    with pytest.raises(ValueError, match="unknown methods \\['fedavg'\\]"):
        driver.method_grid([0.1], [], ["coboosting", "fedavg"])
    args = driver.SPEC.bench(["--methods", "coboosting_sign", "feddf"]).args
    assert args.methods == ["coboosting_sign", "feddf"]
    # The sign step is the authors' diversification, everything else Co-Boosting's; it reuses
    # oneshot's uploads and trains the same clients as every other method of its alpha.
    sign = driver.load_config(DIGITS, driver.method_overrides("a0.1-coboosting_sign"))
    paper = driver.load_config(DIGITS, driver.method_overrides("a0.1-coboosting"))
    assert (sign.strategy.name, sign.strategy.params.boost.variant) == ("coboosting", "code")
    assert paper.strategy.params.boost.variant == "paper"
    assert driver.source_method("a0.1-coboosting_sign") == "a0.1-oneshot"
    # FedGO's exact odds: the same discriminators as coboosting_fedgo (its uploads), read
    # through exp(z) instead of exp(sigmoid(z)); only when asked.
    assert driver.method_grid([0.1], [], ["coboosting_fedgo_exact_odds"]) == [
        "a0.1-coboosting_fedgo",
        "a0.1-coboosting_fedgo_exact_odds",
    ]
    for base, combine in (("exact", "odds_learned"), ("exact_odds", "odds")):
        method = f"a0.1-coboosting_fedgo_{base}"
        cfg = driver.load_config(DIGITS, driver.method_overrides(method))
        assert (cfg.strategy.params.disc_mode, cfg.strategy.params.combine) == ("sigmoid", combine)
        assert driver.source_method(method) == "a0.1-coboosting_fedgo"
        assert method not in driver.method_grid([0.1])
    fedgo = driver.load_config(DIGITS, driver.method_overrides("a0.1-coboosting_fedgo"))
    assert fedgo.strategy.params.disc_mode == "double_sigmoid"
    driver.check_grid(DIGITS, driver.method_grid([0.1], [], driver.ALL_METHODS), [])


def test_ablation_rows_switch_exactly_their_components(driver) -> None:
    names = [driver.ablation_name(*flags) for flags in driver.ABLATION]
    assert names == [*ABLATION_RUNS, "coboosting"]
    for flags, name in zip(driver.ABLATION, names, strict=True):
        cfg = driver.load_config(DIGITS, driver.method_overrides(f"a0.05-{name}"))
        p = cfg.strategy.params
        assert cfg.strategy.name == "coboosting"
        got = (p.synthesis.hardness == 1.0, p.boost.diversify, p.boost.reweight)
        assert got == flags, name
        assert p.synthesis.hardness in (0.0, 1.0)
    # DENSE keeps its own defaults: the preset sets none of the switches.
    dense = driver.load_config(DIGITS, driver.method_overrides("a0.1-dense")).strategy.params
    assert (dense.synthesis.hardness, dense.synthesis.adv_mask) == (0.0, True)
    assert (dense.boost.reweight, dense.boost.diversify) == (False, False)


def test_a_runs_overrides_reuse_the_sources_scratch_folder(driver, tmp_path: Path) -> None:
    scratch = tmp_path / "scratch" / "t"
    extra = ["strategy.epochs=5", "strategy.name=dense"]  # the method's name wins
    bench = bench_of(driver, tmp_path, "--config", "conf/x.yaml", *extra)
    bench.data = data = tmp_path / "cifar"
    assert bench.overrides("a0.1-coboosting", 2) == [
        f"data.path={data}",
        "seed=2",
        "resume=true",
        "strategy.epochs=5",
        "strategy.name=dense",
        "data.alpha=0.1",
        "strategy.name=coboosting",
        f"strategy.teachers_from={scratch / 'a0.1-oneshot-seed2'}",
        f"output_dir={scratch / 'a0.1-coboosting-seed2'}",
    ]
    bench = bench_of(driver, tmp_path, "--config", "conf/x.yaml")
    odds = bench.overrides("a0.3-coboosting_fedgo_odds", 0)
    assert odds[0] == "seed=0"  # no data.path for a built-in dataset
    assert "strategy.combine=odds" in odds
    assert odds[-2] == f"strategy.teachers_from={scratch / 'a0.3-coboosting_fedgo-seed0'}"
    for method in ("a0.1-oneshot", "a0.1-feddf", "a0.1-coboosting_fedgo"):
        words = bench.overrides(method, 0)
        assert not any(w.startswith("strategy.teachers_from=") for w in words), method
    assert driver.method_overrides("a0.05-feddf") == [
        "data.alpha=0.05",
        "strategy.name=feddf",
        "rounds=1",
        "strategy.weighting=uniform",
    ]
    # Each run is the registry's --child entry, in a process of its own.
    assert bench.command("a0.1-oneshot", 0)[1:5] == ["-m", "benchmarks", "--child", "conf/x.yaml"]


def test_command_line_overrides_and_an_empty_ablation_list(driver) -> None:
    argv = ["--alphas", "0.1", "rounds=1", "--ablation-alphas", "--seeds", "4"]
    args = driver.SPEC.bench(argv).args
    assert (args.alphas, args.ablation_alphas, args.seeds) == ([0.1], [], [4])
    assert args.overrides == ["rounds=1"]
    args = driver.SPEC.bench([]).args
    assert args.ablation_alphas == [0.05] and args.alphas == [0.05, 0.1, 0.3]
    assert args.config == driver.DEFAULT_CONFIG and args.tag == "coboosting-cifar10-cpu"


@pytest.mark.parametrize("preset", [DIGITS, "conf/bench/coboosting-cifar10-cpu.yaml"])
def test_every_method_of_a_preset_trains_the_same_clients(driver, preset: str) -> None:
    grid = driver.method_grid(driver.ALPHAS, driver.ABLATION_ALPHAS)
    dataset = driver.check_grid(preset, grid, [])
    assert dataset == ("digits" if preset == DIGITS else "imagefolder")
    for method in grid:
        cfg = driver.load_config(preset, driver.method_overrides(method))
        assert cfg.rounds == 1 and cfg.fraction == 1.0, method
        assert cfg.data.server_fraction == 0.2 and cfg.data.num_clients == 10, method
        assert cfg.data.alpha == driver.parse_method(method)[0]
    assert cfg.strategy.name == "coboosting_fedgo"
    assert cfg.strategy.params.generator.steps == 0  # untrained: the server uses no data


def test_a_method_whose_clients_would_differ_stops_the_grid(driver, monkeypatch) -> None:
    monkeypatch.setitem(driver.BASE_OVERRIDES, "dense", ["strategy.name=dense", "train.lr=0.5"])
    with pytest.raises(
        SystemExit, match=r"a0.1-dense: its clients would not be a0.1-oneshot's \(train differ\)"
    ):
        driver.check_grid(DIGITS, driver.method_grid([0.1]), [])
    with pytest.raises(SystemExit, match="a0.1-coboosting: .*strategy.nope"):
        driver.check_grid(DIGITS, ["a0.1-coboosting"], ["strategy.nope=1"])


def test_preset_partitions_can_be_drawn_for_every_alpha_and_default_seed(driver) -> None:
    """Ten clients under Dirichlet(0.05) need every client to get ``data.min_client_size``
    images; a preset whose split cannot be drawn fails every run of the grid at its start.
    CIFAR-10's training subset is stratified, so its labels are balanced."""
    from fedgo_flwr.data.partition import dirichlet_prior_partition
    from fedgo_flwr.learning.task import load_bundle

    for preset in (DIGITS, driver.DEFAULT_CONFIG):
        for alpha in driver.ALPHAS:
            d = driver.load_config(preset, driver.method_overrides(f"a{alpha:g}-oneshot")).data
            if d.dataset == "digits":
                labels = np.asarray(load_bundle(d).train.y)
            else:
                labels = np.repeat(np.arange(10), d.train_subset // 10)
            for seed in range(5):
                assert d.partition == "dirichlet_prior"
                part = dirichlet_prior_partition(
                    labels,
                    d.num_clients,
                    d.alpha,
                    d.quantity_sigma,
                    d.server_fraction,
                    seed,
                    d.min_client_size,
                )
                assert min(part.client_sizes) >= d.min_client_size


# -- the sweep, with a stand-in for the subprocess -------------------------------------------


class FakeRuns:
    """``execute`` without a subprocess: a summary and, for a run that trains its clients,
    a ``client_models.pt`` header made as the strategy makes it (fingerprint of the run's
    settings), so the driver's reuse check reads a genuine file."""

    def __init__(self, driver, bench, fail: set[str] = frozenset()) -> None:
        self.driver, self.bench, self.fail = driver, bench, fail
        self.calls: list[tuple[str, int]] = []
        self.accuracy = 0.5
        self.delay = 0.0  # seconds each run takes (runs at once: --jobs)

    def __call__(self, method: str, seed: int) -> Path:
        from strategies import strategy_class
        from strategies.oneshot import fingerprint

        d = self.driver
        self.calls.append((method, seed))
        if method in self.fail:
            raise d.RunFailed(f"{method}-seed{seed} failed (exit 1; log)\ntraceback")
        run_dir = self.bench.run_dir(method, seed)
        run_dir.mkdir(parents=True, exist_ok=True)
        cfg = d.load_config(self.bench.args.config, self.bench.overrides(method, seed))
        source = getattr(cfg.strategy.params, "teachers_from", None)
        if source:
            assert (Path(source) / "client_models.pt").is_file()
        elif cfg.strategy.name != "feddf":  # a one-shot strategy: it saves its uploads
            header = {
                "fingerprint": fingerprint(cfg),
                "extra_fingerprint": strategy_class(cfg.strategy.name).extra_fingerprint(cfg),
                "clients": {},
                "left_out": [],
                "sampled": [],
            }
            torch.save(header, run_dir / "client_models.pt")
        summary = {"final_accuracy": self.accuracy, "ensemble_accuracy_uniform": 0.6}
        time.sleep(self.delay)
        (run_dir / "summary.json").write_text(json.dumps(summary))
        return run_dir


@pytest.fixture
def sweep_env(driver, tmp_path: Path, monkeypatch):
    bench = bench_of(driver, tmp_path, "--config", DIGITS)
    fake = FakeRuns(driver, bench)
    monkeypatch.setattr(bench, "execute", fake)  # the runs and the reruns of a source
    results = bench.results

    def sweep(methods: list[str], jobs: int = 1) -> list[str]:
        return run_grid(methods, [0], bench.run_one, results, jobs=jobs, after=driver.SPEC.after)

    return fake, bench.args, results, sweep


def test_runs_at_once_start_after_their_source_and_rerun_a_cleaned_one_once(
    driver, sweep_env, tmp_path: Path
) -> None:
    """--jobs 3: the three runs that reuse oneshot's uploads start once it is over; when its
    scratch folder was cleaned, the first of them to start runs it again and the others wait
    for that (one rerun, not three into one folder)."""
    fake, args, results, sweep = sweep_env
    fake.delay = 0.3
    methods = ["a0.1-oneshot", "a0.1-dense", "a0.1-coboosting", "a0.1-coboosting_sign"]
    assert sweep(methods, jobs=3) == []
    assert fake.calls[0] == ("a0.1-oneshot", 0) and sorted(fake.calls[1:]) == sorted(
        (m, 0) for m in methods[1:]
    )
    assert Kept(results).names() == sorted(f"{m}-seed0" for m in methods)
    shutil.rmtree(tmp_path / "scratch")
    forget(results, [f"{m}-seed0" for m in methods[1:]])
    fake.calls.clear()
    assert sweep(methods, jobs=3) == []
    assert fake.calls.count(("a0.1-oneshot", 0)) == 1
    assert sorted(fake.calls) == sorted((m, 0) for m in methods)


def test_a_cleaned_source_folder_is_run_again_before_the_run_that_reuses_it(
    driver, sweep_env, tmp_path: Path
) -> None:
    fake, args, results, sweep = sweep_env
    methods = [
        "a0.1-oneshot",
        "a0.1-coboosting",
        "a0.1-coboosting_fedgo",
        "a0.1-coboosting_fedgo_odds",
    ]
    assert sweep(methods) == []
    assert fake.calls == [(m, 0) for m in methods]
    kept = Kept(results).get("a0.1-oneshot-seed0", "summary.json")
    # The scratch folders were cleaned and one dependent run is still to do.
    shutil.rmtree(tmp_path / "scratch")
    forget(results, ["a0.1-coboosting-seed0"])
    fake.calls.clear()
    assert sweep(methods) == []
    assert fake.calls == [("a0.1-oneshot", 0), ("a0.1-coboosting", 0)]
    assert (tmp_path / "scratch" / "t" / "a0.1-oneshot-seed0" / "client_models.pt").is_file()
    assert Kept(results).get("a0.1-oneshot-seed0", "summary.json") == kept  # not re-kept
    # The FedGO pair (its source's scratch folder went with the others): that source, not
    # oneshot, runs again.
    forget(results, ["a0.1-coboosting_fedgo_odds-seed0"])
    fake.calls.clear()
    assert sweep(methods) == []
    assert fake.calls == [("a0.1-coboosting_fedgo", 0), ("a0.1-coboosting_fedgo_odds", 0)]


def test_uploads_made_with_other_settings_are_made_again_and_must_match_the_record(
    driver, sweep_env
) -> None:
    fake, args, results, sweep = sweep_env
    assert sweep(["a0.1-oneshot"]) == []
    # Same results, other uploads header (a new data path would do this): made again, used.
    args.overrides = ["train.weight_decay=0"]  # the default, but written: the same settings
    fake.calls.clear()
    assert sweep(["a0.1-oneshot", "a0.1-dense"]) == []
    assert fake.calls == [("a0.1-dense", 0)]  # the header matched: nothing made again
    args.overrides = ["train.lr=0.02"]
    forget(results, ["a0.1-dense-seed0"])
    fake.calls.clear()
    assert sweep(["a0.1-oneshot", "a0.1-dense"]) == []
    assert fake.calls == [("a0.1-oneshot", 0), ("a0.1-dense", 0)]
    # A rerun that does not reproduce the kept record: the record is stale; nothing reuses it.
    args.overrides = ["train.lr=0.03"]
    fake.accuracy = 0.25
    forget(results, ["a0.1-dense-seed0"])
    fake.calls.clear()
    failed = sweep(["a0.1-oneshot", "a0.1-dense"])
    assert fake.calls == [("a0.1-oneshot", 0)]
    assert len(failed) == 1 and failed[0].startswith(
        "a0.1-dense-seed0 not run: a0.1-oneshot-seed0 ran again for its uploads, but differs "
        "from its kept record"
    )
    assert failed[0].endswith(
        "in final_accuracy: that record was made with other settings; "
        "remove it (and the records of the runs that reused it) and run the sweep again"
    )


def test_a_run_whose_source_failed_is_not_started(driver, sweep_env) -> None:
    fake, args, results, sweep = sweep_env
    fake.fail = {"a0.1-oneshot"}
    failed = sweep(["a0.1-oneshot", "a0.1-dense", "a0.1-feddf"])
    assert fake.calls == [("a0.1-oneshot", 0), ("a0.1-feddf", 0)]
    assert failed == [
        "a0.1-oneshot-seed0 failed (exit 1; log)",
        "a0.1-dense-seed0 not run: it reuses the uploads of a0.1-oneshot-seed0, which has not "
        "finished",
    ]
    assert Kept(results).names() == ["a0.1-feddf-seed0"]


# -- the tables ----------------------------------------------------------------------------


def _run(results: Path, name: str, rows: list[dict] | None = None, **summary) -> None:
    run = results / name
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows or []))


@pytest.fixture
def records(tmp_path: Path) -> Path:
    """alpha 0.1: oneshot for seeds 0-2, coboosting for 0-1, FedDF for 0-1 (seed 1's clients
    not oneshot's), CB + FedGO for seed 0; alpha 0.05: the ablation's none and all three for
    seed 0, GHS alone for seeds 0 and 1; nothing at 0.3."""
    for seed, (avg, uniform, size) in enumerate(
        [(0.25, 0.50, 0.55), (0.30, 0.52, 0.50), (0.35, 0.54, 0.60)]
    ):
        _run(
            tmp_path,
            f"a0.1-oneshot-seed{seed}",
            final_accuracy=avg,
            ensemble_accuracy_uniform=uniform,
            ensemble_accuracy_data_size=size,
            total_time=10.0 + seed,
        )
    for seed, (acc, learned) in enumerate([(0.55, 0.60), (0.57, 0.64)]):
        _run(
            tmp_path,
            f"a0.1-coboosting-seed{seed}",
            final_accuracy=acc,
            ensemble_accuracy_learned=learned,
            ensemble_accuracy_uniform=0.5,
            total_time=100.0 + 20 * seed,
        )
    feddf_rows = {  # (initial average, ensemble) in round 1
        0: (0.25, 0.50),  # oneshot seed 0's FedAvg and FedENS
        1: (0.31, 0.52),  # another average, the same ensemble
    }
    for seed, (init, ens) in feddf_rows.items():
        rows = [
            {"round": 0, "test_accuracy": 0.1},
            {"round": 1, "init_test_accuracy": init, "ensemble_test_accuracy": ens},
        ]
        _run(
            tmp_path,
            f"a0.1-feddf-seed{seed}",
            rows,
            final_accuracy=0.4 + 0.1 * seed,
            total_time=30.0,
        )
    _run(
        tmp_path,
        "a0.1-coboosting_fedgo-seed0",
        final_accuracy=0.58,
        ensemble_accuracy_uniform=0.50,
        ensemble_accuracy_fedgo=0.66,
        ensemble_accuracy_learned=0.68,
    )
    _run(tmp_path, "a0.05-abl-none-seed0", final_accuracy=0.39)
    _run(tmp_path, "a0.05-abl-ghs-seed0", final_accuracy=0.40)
    _run(tmp_path, "a0.05-abl-ghs-seed1", final_accuracy=0.44)
    _run(tmp_path, "a0.05-coboosting-seed0", final_accuracy=0.47)
    return tmp_path


def _section(text: str, start: str, end: str | None = None) -> str:
    part = text.split(start, 1)[1]
    return part if end is None else part.split(end, 1)[0]


def _rows(text: str, first_cell: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(f"| {first_cell} |")]


def test_table1_means_sds_seed_counts_dashes_and_paper_rows(driver, records) -> None:
    text = driver.table(records, reference="cifar10")
    assert driver.ANCHOR in text.splitlines()[:4]
    server = _section(text, "Server model", "Ensemble of the client models")
    assert _rows(server, "0.1") == [
        # FedAvg 25/30/35; FedDF 40 and 50 of 3 seeds; no DENSE; Co-Boosting 55/57 (sd 1.41)
        "| 0.1 | 3 | 30.00 ± 5.00 | 45.00 ± 7.07 (n=2) | – | 56.00 ± 1.41 (n=2) "
        "| 58.00 ± 0.00 (n=1) | – |"
    ]
    assert _rows(server, "0.1 (paper, CIFAR-10)") == [
        "| 0.1 (paper, CIFAR-10) | | 27.54 | 49.63 | 47.80 | 57.09 | – | – |"
    ]
    assert _rows(server, "0.3") == ["| 0.3 | 0 | – | – | – | – | – | – |"]
    # alpha 0.05 has the ablation's seeds 0 and 1 but no Table-1 run: dashes, full count 2
    assert _rows(server, "0.05") == ["| 0.05 | 2 | – | – | – | 47.00 ± 0.00 (n=1) | – | – |"]


def test_table2_ensembles_and_the_same_client_checks(driver, records) -> None:
    text = driver.table(records, reference="mnist")
    ensemble = _section(text, "Ensemble of the client models", "Same client models")
    assert _rows(ensemble, "0.1") == [
        "| 0.1 | 3 | 52.00 ± 2.00 | 55.00 ± 5.00 | 62.00 ± 2.83 (n=2) | 66.00 ± 0.00 (n=1) "
        "| 68.00 ± 0.00 (n=1) |"
    ]
    assert _rows(ensemble, "0.1 (paper, MNIST)") == [
        "| 0.1 (paper, MNIST) | | 88.16 | – | 94.47 | – | – |"
    ]
    section = _section(text, "Same client models", "Ablation")
    checks = [line for line in section.splitlines() if line.startswith("- ")]
    assert checks == [
        "- FedDF initial average = one-shot FedAvg: 1 of 2 (alpha, seed) pairs; differ: "
        "0.1/seed1: 31.00 vs 30.00",
        "- FedDF ensemble = FedENS: 2 of 2 (alpha, seed) pairs",
        "- CB + FedGO FedENS = FedENS: 1 of 1 (alpha, seed) pairs",
    ]


def test_table7_check_marks_and_wall_times(driver, records) -> None:
    text = driver.table(records, alphas=[0.05, 0.1], ablation_alphas=[0.05, 0.3])
    ablation = _section(text, "Ablation (paper Table 7", "Wall time per run")
    header, rule, *rows = [r for r in ablation.splitlines() if r.startswith("|")]
    assert header == "| GHS | DHS | EE | alpha 0.05 |"  # 0.3 is not an alpha of the table
    assert rows == [
        "|  |  |  | 39.00 ± 0.00 (n=1) |",
        "| ✓ |  |  | 42.00 ± 2.83 |",
        "|  | ✓ |  | – |",
        "|  |  | ✓ | – |",
        "| ✓ | ✓ |  | – |",
        "| ✓ |  | ✓ | – |",
        "|  | ✓ | ✓ | – |",
        "| ✓ | ✓ | ✓ | 47.00 ± 0.00 (n=1) |",
    ]
    times = _section(text, "Wall time per run")
    assert _rows(times, "oneshot") == ["| oneshot | – | 11.0 ± 1.0 |"]
    assert _rows(times, "coboosting") == ["| coboosting | – | 110.0 ± 14.1 |"]
    assert _rows(times, "abl-none") == ["| abl-none | – | – |"]  # no total_time recorded
    assert "All kept runs: 313 s (0.09 h) of run time." in times  # 33 + 220 + 2 x 30


def test_intervals_and_paired_differences_by_hand(driver, records) -> None:
    text = driver.table(records, alphas=[0.1], ablation_alphas=[])
    part = _section(text, "Server model, test accuracy % with the half-width")
    assert "tuning seeds: not for claims (seeds 0, 1, 2" in part.splitlines()[0]
    # FedAvg 25/30/35: mean 30, sd 5, half width t(0.975, 2) 5 / sqrt(3) = 12.42
    assert _rows(part, "0.1 | FedAvg") == [
        "| 0.1 | FedAvg | 30.0 ± 12.4 | 0: 25.00, 1: 30.00, 2: 35.00 |"
    ]
    assert _rows(part, "0.1 | DENSE") == []  # no run: no row
    # Co-Boosting - FedAvg on seeds 0 and 1: 30 and 27 points; mean 28.5, sd 2.12, t = 19.0
    # on 1 degree of freedom: p = 0.033; half width t(0.975, 1) 2.12 / sqrt(2) = 19.06
    assert _rows(part, "0.1 | Co-Boosting - FedAvg") == [
        "| 0.1 | Co-Boosting - FedAvg | +28.5 [+9.4, +47.6] p=0.033 (n=2) |"
    ]
    # ... and against FedDF (40, 50): 15 and 7 points, t = 2.75, p = 0.222
    assert _rows(part, "0.1 | Co-Boosting - FedDF") == [
        "| 0.1 | Co-Boosting - FedDF | +11.0 [-39.8, +61.8] p=0.22 (n=2) |"
    ]
    assert "Co-Boosting, sign step" not in text  # no run of it: no column, no row
    assert "signed step" not in text  # ... nor the note on which step each column uses
    _run(records, "a0.1-coboosting_sign-seed1", final_accuracy=0.60, total_time=90.0)
    _run(records, "a0.1-coboosting_sign-seed100", final_accuracy=0.61)
    text = driver.table(records, alphas=[0.1], ablation_alphas=[])
    server = _section(text, "Server model", "Ensemble of the client models")
    assert "an L2-normalised step in its columns (`strategy.boost.variant: paper`" in text
    assert "the authors' code's signed step in \"sign step\" (`variant: code`)" in text
    assert "| Co-Boosting | Co-Boosting, sign step | CB + FedGO" in server
    assert _rows(server, "0.1") == [
        "| 0.1 | 4 | 30.00 ± 5.00 (n=3) | 45.00 ± 7.07 (n=2) | – | 56.00 ± 1.41 (n=2) "
        "| 60.50 ± 0.71 (n=2) | 58.00 ± 0.00 (n=1) | – |"
    ]
    part = _section(text, "Server model, test accuracy % with the half-width")
    assert "tuning seeds: not for claims (seeds 0, 1, 2, 100:" in part.splitlines()[0]
    # one pair (seed 1: 60 - 57): a difference, no interval, no test
    assert _rows(part, "0.1 | Co-Boosting, sign step - Co-Boosting") == [
        "| 0.1 | Co-Boosting, sign step - Co-Boosting | +3.0 (n=1) |"
    ]
    assert _rows(_section(text, "Wall time per run"), "coboosting_sign") == [
        "| coboosting_sign | 90.0 ± 0.0 |"
    ]
    assert "exact odds" not in text  # no run of the exact odds: no column, no row
    _run(records, "a0.1-coboosting_fedgo_exact-seed0", final_accuracy=0.70,
         ensemble_accuracy_fedgo=0.66, ensemble_accuracy_learned=0.72)  # fmt: skip
    text = driver.table(records, alphas=[0.1], ablation_alphas=[])
    server = _section(text, "Server model", "Ensemble of the client models")
    assert server.splitlines()[2].endswith("| CB + FedGO exact odds x learned |")
    assert _rows(server, "0.1")[0].endswith("| 70.00 ± 0.00 (n=1) |")
    ensemble = _section(text, "Ensemble of the client models", "Same client models")
    assert ensemble.splitlines()[2].endswith("| exact odds | exact odds x learned |")
    assert _rows(ensemble, "0.1")[0].endswith("| 66.00 ± 0.00 (n=1) | 72.00 ± 0.00 (n=1) |")
    part = _section(text, "Server model, test accuracy % with the half-width")
    # seed 0: 70 - 58 (CB + FedGO odds x learned, the same discriminators' double sigmoid)
    assert _rows(part, "0.1 | CB + FedGO exact odds x learned - CB + FedGO odds x learned") == [
        "| 0.1 | CB + FedGO exact odds x learned - CB + FedGO odds x learned | +12.0 (n=1) |"
    ]
    report = records / "report"
    for seed, acc in ((100, 0.2), (101, 0.3)):
        _run(report, f"a0.1-coboosting-seed{seed}", final_accuracy=acc)
    first = _section(driver.table(report, alphas=[0.1]), "Server model, test accuracy % with")
    assert "report seeds (100, 101): never used for a choice" in first.splitlines()[0]


def test_uncapped_coboosting_is_eq12_as_published_with_its_own_columns(driver, records) -> None:
    """``coboosting_uncapped``: Co-Boosting with ``share_cap: false`` on oneshot's uploads, only
    when asked; its server and learned-ensemble columns, the note and its pair rows."""
    assert driver.method_grid([0.1], [], ["coboosting_uncapped"]) == [
        "a0.1-oneshot",
        "a0.1-coboosting_uncapped",
    ]
    assert "a0.1-coboosting_uncapped" not in driver.method_grid([0.1])
    free = driver.load_config(DIGITS, driver.method_overrides("a0.1-coboosting_uncapped"))
    paper = driver.load_config(DIGITS, driver.method_overrides("a0.1-coboosting"))
    assert (free.strategy.name, free.strategy.params.share_cap) == ("coboosting", False)
    assert paper.strategy.params.share_cap is True
    assert driver.source_method("a0.1-coboosting_uncapped") == "a0.1-oneshot"
    assert "uncapped" not in driver.table(records, alphas=[0.1], ablation_alphas=[])
    _run(records, "a0.1-coboosting_uncapped-seed1", final_accuracy=0.62,
         ensemble_accuracy_learned=0.66)  # fmt: skip
    text = driver.table(records, alphas=[0.1], ablation_alphas=[])
    assert '"uncapped": eq. 12 as published (`strategy.share_cap: false`)' in text
    server = _section(text, "Server model", "Ensemble of the client models")
    assert "| Co-Boosting | Co-Boosting, uncapped | CB + FedGO" in server
    ensemble = _section(text, "Ensemble of the client models", "Same client models")
    assert "| learned (Co-Boosting) | learned, uncapped | FedGO odds" in ensemble
    assert "| 66.00 ± 0.00 (n=1) |" in _rows(ensemble, "0.1")[0]
    part = _section(text, "Server model, test accuracy % with the half-width")
    # seed 1: 62 against Co-Boosting's 57
    assert _rows(part, "0.1 | Co-Boosting, uncapped - Co-Boosting") == [
        "| 0.1 | Co-Boosting, uncapped - Co-Boosting | +5.0 (n=1) |"
    ]


def test_table_without_a_reference_or_runs(driver, records, tmp_path: Path) -> None:
    text = driver.table(records)
    assert "(paper," not in text
    assert "Ablation" in text  # 0.05 is a default alpha
    empty = driver.table(tmp_path / "none", alphas=[0.1], ablation_alphas=[])
    assert _rows(empty, "0.1") == [  # Table 1 (6 methods), Table 2 (5 ensembles)
        "| 0.1 | 0 | – | – | – | – | – | – |",
        "| 0.1 | 0 | – | – | – | – | – |",
    ]
    assert "Ablation" not in empty
    assert "- FedDF ensemble = FedENS: 0 of 0 (alpha, seed) pairs" in empty
    assert (
        driver.reference_of("digits") == "mnist" and driver.reference_of("imagefolder") == "cifar10"
    )


# -- one real sweep ------------------------------------------------------------------------

TINY = [
    "data.num_clients=4",
    "train.local_epochs=1",
    "strategy.epochs=1",
    "strategy.nz=16",
    "strategy.ngf=8",
    "strategy.synthesis.batch_size=16",
    "strategy.synthesis.steps=2",
    "strategy.boost.batch_size=16",
    "strategy.distill.epochs=1",
    "data.train_subset=400",  # digits cut as the golden runs cut them
    "data.test_subset=120",
    "resources.server_cpus=1",  # tiny models: a second torch thread only waits
]


def test_real_sweep_reuses_uploads_and_feddf_trains_the_oneshot_clients(
    driver, tmp_path: Path, monkeypatch
) -> None:
    """Tiny digits runs through the subprocess: oneshot, Co-Boosting on its uploads, one-shot
    FedDF with its own clients (the oneshot run's models: its average and ensemble equal
    one-shot FedAvg and FedENS), then the oneshot scratch folder cleaned and Co-Boosting run
    again: oneshot is made again first and reproduces its kept record."""
    in_process_runs(monkeypatch)
    bench = bench_of(driver, tmp_path, "--config", DIGITS, *TINY)
    results = bench.results
    methods = ["a0.1-oneshot", "a0.1-coboosting", "a0.1-feddf"]
    assert driver.check_grid(DIGITS, methods, TINY) == "digits"

    def sweep() -> list[str]:
        return run_grid(methods, [0], bench.run_one, results)

    assert sweep() == []
    runs = driver.load_runs(results, methods)
    cob = runs["a0.1-coboosting"][0]
    assert cob.metrics[1]["uploads_reused"] == 1 and cob.summary["server_epochs"] == 1
    oneshot = runs["a0.1-oneshot"][0].summary
    assert cob.summary["ensemble_accuracy_uniform"] == oneshot["ensemble_accuracy_uniform"]
    text = driver.table(results, alphas=[0.1], ablation_alphas=[])
    assert "- FedDF initial average = one-shot FedAvg: 1 of 1 (alpha, seed) pairs" in text
    assert "- FedDF ensemble = FedENS: 1 of 1 (alpha, seed) pairs" in text
    assert "trained outside this table" not in text  # oneshot trained them

    shutil.rmtree(tmp_path / "scratch" / "t" / "a0.1-oneshot-seed0")
    forget(results, ["a0.1-coboosting-seed0"])
    assert sweep() == []
    log = (tmp_path / "scratch" / "t" / "a0.1-coboosting-seed0" / "run.log").read_text()
    assert "reused" in log
    again = driver.load_runs(results, ["a0.1-coboosting"])["a0.1-coboosting"][0].summary
    assert again["final_accuracy"] == cob.summary["final_accuracy"]
    assert again["ensemble_weights"] == cob.summary["ensemble_weights"]


def test_real_sweep_starts_from_the_teachers_milestone(driver, tmp_path: Path, monkeypatch):
    """``--teachers``: oneshot and Co-Boosting start from benchmarks.oneshot_teachers'
    milestone for the run's local epochs (no client trains; oneshot's ensemble is the one the
    milestone measured); a milestone made with other settings, or none for the run's epochs, is
    refused naming the option and the file; FedDF still trains its own clients."""
    in_process_runs(monkeypatch)
    teachers = load_benchmark("oneshot_teachers")
    work = tmp_path / "work"
    made = ["--config", DIGITS, "--seeds", "0", "--epochs", "1", "--work", str(work)]
    assert teachers.main([*made, "--out", str(tmp_path / "measured"), *TINY]) == 0
    measured = json.loads((work / "seed0" / "milestones.json").read_text())[0]

    bench = bench_of(driver, tmp_path, "--config", DIGITS, "--teachers", str(work), *TINY)
    methods = ["a0.1-oneshot", "a0.1-coboosting"]
    assert run_grid(methods, [0], bench.run_one, bench.results) == []
    runs = driver.load_runs(bench.results, methods)
    milestone = work / "seed0" / "e1"
    for method in methods:
        run = runs[method][0]
        assert run.metrics[1]["uploads_reused"] == 1, method
        assert f"strategy.teachers_from={milestone}" in bench.overrides(method, 0)
    fedens = runs["a0.1-oneshot"][0].summary["ensemble_accuracy_uniform"]
    assert 100 * fedens == pytest.approx(measured["fedens"], abs=1e-4)
    text = driver.table(bench.results, alphas=[0.1], ablation_alphas=[])
    assert "The clients of a0.1-oneshot-seed0 were trained outside this table" in text
    feddf = bench.overrides("a0.1-feddf", 0)
    assert not any(w.startswith("strategy.teachers_from=") for w in feddf)

    for extra, why in (["train.lr=0.02"], "train differ"), (["train.local_epochs=2"], "e2"):
        other = bench_of(
            driver, tmp_path / "other", "--config", DIGITS, "--teachers", str(work), *TINY, *extra
        )
        failed = run_grid(["a0.1-oneshot"], [0], other.run_one, other.results)
        assert len(failed) == 1 and "not run: --teachers: " in failed[0], failed
        assert why in failed[0]
