"""The sweep's archive: finished runs' records packed, restored elsewhere, nothing else kept."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from fedgo_app.sweep.archive import RECORDS, pack, restore


def _run(folder, final: float, finished: bool = True) -> None:
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(f"seed: {folder.name[4:]}\noutput_dir: {folder}\n")
    (folder / "metrics.jsonl").write_text(json.dumps({"round": 1, "test_accuracy": final}) + "\n")
    (folder / "checkpoint.pt").write_bytes(b"\0" * 64)
    (folder / "run.log").write_text("log\n")
    (folder / "env.json").write_text(json.dumps({"git": {"commit": "a" * 40, "dirty": False}}))
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
        for name in ("metrics.jsonl", "summary.json", "env.json"):
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

    from fedgo_app.sweep import __main__ as cli

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


# -- an untrusted archive and a planted link: nothing leaves --out (issue 49) -----------------


def _tar(archive, members) -> None:
    """``archive`` holding ``members``: ``(name, bytes)`` files, or ``TarInfo`` as given."""
    with tarfile.open(archive, "w:xz") as tar:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
                continue
            name, data = member
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


GOOD = [("ok/seed0/summary.json", b"{}"), ("ok/seed0/metrics.jsonl", b'{"round": 0}\n')]


def _special(name: str, kind: bytes, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


def _files_under(folder) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (("../seed1/summary.json", b"{}"), "is not a run record"),  # leaves --out
        (("../../seed1/summary.json", b"{}"), "is not a run record"),
        (("./seed1/summary.json", b"{}"), "is not a run record"),
        (("a/../seed1/summary.json", b"{}"), "is not a run record"),
        (_special("a/seed0/config.yaml", tarfile.SYMTYPE, "/etc/passwd"), "a symbolic link"),
        (_special("a/seed0/config.yaml", tarfile.LNKTYPE, "ok/seed0/summary.json"), "hard link"),
        (_special("a/seed0/config.yaml", tarfile.CHRTYPE), "a device"),
        (_special("a/seed0/config.yaml", tarfile.FIFOTYPE), "a named pipe"),
        (("ok/seed0/summary.json", b"[1, 2]"), "not a JSON object"),
        (("ok/seed0/summary.json", b"{bad"), "cannot be read"),
        (("ok/seed0/env.json", b'"a string"'), "not a JSON object"),
        (("ok/seed0/config.yaml", b"- a list\n"), "not a YAML mapping"),
        (("ok/seed0/metrics.jsonl", b'{"round": 0}\n[1]\n'), "line 2 is not a JSON object"),
        (("ok/seed0/metrics.jsonl", b'{"round": "1"}\n'), "line 1 is not a JSON object"),
    ],
)
def test_a_bad_member_refuses_the_whole_archive_naming_it(tmp_path, member, why) -> None:
    """One error names the member and the archive; not even the good run beside it is written,
    and nothing appears outside --out."""
    work = tmp_path / "work"
    out, archive = work / "out", tmp_path / "runs.tar.xz"
    members = [member, *GOOD] if isinstance(member, tarfile.TarInfo) else [*GOOD, member]
    if not isinstance(member, tarfile.TarInfo) and member[0].startswith("ok/"):
        members = [m for m in GOOD if m[0] != member[0]] + [member]
    _tar(archive, members)
    name = member.name if isinstance(member, tarfile.TarInfo) else member[0]
    with pytest.raises(ValueError, match=why) as info:
        restore(archive, out)
    assert str(archive) in str(info.value) and repr(name) in str(info.value)
    assert "nothing of the archive is restored" in str(info.value)
    assert not work.exists()  # neither --out nor anything beside it


def test_a_record_named_twice_is_refused(tmp_path) -> None:
    archive = tmp_path / "runs.tar.xz"
    _tar(archive, [*GOOD, ("ok/seed0/summary.json", b'{"x": 1}')])
    with pytest.raises(ValueError, match="'ok/seed0/summary.json' is there twice"):
        restore(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("planted", ["variant", "run", "record"])
def test_restoring_never_writes_through_a_planted_link(tmp_path, planted) -> None:
    """A link in --out (at the variant's folder, the run's, or one record) refuses the restore
    before any file is written; the link's target is untouched."""
    out, archive, victim = tmp_path / "out", tmp_path / "runs.tar.xz", tmp_path / "victim"
    (victim / "seed0").mkdir(parents=True)
    (victim / "seed0" / "config.yaml").write_text("precious\n")
    _tar(archive, [*GOOD, ("v/seed0/summary.json", b"{}"), ("v/seed0/config.yaml", b"a: 1\n")])
    if planted == "variant":
        out.mkdir()
        (out / "v").symlink_to(victim)
    elif planted == "run":
        (out / "v").mkdir(parents=True)
        (out / "v" / "seed0").symlink_to(victim / "seed0")
    else:
        (out / "v" / "seed0").mkdir(parents=True)
        (out / "v" / "seed0" / "config.yaml").symlink_to(victim / "seed0" / "config.yaml")
    before = _files_under(out)
    with pytest.raises(ValueError, match="is a symbolic link this run did not make") as info:
        restore(archive, out)
    assert str(archive) in str(info.value)
    assert (victim / "seed0" / "config.yaml").read_text() == "precious\n"
    assert _files_under(victim) == ["seed0", "seed0/config.yaml"]
    assert _files_under(out) == before  # not even the good run ok/seed0


def test_pack_reads_nothing_through_a_link_and_keeps_the_rest(tmp_path, caplog) -> None:
    out, archive, elsewhere = tmp_path / "out", tmp_path / "runs.tar.xz", tmp_path / "elsewhere"
    _run(out / "a" / "seed0", 0.25)
    _run(elsewhere / "seed0", 0.9)  # someone else's finished run
    (out / "b").symlink_to(elsewhere)
    with caplog.at_level("WARNING"):
        assert pack(archive, out) == ["a/seed0"]
    assert "b/seed0 not archived" in caplog.text and "symbolic link" in caplog.text
    assert _members(archive) == sorted(f"a/seed0/{name}" for name in RECORDS)


def test_the_committed_sweep_archives_still_restore(tmp_path) -> None:
    """The checks refuse nothing a sweep writes: the archives in benchmarks/results restore."""
    from helpers import ROOT

    archives = sorted((ROOT / "benchmarks" / "results").glob("*/*/runs.tar.xz"))
    assert archives  # the headline report's sweeps (<variant>/seed<N>/<record>)
    for archive in archives:
        out = tmp_path / archive.parent.name
        runs = restore(archive, out)
        assert runs and all((out / run / "summary.json").is_file() for run in runs)


def test_the_sweep_command_refuses_a_bad_archive_in_one_line(tmp_path, capsys) -> None:
    """Exit 2 before anything runs, one line naming the member and the archive, no traceback."""
    from helpers import ROOT

    from fedgo_app.sweep import __main__ as cli

    out, archive = tmp_path / "out", tmp_path / "runs.tar.xz"
    _tar(archive, [("../seed1/summary.json", b"{}"), ("../seed1/config.yaml", b"a: 1\n")])
    argv = [str(ROOT / "conf" / "default.yaml"), "--seeds", "1", "--out", str(out)]
    assert cli.main([*argv, "--archive", str(archive), "--table-only"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "'../seed1/summary.json' is not a run record" in err and str(archive) in err
    assert not (tmp_path / "seed1").exists() and not out.exists()


def test_the_sweep_refuses_a_planted_link_at_a_run_folder(tmp_path, capsys) -> None:
    """A run folder that is a link is refused before anything runs (the child would write its
    files, and the sweep its run.log, into the link's target)."""
    from helpers import ROOT

    from fedgo_app.sweep import __main__ as cli

    out, victim = tmp_path / "out", tmp_path / "victim"
    victim.mkdir()
    (out / "default").mkdir(parents=True)
    (out / "default" / "seed1").symlink_to(victim)
    argv = [str(ROOT / "conf" / "default.yaml"), "--seeds", "1", "--out", str(out)]
    assert cli.main([*argv, "--table-only"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"{out / 'default' / 'seed1'} is a symbolic link" in err
    assert list(victim.iterdir()) == []


def test_the_sweep_refuses_a_planted_link_at_a_runs_env_json(tmp_path, capsys) -> None:
    """The table reads each run's env.json: a link there is refused, never read through."""
    from helpers import ROOT

    from fedgo_app.sweep import __main__ as cli

    out, secret = tmp_path / "out", tmp_path / "secret.json"
    secret.write_text('{"git": {"commit": "' + "f" * 40 + '"}}')
    _run(out / "default" / "seed1", 0.5)
    (out / "default" / "seed1" / "env.json").unlink()
    (out / "default" / "seed1" / "env.json").symlink_to(secret)
    argv = [str(ROOT / "conf" / "default.yaml"), "--seeds", "1", "--out", str(out)]
    assert cli.main([*argv, "--table-only"]) == 2
    err = capsys.readouterr().err
    link = out / "default" / "seed1" / "env.json"
    assert "Traceback" not in err and f"{link} is a symbolic link" in err
    assert not (out / "table.md").exists()


def test_an_archive_spoiled_during_the_sweep_is_said_and_the_runs_go_on(
    tmp_path, monkeypatch, capsys
) -> None:
    """The archive read back when a run finishes may have been replaced since the restore: one
    line says it could not be written, and the sweep finishes its runs and table."""
    from helpers import ROOT

    from fedgo_app.sweep import __main__ as cli

    out, archive = tmp_path / "out", tmp_path / "runs.tar.xz"

    def fake_execute(jobs, parallel, say, on_done, stop_at=None):
        _tar(archive, [("../seed9/summary.json", b"{}")])  # planted after the restore
        for job in jobs:
            _run(job.folder, 0.5)
            on_done(job)
        return []

    monkeypatch.setattr(cli, "execute", fake_execute)
    argv = [str(ROOT / "conf" / "default.yaml"), "--seeds", "0", "--out", str(out)]
    assert cli.main([*argv, "--archive", str(archive)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("could not write") == 2
    assert "'../seed9/summary.json' is not a run record" in err
    assert (out / "table.md").is_file() and not (tmp_path / "seed9").exists()


def test_restoring_never_follows_a_link_planted_after_the_check(tmp_path, monkeypatch) -> None:
    """Every record's path passes the check, then, as the run ``v/seed0`` is written, its
    variant's folder becomes a link to another folder: the write refuses it (each folder
    below --out opened with ``O_NOFOLLOW``) with the same one error, and nothing is written
    into the link's target (before: the record was written there)."""
    from fedgo_app.sweep import archive as sweep_archive
    from fedgo_flwr.runtime import fileio

    out, tar, victim = tmp_path / "out", tmp_path / "runs.tar.xz", tmp_path / "victim"
    (victim / "seed0").mkdir(parents=True)  # a folder the records would land in
    members = [*GOOD, ("v/seed0/summary.json", b"{}"), ("v/seed0/config.yaml", b"a: 1\n")]
    _tar(tar, members)
    real, calls = fileio.path_inside, []

    def checked_then_planted(folder, name, what=""):
        path = real(folder, name, what)
        calls.append(name)
        variant = out / "v"
        if len(calls) > len(members) and name.startswith("v/") and not variant.is_symlink():
            if variant.exists():  # made by the restore before it wrote: moved away
                variant.rename(tmp_path / "moved")
            variant.symlink_to(victim, target_is_directory=True)
        return path

    monkeypatch.setattr(fileio, "path_inside", checked_then_planted)
    monkeypatch.setattr(sweep_archive, "path_inside", checked_then_planted)
    with pytest.raises(ValueError, match="is a symbolic link this run did not make") as info:
        restore(tar, out)
    assert str(tar) in str(info.value)
    assert _files_under(victim) == ["seed0"]
