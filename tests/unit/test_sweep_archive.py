"""The sweep's archive: finished runs' records packed, restored elsewhere, nothing else kept."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from fedgo_flwr.app.sweep.archive import RECORDS, pack, restore


def _run(folder, final: float, finished: bool = True) -> None:
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(f"seed: {folder.name[4:]}\noutput_dir: {folder}\n")
    (folder / "metrics.jsonl").write_text(json.dumps({"round": 1, "test_accuracy": final}) + "\n")
    (folder / "checkpoint.pt").write_bytes(b"\0" * 64)
    (folder / "run.log").write_text("log\n")
    if finished:
        (folder / "summary.json").write_text(json.dumps({"final_accuracy": final}))


def _members(archive) -> list[str]:
    with tarfile.open(archive) as tar:
        return sorted(tar.getnames())


def test_finished_runs_records_go_elsewhere_and_come_back(tmp_path) -> None:
    out, archive = tmp_path / "out", tmp_path / "kept" / "runs.tar.xz"
    _run(out / "fedavg" / "seed100", 0.25)
    _run(out / "feddf.v2" / "seed101", 0.5)
    _run(out / "feddf.v2" / "seed102", 0.75, finished=False)  # stopped half-way: not kept
    assert pack(archive, out) == ["fedavg/seed100", "feddf.v2/seed101"]
    assert _members(archive) == sorted(
        f"{run}/{name}" for run in ("fedavg/seed100", "feddf.v2/seed101") for name in RECORDS
    )
    assert not archive.with_name("runs.tar.xz.partial").exists()

    elsewhere = tmp_path / "elsewhere"
    assert restore(archive, elsewhere) == ["fedavg/seed100", "feddf.v2/seed101"]
    for run in ("fedavg/seed100", "feddf.v2/seed101"):
        assert sorted(p.name for p in (elsewhere / run).iterdir()) == sorted(RECORDS)
        for name in ("metrics.jsonl", "summary.json"):
            assert (elsewhere / run / name).read_bytes() == (out / run / name).read_bytes()
        # the machine's folder is not kept: the run's place in --out instead
        assert str(tmp_path) in (out / run / "config.yaml").read_text()
        seed = run.split("/seed")[1]
        assert (elsewhere / run / "config.yaml").read_text() == f"seed: {seed}\noutput_dir: {run}\n"
    assert restore(archive, elsewhere) == []  # already there


def test_a_run_finished_here_is_not_overwritten_and_archived_runs_are_kept(tmp_path) -> None:
    out, archive = tmp_path / "out", tmp_path / "runs.tar.xz"
    _run(out / "a" / "seed0", 0.25)
    pack(archive, out)
    here = tmp_path / "here"
    _run(here / "a" / "seed0", 0.9)  # finished here under the same name
    _run(here / "b" / "seed0", 0.5)
    assert restore(archive, here) == []
    assert (here / "a" / "seed0" / "summary.json").read_text() == '{"final_accuracy": 0.9}'
    # packing ``here`` keeps its own a/seed0, adds b/seed0
    assert pack(archive, here) == ["a/seed0", "b/seed0"]
    elsewhere = tmp_path / "elsewhere"
    restore(archive, elsewhere)
    assert (elsewhere / "a" / "seed0" / "summary.json").read_text() == '{"final_accuracy": 0.9}'
    # a run only the archive holds survives a pack of a folder without it
    assert pack(archive, tmp_path / "empty") == ["a/seed0", "b/seed0"]


def _archive_with(tmp_path, names: list[str]):
    archive = tmp_path / "bad.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"{}"))
    return archive


@pytest.mark.parametrize(
    "name",
    [
        "../a/seed0/summary.json",
        "a/seed0/checkpoint.pt",
        "/abs/seed0/summary.json",
        "a/summary.json",
    ],
)
def test_an_archive_holding_anything_but_run_records_is_refused(tmp_path, name) -> None:
    archive = _archive_with(tmp_path, [name])
    with pytest.raises(ValueError, match="is not a run record"):
        restore(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "a").exists()


def test_an_archived_run_without_a_summary_is_refused(tmp_path) -> None:
    archive = _archive_with(tmp_path, ["a/seed0/metrics.jsonl"])
    with pytest.raises(ValueError, match="a/seed0 has no summary.json"):
        restore(archive, tmp_path / "out")


def test_no_archive_restores_nothing(tmp_path) -> None:
    assert restore(tmp_path / "missing.tar.xz", tmp_path / "out") == []


def test_a_sweep_goes_on_when_its_archive_cannot_be_written(tmp_path, monkeypatch, capsys) -> None:
    """The runs matter more than their archive: a failed write is said, the sweep finishes."""
    from helpers import ROOT

    from fedgo_flwr.app.sweep import __main__ as cli

    out = tmp_path / "out"

    def fake_execute(jobs, parallel, say, on_done, stop_at=None):  # each job "finishes" at once
        for job in jobs:
            _run(job.folder, 0.5)
            on_done(job)
        return []

    def failing_pack(archive, folder):
        raise OSError("disk full")

    monkeypatch.setattr(cli, "execute", fake_execute)
    monkeypatch.setattr(cli, "pack", failing_pack)
    argv = [str(ROOT / "conf" / "default.yaml"), "--seeds", "0,1", "--out", str(out)]
    assert cli.main([*argv, "--archive", str(tmp_path / "runs.tar.xz")]) == 1  # not kept
    err = capsys.readouterr().err
    assert err.count("could not write") == 3 and "disk full" in err  # 2 runs, then the end
    assert (out / "table.md").is_file()
    assert sorted(p.parent.name for p in out.glob("default/seed*/summary.json")) == [
        "seed0",
        "seed1",
    ]
