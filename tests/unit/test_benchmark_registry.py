"""``python -m benchmarks list | run NAME | table NAME`` (``benchmarks/__main__.py``) and the
child-run engine it shares with ``python -m fedgo_app.sweep`` (``engine.py``).

The registry's answers to a bad command line (an unknown name names the known ones, once, with
exit 2 and no traceback), the list of specs, and the engine's process start: the log gets the
command and the output, a failure carries the exit code and the log's tail, a link planted at
the log is not followed, tasks wait for the task their ``after`` names, and an interrupt stops
the children under way.
"""

from __future__ import annotations

import sys
import threading
import time

import pytest
from benchmark_scripts import load_benchmark

from fedgo_app.sweep import engine


@pytest.fixture(scope="module")
def registry():
    return load_benchmark("__main__")


def test_list_names_every_spec_with_what_it_measures(registry, capsys) -> None:
    assert registry.main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == list(registry.SPECS)
    assert "fedgo_table3" in registry.SPECS and "cpfl_cohorts" in registry.SPECS
    for name in registry.SPECS:
        spec = registry.spec(name)
        assert spec.name == name and f"{name}: {spec.summary}" in lines


@pytest.mark.parametrize("command", ["run", "table"])
def test_an_unknown_name_is_one_line_naming_the_known_ones(registry, command, capsys) -> None:
    assert registry.main([command, "fedgo_tabel3", "--seeds", "0"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "python -m benchmarks: unknown benchmark 'fedgo_tabel3'; known: "
        + ", ".join(registry.SPECS)
    ]


@pytest.mark.parametrize("argv", [[], ["run"], ["lst"], ["list", "x"]])
def test_a_command_line_without_a_command_and_name_shows_the_usage(registry, argv, capsys):
    assert registry.main(argv) == 2
    assert capsys.readouterr().err.startswith("usage: python -m benchmarks list")


def test_bad_common_options_are_refused_by_every_spec(registry, capsys) -> None:
    for name in registry.SPECS:
        for argv in (["--jobs", "0"], ["--stop-after", "-1"], ["--sedes", "1"]):
            with pytest.raises(SystemExit) as exc:
                registry.spec(name).bench(argv)
            assert exc.value.code == 2, (name, argv)
    assert "--jobs: at least 1" in capsys.readouterr().err


def test_a_table_of_a_missing_results_folder_is_one_line(registry, tmp_path, capsys) -> None:
    missing = tmp_path / "none"
    assert registry.main(["table", "cpfl_cohorts", "--out", str(missing)]) == 1
    err = capsys.readouterr().err
    assert err == f"python -m benchmarks: cpfl_cohorts: no results folder {missing}\n"
    assert not missing.exists()


def test_a_bad_method_list_is_one_line(registry, capsys) -> None:
    argv = ["run", "coboosting_table1", "--methods", "coboosting", "fedavg"]
    assert registry.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("python -m benchmarks: coboosting_table1: --methods: unknown methods")
    assert "\n" not in err


# -- the engine ------------------------------------------------------------------------------


def test_a_child_logs_its_command_and_output_and_a_failure_carries_the_tail(tmp_path) -> None:
    log = tmp_path / "run" / "run.log"
    wall = engine.run_child([sys.executable, "-c", "print('hello')"], log)
    assert wall > 0
    first, second = log.read_text().splitlines()
    assert first.startswith("$ ") and first.endswith("-c print('hello')")
    assert second == "hello"
    code = "import sys; print('it broke'); sys.exit(3)"
    with pytest.raises(engine.ChildFailed) as info:
        engine.run_child([sys.executable, "-c", code], log, label="a-seed0")
    assert info.value.headline == f"a-seed0 failed (exit 3; {log}):"
    assert info.value.reason == "exit 3"
    assert str(info.value).endswith("it broke\n")
    assert log.read_text().splitlines().count("hello") == 1  # appended to, not replaced


def test_a_link_planted_at_the_log_is_not_followed(tmp_path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.log").symlink_to(victim)
    with pytest.raises(OSError):
        engine.run_child([sys.executable, "-c", "print('x')"], tmp_path / "run" / "run.log")
    assert victim.read_text() == "precious\n"


def test_tasks_run_side_by_side_wait_for_their_source_and_go_on_after_a_failure() -> None:
    lock, events = threading.Lock(), []

    def task(name: str, fail: bool = False):
        def run() -> str:
            with lock:
                events.append(("start", name))
            time.sleep(0.15)
            with lock:
                events.append(("end", name))
            if fail:
                raise engine.ChildFailed(f"{name} failed (exit 1; log)\ntail")
            return name

        return run

    tasks = [
        engine.Task("a", task("a")),
        engine.Task("b", task("b"), after="a"),
        engine.Task("c", task("c", fail=True)),
        engine.Task("d", task("d"), after="x"),  # x is not a task here: no wait
    ]
    said, kept = [], []
    results = engine.run_tasks(tasks, 2, say=said.append, on_done=lambda r: kept.append(r.value))
    assert {r.task.name: r.status for r in results} == {
        "a": "done",
        "b": "done",
        "c": "failed",
        "d": "done",
    }
    assert events.index(("end", "a")) < events.index(("start", "b"))
    assert set(events[:2]) == {("start", "a"), ("start", "c")}  # b waits: c takes the slot
    assert sorted(kept) == ["a", "b", "d"]
    assert any(
        line.startswith("sweep: [") and "c FAILED: c failed (exit 1" in line for line in said
    )
    with pytest.raises(ValueError, match="wait for each other: x, y"):
        engine.run_tasks([engine.Task("x", task("x"), "y"), engine.Task("y", task("y"), "x")])


def test_an_interrupt_stops_the_children_under_way(tmp_path) -> None:
    """Ctrl-C (here: raised where the first finished run is kept) ends the other run's process
    at once, not after its 60 s, and reaches the caller."""
    quick = engine.Task(
        "quick", lambda: engine.run_child([sys.executable, "-c", ""], tmp_path / "q")
    )
    slow_cmd = [sys.executable, "-c", "import time; time.sleep(60)"]
    slow = engine.Task("slow", lambda: engine.run_child(slow_cmd, tmp_path / "s"))

    def interrupt(result) -> None:
        time.sleep(0.5)  # the slow run's process is under way by now
        raise KeyboardInterrupt

    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        engine.run_tasks([quick, slow], 2, say=lambda line: None, on_done=interrupt)
    assert time.monotonic() - start < 30
    assert "time.sleep(60)" in (tmp_path / "s").read_text()


@pytest.mark.parametrize("name", ["fedgo_table3", "cpfl_cohorts", "switches"])
def test_a_spec_module_run_as_a_script_says_what_replaced_it(name: str) -> None:
    """``python -m benchmarks.<spec>`` (the command before the specs) must not exit 0 having
    done nothing: it exits with the command that runs the spec."""
    import runpy

    with pytest.raises(SystemExit) as exc:
        runpy.run_module(f"benchmarks.{name}", run_name="__main__")
    assert f"python -m benchmarks run|table {name}" in str(exc.value.code)
