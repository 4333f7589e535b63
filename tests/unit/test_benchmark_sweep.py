"""The benchmark drivers' shared sweep (``benchmarks/sweep.py``): mean ± sd, resuming, records.

Hand-built numbers: a wrong mean, a population instead of a sample sd, a run that is re-run
although finished, or a record kept with an absolute path must fail here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def sweep():
    return load_benchmark("sweep")


def test_mean_sd_is_the_sample_mean_and_sd_in_percent(sweep) -> None:
    assert sweep.mean_sd([0.30, 0.31, 0.32]) == "31.0 ± 1.0"
    # sample sd of (0.20, 0.30, 0.40, 0.50) is 0.129; the population sd would give 11.2
    assert sweep.mean_sd([0.20, 0.30, 0.40, 0.50]) == "35.0 ± 12.9"
    assert sweep.mean_sd([0.425]) == "42.5 ± 0.0"
    assert sweep.mean_sd([]) == "-"
    assert sweep.mean_sd([2.0, 4.0, 9.0], scale=1.0) == "5.0 ± 3.6"


def test_column_leaves_out_runs_without_a_value(sweep) -> None:
    runs = [
        sweep.Run("a-seed0", "a", "seed0", {"x": 0.1}, [{"round": 1, "y": 0.5}]),
        sweep.Run("a-seed1", "a", "seed1", {"x": 0.3}, []),
    ]
    assert sweep.column(runs, lambda r: r.summary["x"]) == "20.0 ± 14.1"
    last_y = sweep.column(runs, lambda r: r.metrics[-1]["y"] if r.metrics else None)
    assert last_y == "50.0 ± 0.0"
    assert sweep.column(runs, lambda r: None) == "-"


def _fake_run(out: Path, root: Path, method: str, seed: int, acc: float) -> Path:
    run = out / f"{method}-seed{seed}"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"final_accuracy": acc}))
    (run / "metrics.jsonl").write_text(json.dumps({"round": 1, "test_accuracy": acc}) + "\n")
    (run / "config.yaml").write_text(f"output_dir: {root}/outputs/{run.name}\ndata: /elsewhere\n")
    return run


def test_sweep_skips_finished_runs_and_keeps_records_in_one_archive(sweep, tmp_path) -> None:
    root, results = tmp_path / "repo", tmp_path / "repo" / "results"
    calls = []

    def run_one(method: str, seed: int) -> Path:
        calls.append((method, seed))
        acc = {"fedavg": 0.3, "feddf": 0.4}[method] + 0.01 * seed
        return _fake_run(root / "outputs", root, method, seed, acc)

    assert sweep.run_grid(["fedavg", "feddf"], [0, 1], run_one, results, root=root) == []
    assert calls == [("fedavg", 0), ("feddf", 0), ("fedavg", 1), ("feddf", 1)]
    # one file in the results folder: the archive, with every run's summary and records
    assert [p.name for p in results.iterdir()] == ["runs.tar.xz"]
    archive = sweep.read_archive(results / sweep.ARCHIVE)
    assert sorted(archive) == [
        f"{m}-seed{s}/{f}"
        for m in ("fedavg", "feddf")
        for s in (0, 1)
        for f in ("config.yaml", "metrics.jsonl", "summary.json")
    ]
    config = archive["fedavg-seed1/config.yaml"].decode()
    assert config == "output_dir: outputs/fedavg-seed1\ndata: /elsewhere\n"

    # a second sweep (more seeds) runs only what is missing
    calls.clear()
    sweep.run_grid(["fedavg", "feddf"], [0, 1, 2], run_one, results, root=root)
    assert calls == [("fedavg", 2), ("feddf", 2)]

    runs = sweep.load_runs(results, ["feddf", "fedavg"])
    assert list(runs) == ["feddf", "fedavg"]
    assert [r.seed for r in runs["fedavg"]] == ["seed0", "seed1", "seed2"]
    accs = [r.metrics[0]["test_accuracy"] for r in runs["feddf"]]
    assert accs == pytest.approx([0.4, 0.41, 0.42])
    assert sweep.column(runs["feddf"], lambda r: r.summary["final_accuracy"]) == "41.0 ± 1.0"
    only = sweep.load_runs(results, ["fedavg"], seeds=[2, 0])
    assert [r.name for r in only["fedavg"]] == ["fedavg-seed2", "fedavg-seed0"]
    with pytest.raises(FileNotFoundError):
        sweep.load_runs(results, ["fedavg"], seeds=[3])


def test_run_grid_with_jobs_overlaps_runs_waits_for_sources_and_goes_on_after_a_failure(
    sweep, tmp_path
) -> None:
    """``jobs=2``: two runs of a seed are under way at once; ``b`` (whose source is ``a``)
    starts only after ``a`` of its seed ended; a failed run is reported and the rest still
    run; every finished run is kept, and a second call runs nothing."""
    import threading
    import time

    root, results = tmp_path / "repo", tmp_path / "repo" / "results"
    lock, events, live, most = threading.Lock(), [], [0], [0]

    def run_one(method: str, seed: int) -> Path:
        with lock:
            events.append(("start", method, seed))
            live[0] += 1
            most[0] = max(most[0], live[0])
        time.sleep(0.2)
        with lock:
            live[0] -= 1
            events.append(("end", method, seed))
        if (method, seed) == ("c", 1):
            raise sweep.RunFailed("c-seed1 failed (exit 1; log)\ntail")
        return _fake_run(root / "outputs", root, method, seed, 0.5)

    after = {"b": "a"}.get
    failed = sweep.run_grid(["a", "b", "c"], [0, 1], run_one, results, jobs=2, after=after)
    assert failed == ["c-seed1 failed (exit 1; log)"]
    assert most[0] == 2
    for seed in (0, 1):
        assert events.index(("end", "a", seed)) < events.index(("start", "b", seed))
    assert sweep.Kept(results).names() == ["a-seed0", "a-seed1", "b-seed0", "b-seed1", "c-seed0"]
    events.clear()
    assert sweep.run_grid(["a", "b"], [0, 1], run_one, results, jobs=2, after=after) == []
    assert events == []
    with pytest.raises(ValueError, match="wait for each other"):
        sweep.run_grid(["x", "y"], [0], run_one, results, jobs=2, after={"x": "y", "y": "x"}.get)


@pytest.mark.parametrize("jobs", [1, 2])
def test_run_grid_starts_no_run_after_its_time_limit(sweep, tmp_path, jobs) -> None:
    """``stop_at``: the runs under way when it passes finish and are kept; none starts after
    it, and the runs left out are one failure message."""
    import time

    root, results = tmp_path / "repo", tmp_path / "repo" / "results"
    started = []
    stop_at = time.monotonic() + 0.3

    def run_one(method: str, seed: int) -> Path:
        started.append(run_name := f"{method}-seed{seed}")
        time.sleep(0.4)  # the first run (both, with jobs=2) ends after the limit
        assert run_name
        return _fake_run(root / "outputs", root, method, seed, 0.5)

    failed = sweep.run_grid(["a", "b", "c"], [0], run_one, results, jobs=jobs, stop_at=stop_at)
    assert started == ["a-seed0", "b-seed0"][:jobs]
    assert sweep.Kept(results).names() == started
    assert failed == [f"{3 - jobs} run(s) not started: the time limit was reached"]
    assert sweep.run_grid(["a", "b", "c"], [0], run_one, results, jobs=jobs) == []
    assert sweep.Kept(results).names() == ["a-seed0", "b-seed0", "c-seed0"]


def test_runs_written_into_the_results_folder_stay_loose(sweep, tmp_path) -> None:
    def run_one(method: str, seed: int) -> Path:
        return _fake_run(tmp_path, tmp_path, method, seed, 0.5)

    assert sweep.run_grid(["fedprox"], [0], run_one, tmp_path) == []
    assert not (tmp_path / sweep.ARCHIVE).exists()
    assert sweep.load_runs(tmp_path, ["fedprox"], [0])["fedprox"][0].metrics == [
        {"round": 1, "test_accuracy": 0.5}
    ]


@pytest.mark.parametrize("suffix", [".tar.xz", ".tar.gz"])
def test_archive_bytes_depend_only_on_the_files(sweep, tmp_path, suffix: str) -> None:
    files = {"b-seed0/metrics.jsonl": b"{}\n", "a-seed0/config.yaml": b"seed: 0\n"}
    sweep.write_archive(tmp_path / f"one{suffix}", files)
    sweep.write_archive(tmp_path / f"two{suffix}", dict(reversed(list(files.items()))))
    assert (tmp_path / f"one{suffix}").read_bytes() == (tmp_path / f"two{suffix}").read_bytes()
    assert sweep.read_archive(tmp_path / f"one{suffix}") == files
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"one{suffix}", f"two{suffix}"]


def test_an_older_gz_archive_is_read_and_replaced_by_xz(sweep, tmp_path) -> None:
    old = {"fedavg-seed0/summary.json": b'{"final_accuracy": 0.3}'}
    sweep.write_archive(tmp_path / "runs.tar.gz", old)
    assert sweep.Kept(tmp_path).names() == ["fedavg-seed0"]
    assert sweep.load_runs(tmp_path, ["fedavg"])["fedavg"][0].summary == {"final_accuracy": 0.3}
    sweep.add_to_archive(tmp_path, {"feddf-seed0/summary.json": b"{}"})
    assert [p.name for p in tmp_path.iterdir()] == ["runs.tar.xz"]
    assert sweep.Kept(tmp_path).names() == ["fedavg-seed0", "feddf-seed0"]


def test_pack_moves_run_folders_into_the_archive_and_forget_drops_runs(sweep, tmp_path) -> None:
    for seed in (0, 1):
        _fake_run(tmp_path, tmp_path, "fedgo", seed, 0.5 + 0.1 * seed)
    (tmp_path / "fedgo-seed1" / "separation.json").write_text("{}")
    (tmp_path / "table.md").write_text("| table |\n")
    before = sweep.load_runs(tmp_path, ["fedgo"])
    assert sweep.pack(tmp_path) == ["fedgo-seed0", "fedgo-seed1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.tar.xz", "table.md"]
    assert sweep.load_runs(tmp_path, ["fedgo"]) == before
    assert sweep.Kept(tmp_path).names("separation.json") == ["fedgo-seed1"]
    sweep.forget(tmp_path, ["fedgo-seed0"])
    assert sweep.Kept(tmp_path).names() == ["fedgo-seed1"]
    ran = []

    def run_one(method: str, seed: int) -> Path:
        ran.append(f"{method}-seed{seed}")
        return _fake_run(tmp_path, tmp_path, method, seed, 0.5)

    assert sweep.run_grid(["fedgo"], [0, 1], run_one, tmp_path) == []
    assert ran == ["fedgo-seed0"]


def test_the_share_outside_compute_spreads_the_clients_over_the_workers() -> None:
    """``benchmarks/overhead.py`` (also used by ``scale.py``): a round's compute is its clients'
    training over the workers that ran at once (never more workers than clients), plus the
    server's phases; round 1 (data loading) is left out of the share."""
    overhead = load_benchmark("overhead")
    row = {"client_time_sum": 6.0, "clients_replied": 3, "aggregate_time": 1.0, "eval_time": 0.5}
    assert overhead.round_compute(row, 2) == pytest.approx(4.5)  # 6 / 2 + 1 + 0.5
    assert overhead.round_compute(row, 8) == pytest.approx(3.5)  # 3 clients: 3 workers at most
    assert overhead.round_compute({"eval_time": 2.0}, 2) == pytest.approx(2.0)
    rows = [
        {"round": 0, "round_time": 9.0},
        {"round": 1, "round_time": 50.0, **row},  # round 1: left out
        {"round": 2, "round_time": 5.0, **row},
        {"round": 3, "round_time": 6.0, **row},
        {"round": 4, "round_time": 7.0, **row},
    ]
    assert overhead.outside_share(rows, 2) == pytest.approx(1 - 4.5 / 6.0)
    assert overhead.outside_share(rows, 1) == pytest.approx(1 - 7.5 / 6.0)  # serial: negative
    # The clients' set-up around their training: handlers minus training, over the workers.
    assert overhead.setup_share(rows, 2) is None  # no handler times: no split
    timed = [{**r, "client_handler_time_sum": 7.2} if r["round"] > 0 else r for r in rows]
    assert overhead.setup_share(timed, 2) == pytest.approx((7.2 - 6.0) / 2 / 6.0)


# -- archives from elsewhere: nothing leaves its folder (issue 49) ----------------------------


def _tar(path: Path, members) -> None:
    """``path`` (.tar.xz / .tar.gz by name) holding ``(name, bytes)`` files or ``TarInfo``s."""
    import io
    import tarfile

    with tarfile.open(path, "w:xz" if path.name.endswith(".xz") else "w:gz") as tar:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
                continue
            info = tarfile.TarInfo(member[0])
            info.size = len(member[1])
            tar.addfile(info, io.BytesIO(member[1]))


def _link(name: str, target: str):
    import tarfile

    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (("../summary.json", b"{}"), "'../summary.json' has an empty, '.' or '..' component"),
        (("/abs/summary.json", b"{}"), "'/abs/summary.json' is an absolute path"),
        (_link("a-seed0/summary.json", "/etc/passwd"), "is not a regular file"),
    ],
)
def test_a_results_archive_with_a_bad_member_is_not_read(sweep, tmp_path, member, why) -> None:
    _tar(tmp_path / sweep.ARCHIVE, [("a-seed0/summary.json", b"{}"), member])
    with pytest.raises(ValueError, match=why) as info:
        sweep.Kept(tmp_path)
    assert str(tmp_path / sweep.ARCHIVE) in str(info.value)


def test_a_data_archive_with_a_link_unpacks_nothing(sweep, tmp_path) -> None:
    """One error naming the member and the archive; not even the files before it are unpacked
    (the "data" filter alone would have stopped half-way)."""
    archive = tmp_path / "cifar.tar.gz"
    _tar(archive, [("cifar/train/0/a.jpg", b"x"), _link("cifar/evil", "/etc/passwd")])
    with pytest.raises(SystemExit, match=r"cifar.tar.gz: member 'cifar/evil' is neither a file"):
        sweep.ensure_data(tmp_path / "data", str(archive))
    assert list((tmp_path / "data").iterdir()) == []


def test_a_data_archive_is_not_unpacked_through_a_planted_link(sweep, tmp_path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "cifar").symlink_to(victim)
    archive = tmp_path / "cifar.tar.gz"
    _tar(archive, [("./cifar/train/0/a.jpg", b"x")])
    with pytest.raises(SystemExit, match="is a symbolic link this run did not make"):
        sweep.ensure_data(tmp_path / "data", str(archive))
    assert list(victim.iterdir()) == []


def test_a_data_archive_made_with_a_leading_dot_unpacks(sweep, tmp_path) -> None:
    import tarfile

    archive = tmp_path / "cifar.tar.gz"
    root = tarfile.TarInfo(".")  # what `tar -C tree -czf cifar.tar.gz .` starts with
    root.type = tarfile.DIRTYPE
    _tar(archive, [root, ("./cifar/train/0/a.jpg", b"x")])
    data = sweep.ensure_data(tmp_path / "data", str(archive))
    assert (data / "train" / "0" / "a.jpg").read_bytes() == b"x"


def test_a_table_is_written_over_a_planted_link_not_through_it(sweep, tmp_path, capsys) -> None:
    victim = tmp_path / "victim.md"
    victim.write_text("precious\n")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "table.md").symlink_to(victim)
    sweep.write_table(tmp_path / "results", "| a |")
    assert victim.read_text() == "precious\n"
    assert (tmp_path / "results" / "table.md").read_text() == "| a |\n"
    assert not (tmp_path / "results" / "table.md").is_symlink()
