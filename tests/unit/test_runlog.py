"""run.log (fedgo_flwr/records/runlog.py): Flower's log lines of a run, in its folder."""

from __future__ import annotations

import subprocess
import sys
from logging import INFO, WARNING

import pytest
from flwr.supercore import log

from fedgo_flwr.records.runlog import RUN_LOG, run_log


def test_lines_before_the_folder_is_known_are_held_then_written(tmp_path):
    with run_log() as handler:
        log(INFO, "start-up %d", 1)
        handler.open(tmp_path)
        log(WARNING, "a warning")
        log(10, "debug is left out")
    log(INFO, "after the run: not written")
    lines = (tmp_path / RUN_LOG).read_text().splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == ["INFO: start-up 1", "WARNING: a warning"]


def test_lines_are_appended_to_a_run_log_already_there(tmp_path):
    """A resumed run's earlier lines, or a wrapper's (a benchmark writing ./run.sh's output
    there), are kept."""
    (tmp_path / RUN_LOG).write_text("earlier\n")
    with run_log() as handler:
        handler.open(tmp_path)
        log(INFO, "resumed")
    lines = (tmp_path / RUN_LOG).read_text().splitlines()
    assert lines[0] == "earlier" and lines[1].endswith("INFO: resumed")


def test_the_error_that_ends_the_run_is_its_last_line(tmp_path):
    class ConfigError(ValueError):
        pass

    with pytest.raises(ConfigError), run_log() as handler:
        handler.open(tmp_path)
        raise ConfigError("strategy.mu = 'x': not a number")
    last = (tmp_path / RUN_LOG).read_text().splitlines()[-1]
    assert last.endswith("ERROR: run failed: ConfigError: strategy.mu = 'x': not a number")


def test_nothing_is_added_when_the_process_output_goes_to_run_log(tmp_path):
    """A sweep's child writes its whole output to <run>/run.log: no second copy of each line."""
    code = (
        "import sys; from pathlib import Path; from flwr.supercore import log; "
        "from fedgo_flwr.records.runlog import run_log\n"
        "with run_log() as h:\n"
        f"    h.open(Path({str(tmp_path)!r}))\n"
        "    log(20, 'once')\n"
    )
    with open(tmp_path / RUN_LOG, "a") as out:
        subprocess.run([sys.executable, "-c", code], stdout=out, stderr=out, check=True)
    assert (tmp_path / RUN_LOG).read_text().count("once") == 1
