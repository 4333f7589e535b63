"""The CPFL benchmark driver (``benchmarks/cpfl_cohorts.py``): its grid, its sweep, its tables.

The tables are built from hand-made run records (``summary.json`` + ``metrics.jsonl``) whose
figures are chosen so that a speed-up taken as a ratio of means or an arithmetic mean instead
of the geometric mean of per-seed ratios, a seed without its n = 1 run counted in a ratio, a
wrong delta sign or a quantile without interpolation gives other numbers. One real run goes
through the subprocess path on a tiny digits config. The driver is a spec
(``benchmarks.cpfl_cohorts.SPEC``, run by ``python -m benchmarks run cpfl_cohorts``).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def driver():
    return load_benchmark("cpfl_cohorts")


def load_config(config: str, overrides: list[str]):
    return load_benchmark("sweep").load_config(config, overrides)


# -- the grid ------------------------------------------------------------------------------


def test_grid_names_every_alpha_and_cohort_count_in_run_order(driver) -> None:
    grid = driver.method_grid(driver.ALPHAS, driver.COHORTS)
    assert grid == [
        *(f"a0.1-n{n}" for n in (1, 2, 4, 8, 16, 200)),
        *(f"a1-n{n}" for n in (1, 2, 4, 8, 16, 200)),
    ]
    assert driver.parse_method("a0.1-n16") == (0.1, 16)
    with pytest.raises(ValueError, match="a<alpha>-n<cohorts>"):
        driver.parse_method("fedavg")


def test_a_runs_overrides_put_the_method_after_the_users_and_the_folder_last(
    driver, tmp_path: Path, monkeypatch
) -> None:
    assert driver.method_overrides("a0.1-n4") == ["data.alpha=0.1", "strategy.cohorts=4"]
    extra = ["rounds=50", "strategy.cohorts=3"]  # the method's n wins over the user's
    bench = driver.SPEC.bench(["--config", "conf/x.yaml", "--scratch", str(tmp_path), *extra])
    bench.data = data = tmp_path / "cifar"
    run_dir = tmp_path / "a1-n200-seed2"
    assert bench.run_dir("a1-n200", 2) == run_dir
    assert bench.overrides("a1-n200", 2) == [
        f"data.path={data}",
        "seed=2",
        "resume=true",
        "rounds=50",
        "strategy.cohorts=3",
        "data.alpha=1",
        "strategy.cohorts=200",
        f"output_dir={run_dir}",
    ]
    # A dataset that is not the JPEG tree (digits) gets no data.path.
    bench.data = None
    assert bench.overrides("a1-n2", 0)[0] == "seed=0"
    # Each run is the registry's --child entry, in a process of its own.
    assert bench.command("a1-n2", 0)[1:5] == ["-m", "benchmarks", "--child", "conf/x.yaml"]


def test_jobs_reach_the_grid_and_zero_is_refused(driver, monkeypatch, tmp_path) -> None:
    seen = {}

    def run_grid(methods, seeds, run, results, *, jobs=1, after=None, stop_at=None):
        seen.update(methods=list(methods), jobs=jobs, seeds=list(seeds), results=results)
        return []

    spec = load_benchmark("spec")
    monkeypatch.setattr(spec, "run_grid", run_grid)
    monkeypatch.setattr(spec, "write_table", lambda results, text, name: None)
    argv = ["--config", "conf/cpfl.yaml", "--cohorts", "1", "4", "--seeds", "5", "--jobs", "3"]
    registry = load_benchmark("__main__")
    assert registry.main(["run", "cpfl_cohorts", *argv, "--alphas", "1", "--out", "x"]) == 0
    results = spec.ROOT / "x"
    assert seen == {"methods": ["a1-n1", "a1-n4"], "jobs": 3, "seeds": [5], "results": results}
    with pytest.raises(SystemExit):
        driver.SPEC.bench(["--jobs", "0"])


def test_overrides_after_list_options_are_not_taken_as_their_values(driver) -> None:
    args = driver.SPEC.bench(["--cohorts", "1", "2", "rounds=6", "--seeds", "3", "x.y=a=b"]).args
    assert args.cohorts == [1, 2]
    assert args.seeds == [3]
    assert args.overrides == ["rounds=6", "x.y=a=b"]
    assert args.alphas == [0.1, 1.0] and args.config == driver.DEFAULT_CONFIG


def test_preset_is_the_papers_setting_for_every_method_of_the_grid(driver) -> None:
    for method in driver.method_grid(driver.ALPHAS, driver.COHORTS):
        alpha, n = driver.parse_method(method)
        cfg = load_config(driver.DEFAULT_CONFIG, driver.method_overrides(method))
        assert (cfg.data.alpha, cfg.strategy.params.cohorts) == (alpha, n)
    # CPFL Sec. 4.1, CIFAR-10
    assert cfg.data.dataset == "imagefolder" and cfg.data.num_clients == 200
    assert cfg.model.name == "gn_lenet" and cfg.fraction == 1.0
    t = cfg.train
    train = (t.local_epochs, t.batch_size, t.optimizer, t.lr, t.momentum)
    assert train == (1, 20, "sgd", 0.02, 0.9)  # the paper's lr 0.002 x 10 (a CPU-scale departure)
    assert cfg.checkpoint is False
    d = cfg.strategy.params.distill
    assert (d.batch_size, d.lr, d.weights) == (128, 0.001, "label")  # paper batch 512 (departure)


def test_preset_partition_can_be_drawn_for_every_alpha_and_default_seed(driver) -> None:
    """200 clients under Dirichlet(0.1) need enough images for every client to get
    ``data.min_client_size`` of them; a training subset that is too small fails every run of
    the grid at its start. CIFAR-10's classes are balanced, so the subset's labels are too."""
    from fedgo_flwr.data.partition import dirichlet_partition

    args = driver.SPEC.bench([]).args
    for alpha in args.alphas:
        cfg = load_config(args.config, driver.method_overrides(driver.method_name(alpha, 4)))
        d = cfg.data
        labels = np.repeat(np.arange(10), d.train_subset // 10)
        for seed in range(5):
            part = dirichlet_partition(
                labels, d.num_clients, d.alpha, d.server_fraction, seed, d.min_client_size
            )
            assert min(part.client_sizes) >= d.min_client_size


# -- the sweep -----------------------------------------------------------------------------


def test_grid_runs_seed_by_seed_and_a_failed_run_does_not_stop_it(driver, tmp_path: Path) -> None:
    calls = []

    def run(method: str, seed: int) -> Path:
        calls.append((method, seed))
        if (method, seed) == ("a1-n2", 0):
            raise load_benchmark("sweep").RunFailed("a1-n2-seed0 failed (exit 1; log)\ntraceback")
        out = tmp_path / "scratch" / f"{method}-seed{seed}"
        out.mkdir(parents=True)
        (out / "summary.json").write_text(json.dumps({"final_accuracy": 0.5}))
        return out

    results = tmp_path / "results"
    run_grid = load_benchmark("sweep").run_grid
    failed = run_grid(["a1-n1", "a1-n2"], [0, 1], run, results)
    assert calls == [("a1-n1", 0), ("a1-n2", 0), ("a1-n1", 1), ("a1-n2", 1)]
    assert failed == ["a1-n2-seed0 failed (exit 1; log)"]
    kept = load_benchmark("sweep").Kept(results).names()
    assert kept == ["a1-n1-seed0", "a1-n1-seed1", "a1-n2-seed1"]
    # Again: only the failed run is retried.
    calls.clear()
    run_grid(["a1-n1", "a1-n2"], [0, 1], run, results)
    assert calls == [("a1-n2", 0)]


# -- the tables ----------------------------------------------------------------------------


def _run(results: Path, name: str, **summary) -> None:
    run = results / name
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(summary))
    rows = [{"round": 1, "cohorts": [{"cohort": 0, "sim_hours": 0.1}]}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _cpfl(time_h, cpu_h, bytes_total, student, teacher, finish, status=None, distill_s=0.0):
    return {
        "final_accuracy": student,
        "sim_time_to_convergence_h": time_h,
        "cpu_hours": cpu_h,
        "bytes_total": bytes_total,
        "teacher_accuracy_mean": teacher,
        "ensemble_accuracy": student + 0.01,
        "cohort_finish_h": finish,
        "cohort_status": status or ["converged"] * len(finish),
        "distill_time_s": distill_s,
    }


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """alpha 0.1: n = 1 for seeds 0 and 1, n = 4 for seeds 0, 1 and 2; nothing else."""
    _run(tmp_path, "a0.1-n1-seed0", **_cpfl(10.0, 100.0, 2e9, 0.70, 0.70, [10.0]))
    _run(tmp_path, "a0.1-n1-seed1", **_cpfl(30.0, 140.0, 3e9, 0.72, 0.72, [30.0]))
    finish = {0: [1.0, 2.0, 4.0, 5.0], 1: [1.0, 3.0, 6.0, 10.0], 2: [0.5, 0.5, 0.5, 1.0]}
    per_seed = {  # time, CPU-hours, bytes, student, mean teacher
        0: (5.0, 80.0, 2e6, 0.60, 0.50),
        1: (10.0, 80.0, 4e6, 0.62, 0.48),
        2: (1.0, 1.0, 3e6, 0.58, 0.52),  # no n = 1 run: left out of the ratios
    }
    for seed, (t, cpu, b, student, teacher) in per_seed.items():
        status = ["converged", "converged", "converged", "max_rounds"] if seed == 1 else None
        _run(
            tmp_path,
            f"a0.1-n4-seed{seed}",
            **_cpfl(t, cpu, b, student, teacher, finish[seed], status, distill_s=10.0 + seed),
            **({"distill_steps": 9800, "public_size": 425} if seed == 0 else {}),
        )
    return tmp_path


def _rows(text: str, first_cell: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(f"| {first_cell} |")]


def test_table_speed_up_and_cpu_ratio_are_geometric_means_of_per_seed_ratios(
    driver, results
) -> None:
    text = driver.table(results)
    assert driver.ANCHOR in text.splitlines()[:4]  # above the tables
    alpha01 = text.split("alpha = 0.1")[1].split("alpha = 1")[0]
    (n4,) = _rows(alpha01, "4")
    cells = [c.strip() for c in n4.strip("|").split("|")]
    # seeds 0, 1: 10/5 = 2 and 30/10 = 3 -> sqrt(6) = 2.45 (their arithmetic mean 2.50, a
    # ratio of means 40/15 = 2.67, and seed 2, with no n = 1 run, would add 10/1 or 20/1);
    # interval: exp(mean log +- t(0.975, 1) sd(log) / sqrt(2)) = exp(0.896 +- 2.576)
    assert cells == [
        "4",
        "3",
        "60.0 ± 2.0",  # student accuracy, all three seeds
        "5.33 ± 4.51",  # time to convergence: 5, 10, 1
        "2.45x [0.19, 32.20]",
        "53.7 ± 45.6",  # CPU-hours: 80, 80, 1
        "1.48x [0.17, 12.54]",  # 100/80 = 1.25 and 140/80 = 1.75: sqrt(2.1875)
        "3.0 ± 1.0 MB",
        "11.0 ± 1.0",  # distillation wall seconds
    ]
    (n1,) = _rows(alpha01, "1")
    assert "| 1.00x [1.00, 1.00] |" in n1 and "| 2.50 ± 0.71 GB |" in n1
    # a missing run, and the missing alpha, show as dashes but still make rows
    (n2,) = _rows(alpha01, "2")
    assert n2 == "| 2 | 0 | – | – | – | – | – | – | – |"
    alpha1 = text.split("alpha = 1\n")[1].split("Teacher vs student")[0]
    assert len([r for r in alpha1.splitlines() if r.startswith("| ") and "–" in r]) == 6


def test_table_teacher_vs_student_delta_is_per_seed_student_minus_teacher(driver, results) -> None:
    text = driver.table(results)
    teacher = text.split("Teacher vs student")[1].split("Cohort finish times")[0]
    rows = _rows(teacher, "0.1")
    assert [r.split(" | ")[1] for r in rows] == ["2", "4", "8", "16", "200"]  # n = 1: no KD
    # teachers 50, 48, 52; students 60, 62, 58; deltas +10, +14, +6; every student 1 point
    # under its ensemble (a zero-width interval); steps and public size kept by seed 0 only
    assert rows[1] == (
        "| 0.1 | 4 | 3 | 50.0 ± 2.0 | 60.0 ± 2.0 | 10.0 ± 4.0 | 61.0 ± 2.0 | -1.0 ± 0.0 "
        "| 9800 | 425 |"
    )


def test_table_finish_quantiles_pool_every_cohort_of_every_seed(driver, results) -> None:
    text = driver.table(results)
    finish = text.split("Cohort finish times")[1].split("With 95% t intervals")[0]
    (row,) = [r for r in _rows(finish, "0.1") if r.startswith("| 0.1 | 4 |")]
    pooled = sorted([1, 2, 4, 5, 1, 3, 6, 10, 0.5, 0.5, 0.5, 1])
    q = statistics.quantiles(pooled, n=4, method="inclusive")
    assert q == [0.875, 1.5, 4.25]
    # by T/2: seed 0 (T 5) 2 of 4, seed 1 (T 10) 2 of 4, seed 2 (T 1) 3 of 4 -> 7 of 12
    assert row == "| 0.1 | 4 | 3 | 12 | 0.50 | 0.88 | 1.50 | 4.25 | 10.00 | 58% | 1 |"
    assert "| 1 | 16 | 0 | – | – | – | – | – | – | – | – |" in finish


def test_table_intervals_pair_each_seed_with_its_n1_run_and_count_capped_runs(
    driver, results
) -> None:
    text = driver.table(results)
    part = text.split("With 95% t intervals over seeds")[1]
    assert "tuning seeds: not for claims (seeds 0, 1, 2" in part.splitlines()[0]
    # n = 1: 70 and 72, half width t(0.975, 1) sd / sqrt(2) = 12.71; no comparison with itself
    assert _rows(part, "0.1 | 1") == ["| 0.1 | 1 | 71.0 ± 12.7 |  |  |  | 0 of 2 |"]
    # n = 4: 60, 62, 58 (half width t(0.975, 2) 2 / sqrt(3) = 4.97); against n = 1 on seeds 0
    # and 1 only: -10 both times (an interval of zero width, no test); speed-ups 2 and 3
    # (geometric mean 2.45, as in the first table), CPU-hours ratios 1.25 and 1.75; seed 1 capped
    assert _rows(part, "0.1 | 4") == [
        "| 0.1 | 4 | 60.0 ± 5.0 | -10.0 [-10.0, -10.0] (n=2) | 2.45x [0.19, 32.20] "
        "| 1.48x [0.17, 12.54] | 1 of 3 |"
    ]
    assert _rows(part, "0.1 | 2") == [] and _rows(part, "1 | 1") == []  # no runs: no rows
    assert "With 95% t intervals" not in driver.table(results / "none", alphas=[0.1])


def test_table_of_an_empty_results_folder_is_all_dashes(driver, tmp_path: Path) -> None:
    text = driver.table(tmp_path / "none", alphas=[0.1], cohorts=[1, 4])
    assert "| 4 | 0 | – | – | – | – | – | – | – |" in text
    assert "| 0.1 | 4 | 0 | – | – | – | – | - | – | – |" in text


def test_quantile_interpolates_between_order_statistics(driver) -> None:
    assert driver.quantile([1.0], 0.75) == 1.0
    assert driver.quantile([0.0, 10.0], 0.25) == 2.5
    assert driver.quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == 3.0


# -- one real run --------------------------------------------------------------------------


CUT = ["data.train_subset=400", "data.test_subset=120", "resources.server_cpus=1"]
"""Digits cut as the golden runs cut them, the server on one torch thread."""


def test_a_real_run_goes_through_the_subprocess_and_a_failed_one_is_reported(
    driver, tmp_path: Path, monkeypatch
) -> None:
    """Tiny digits runs (2 rounds, 2 cohorts; ~10 s): the child process, the kept records,
    a stale unkept run replaced, and a run that cannot start (more cohorts than clients)."""
    stale = tmp_path / "scratch" / "t" / "a1-n2-seed0"
    stale.mkdir(parents=True)
    (stale / "summary.json").write_text(json.dumps({"final_accuracy": 0.0, "cohorts": 9}))
    overrides = ["rounds=2", "strategy.distill.epochs=1", "checkpoint=false", *CUT]
    results = tmp_path / "results"
    argv = ["--config", "conf/cpfl.yaml", "--scratch", str(stale.parent), "--out", str(results)]
    bench = driver.SPEC.bench([*argv, *overrides])
    run_grid = load_benchmark("sweep").run_grid
    failed = run_grid(["a1-n2", "a1-n50"], [0], bench.run_one, results)
    assert len(failed) == 1 and failed[0].startswith("a1-n50-seed0 failed (exit 1;")
    log = (tmp_path / "scratch" / "t" / "a1-n50-seed0" / "run.log").read_text()
    assert "more cohorts than clients" in log
    summary = load_benchmark("sweep").Kept(results).json("a1-n2-seed0")  # in runs.tar.xz
    assert summary["cohorts"] == 2 and summary["cohort_rounds"] == [2, 2]
    assert summary["distill_time_s"] > 0
    run = driver.load_runs(results, ["a1-n2"])["a1-n2"][0]
    assert [r["round"] for r in run.metrics] == [0, 1, 2]
    assert len(run.metrics[1]["cohorts"]) == 2
