"""Which processes used the CPU, and when, while a command ran: a start-up's critical path.

    python -m benchmarks.process_timeline [--every 0.1] [--until SECONDS] [--out FILE] -- CMD ...

runs ``CMD`` and samples every process of the machine every ``--every`` seconds from
``/proc`` (its start time, its user + system CPU seconds, its command line) until ``CMD``
exits, then prints two tables, from the first sample after ``CMD`` started to ``--until``
seconds after it (default: its end):

- per process that started in that window: when it started, its CPU seconds in the window and
  its command (Flower's SuperLink, SuperExec, ``flwr run``, the simulation process, Ray's GCS,
  raylet, agents and workers, ...);
- per second: how many cores were busy (the CPU seconds all processes used in that second) and
  the processes that used most.

A second with one core busy on a two-core machine is time that work in another process could
have used: that is where start-up can be shortened by starting something earlier; seconds
with every core busy shorten only with less work. ``--out`` keeps the samples (JSON lines)
for :func:`summarise` later. Processes stopped with SIGSTOP (state ``T``) are left out, so a
benchmark paused beside it does not count. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

Sample = dict  # {"t": epoch seconds, "p": [[pid, start epoch, cpu seconds, command], ...]}


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime"):
            return float(line.split()[1])
    raise OSError("no btime in /proc/stat")


def stat_fields(pid: int | str) -> tuple[str, list[str]] | None:
    """``/proc/<pid>/stat``: the process's name and its fields after the name (``[0]`` its
    state, ``[1]`` its parent, ``[11]``/``[12]`` user/system ticks, ``[19]`` its start in
    ticks after boot, ``[21]`` its resident pages); ``None`` if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name, _, rest = stat.partition("(")[2].rpartition(")")
    return name, rest.split()


def sample_processes(boot: float, hz: int, skip: int | None = None) -> Sample:
    """One sample of every running process (not stopped ones) but ``skip``."""
    rows = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == skip:
            continue
        stat = stat_fields(pid)
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if stat is None:
            continue
        name, fields = stat
        if fields[0] == "T":  # stopped (SIGSTOP): paused work beside the measurement
            continue
        cpu = (int(fields[11]) + int(fields[12])) / hz
        start = boot + int(fields[19]) / hz
        cmd = raw.replace(b"\0", b" ").decode(errors="replace").strip() or f"[{name}]"
        rows.append([int(pid), round(start, 2), round(cpu, 2), cmd[:200]])
    return {"t": time.time(), "p": rows}


def short_name(cmd: str) -> str:
    """A readable name: the script or executable a command runs (``python -m X``: X)."""
    parts = cmd.split()
    if not parts:
        return cmd
    if parts[0].startswith("ray::"):
        return cmd.split(".")[0].strip()
    if len(parts) > 2 and parts[1] == "-m":
        return parts[2]
    for part in parts[1:] if "python" in Path(parts[0]).name else parts[:1]:
        if not part.startswith("-"):
            return Path(part).name
    return Path(parts[0]).name


def summarise(samples: Sequence[Sample], start: float, end: float) -> tuple[list[dict], list[dict]]:
    """The two tables of the module's docstring, from ``samples`` between ``start`` and
    ``end`` (epoch seconds): processes (``pid``, ``started`` s after ``start``, ``cpu_s`` in
    the window, ``name``) and seconds (``second``, ``cores`` busy, ``top``: the most-using
    names with their CPU seconds)."""
    window = [s for s in samples if start <= s["t"] <= end]
    if len(window) < 2:
        return [], []
    procs: dict[int, dict] = {}
    seconds: dict[int, dict] = {}
    for prev, cur in zip(window, window[1:], strict=False):
        before = {p[0]: p[2] for p in prev["p"]}
        k = int(cur["t"] - start)
        slot = seconds.setdefault(k, {"second": k, "cpu": 0.0, "span": 0.0, "by": {}})
        slot["span"] += cur["t"] - prev["t"]
        for pid, started, cpu, cmd in cur["p"]:
            # a process new since the last sample used all its CPU in this interval
            used = cpu - before.get(pid, 0.0 if started >= prev["t"] - 0.01 else cpu)
            if used <= 0:
                continue
            slot["cpu"] += used
            name = short_name(cmd)
            slot["by"][name] = slot["by"].get(name, 0.0) + used
            if started >= start - 1.0:  # started with the command (1 s: the clock's grain)
                entry = procs.setdefault(
                    pid, {"pid": pid, "started": started - start, "cpu_s": 0.0, "name": cmd}
                )
                entry["cpu_s"] += used
    process_rows = sorted(
        (
            dict(p, cpu_s=round(p["cpu_s"], 2), started=round(p["started"], 2))
            for p in procs.values()
        ),
        key=lambda p: (p["started"], p["pid"]),
    )
    second_rows = []
    for k in sorted(seconds):
        slot = seconds[k]
        top = sorted(slot["by"].items(), key=lambda kv: -kv[1])[:4]
        second_rows.append(
            {
                "second": k,
                "cores": round(slot["cpu"] / slot["span"], 2) if slot["span"] else 0.0,
                "top": [(name, round(v, 2)) for name, v in top],
            }
        )
    return process_rows, second_rows


def format_tables(processes: Iterable[dict], seconds: Iterable[dict]) -> str:
    lines = ["| started (s) | CPU (s) | process |", "|---:|---:|---|"]
    total = 0.0
    for p in processes:
        if p["cpu_s"] < 0.05:
            continue
        total += p["cpu_s"]
        lines.append(f"| {p['started']:.2f} | {p['cpu_s']:.2f} | `{p['name'][:100]}` |")
    lines.append(f"| | **{total:.2f}** | all processes that started with the command |")
    lines += ["", "| second | cores busy | most |", "|---:|---:|---|"]
    for s in seconds:
        most = ", ".join(f"{name} {v:.2f}" for name, v in s["top"])
        lines.append(f"| {s['second']} | {s['cores']:.2f} | {most} |")
    return "\n".join(lines) + "\n"


def record(
    command: Sequence[str], every: float, out: Path | None
) -> tuple[list[Sample], float, float, int]:
    """Run ``command`` while sampling; its samples, start, end and exit status."""
    boot, hz = _boot_time(), os.sysconf("SC_CLK_TCK")
    samples: list[Sample] = []
    done = threading.Event()

    def sampler() -> None:
        while not done.is_set():
            samples.append(sample_processes(boot, hz, skip=os.getpid()))
            done.wait(every)

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    time.sleep(every)
    started = time.time()
    status = subprocess.call(list(command))
    ended = time.time()
    done.set()
    thread.join()
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(json.dumps(s) + "\n" for s in samples))
    return samples, started, ended, status


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--every", type=float, default=0.1, help="seconds between samples")
    parser.add_argument("--until", type=float, default=None, help="seconds after the start")
    parser.add_argument("--out", type=Path, default=None, help="keep the samples here")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run")
    samples, started, ended, status = record(command, args.every, args.out)
    end = ended if args.until is None else started + args.until
    print(format_tables(*summarise(samples, started, end)), file=sys.stderr)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
