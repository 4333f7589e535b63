"""This project side by side with other FL simulators on one FedAvg experiment (issue 53).

    python -m benchmarks.peers_speed prepare [--peers flower,pfl,flgo,fedlab]
    python -m benchmarks.peers_speed run --experiment cross-device [--repeats 3] [k=v ...]
    python -m benchmarks.peers_speed table --out .cache/peers/runs/cross-device

``prepare`` builds one virtual environment per peer under ``--cache`` (default
``.cache/peers/<peer>``) from the package registry, with the versions of :data:`REQUIREMENTS`.
torch 2.14.1 and torchvision 0.29.1, the project's, are installed once into ``_torch/site``
(pip's ``--target``) and every peer venv sees them through a ``.pth`` line, so the venvs build
in seconds and every framework runs the same torch; a peer's own pins of other packages win
(its ``site-packages`` comes first). Each venv's ``pip freeze`` goes to ``<peer>.freeze.txt``;
a peer that cannot be installed leaves ``<peer>.error.txt`` (pip's last lines), which ``run``
and ``table`` carry into its row.

``run`` writes the experiment's shared files once (``benchmarks/peers_setting.py``:
``export_shared``), then runs every framework one after another, ``--repeats`` times, each in
a fresh run folder with the peer's own translated config, and records per run: wall time to
the end of the last round, time per round after the first, start-up (process start to the end
of the initial evaluation, when round 1 starts), the training images of every round and the
seconds per 1,000 of them in each round after the first, whether the rounds trained
``partition.json``'s schedule, the process tree's peak resident memory (sampled from ``/proc``
every 0.2 s, and the largest single process's from ``wait4``) and the final test accuracy, in
``results.json``. A round's clients and images come from the runner's ``rounds.jsonl``; the
project's modes train the schedule by construction (their strategies draw with the same
``sample_clients``), so theirs come from the schedule and the partition, for every round in
which all sampled clients replied (``metrics.jsonl``'s ``clients_replied``). Every process
gets the experiment's ``threads`` (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``;
``torch.set_num_threads`` in the runners).
``table`` writes ``table.md`` from ``results.json``: medians over the repeats (seconds per
1,000 images: the median over every round after the first of every successful repeat) and each
framework's ratio to ``./run.sh``'s; its notes say which frameworks trained the schedule; a
framework that failed or could not be installed has its error in its row.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.peers_setting import (
    FRAMEWORKS,
    PEERS,
    PROJECT_MODES,
    ROOT,
    Experiment,
    Launch,
    export_shared,
    load_experiment,
    translate,
)
from benchmarks.process_timeline import stat_fields

CACHE = ROOT / ".cache" / "peers"
TORCH = ("torch==2.14.1", "torchvision==0.29.1")
REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "flower": ("flwr[simulation]==1.42.0",),
    "pfl": ("pfl[pytorch]==0.6.0",),
    "flgo": ("flgo==0.4.4",),
    "fedlab": ("fedlab==1.3.0",),
}
"""What each peer's venv installs (the versions current on the registry when this was written;
the plain Flower app uses the project's Flower)."""
RESULTS = "results.json"
TIMEOUT_S = 3600.0


# ------------------------------------------------------------------------------------------
# prepare: the venvs
# ------------------------------------------------------------------------------------------


def _pip(python: str | Path, args: Sequence[str], log: Path) -> subprocess.CompletedProcess:
    with log.open("a") as f:
        f.write(f"$ {python} -m pip {' '.join(args)}\n")
        f.flush()
        return subprocess.run(
            [str(python), "-m", "pip", *args], stdout=f, stderr=subprocess.STDOUT, check=False
        )


def _tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    kept = [line for line in text.splitlines() if "is ignored: it is neither" not in line]
    return "\n".join(kept[-lines:])


def torch_layer(cache: Path) -> Path:
    """``cache/_torch/site`` with torch and torchvision (:data:`TORCH`), installed once."""
    site = cache / "_torch" / "site"
    done = cache / "_torch" / "complete"
    if done.exists() and done.read_text().strip() == " ".join(TORCH):
        return site
    shutil.rmtree(cache / "_torch", ignore_errors=True)
    site.mkdir(parents=True)
    log = cache / "_torch" / "install.log"
    result = _pip(sys.executable, ["install", "--quiet", "--target", str(site), *TORCH], log)
    if result.returncode != 0:
        raise SystemExit(f"cannot install {' '.join(TORCH)} (see {log}):\n{_tail(log)}")
    done.write_text(" ".join(TORCH) + "\n")
    return site


def venv_python(cache: Path, peer: str) -> Path:
    return cache / peer / "bin" / "python"


def prepare_peer(cache: Path, peer: str, layer: Path) -> str | None:
    """Build (or keep, if its requirements did not change) ``cache/<peer>``; return ``None``,
    or the install error, also written to ``cache/<peer>.error.txt``."""
    venv, want = cache / peer, "\n".join(REQUIREMENTS[peer]) + "\n"
    marker, error = venv / ".peers-ready", cache / f"{peer}.error.txt"
    if marker.exists() and marker.read_text() == want:
        return None
    shutil.rmtree(venv, ignore_errors=True)
    error.unlink(missing_ok=True)
    log = cache / f"{peer}.install.log"
    log.write_text("")
    base = getattr(sys, "_base_executable", sys.executable)
    made = subprocess.run([base, "-m", "venv", str(venv)], capture_output=True, text=True)
    if made.returncode != 0:
        message = f"python -m venv failed: {made.stderr.strip()[-500:]}"
    else:
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        (venv / "lib" / version / "site-packages" / "_peers_torch.pth").write_text(f"{layer}\n")
        result = _pip(venv_python(cache, peer), ["install", "--quiet", *REQUIREMENTS[peer]], log)
        if result.returncode == 0:
            freeze = subprocess.run(
                [str(venv_python(cache, peer)), "-m", "pip", "freeze"],
                capture_output=True,
                text=True,
                check=False,
            )
            (cache / f"{peer}.freeze.txt").write_text(freeze.stdout)
            marker.write_text(want)
            return None
        message = f"pip install {' '.join(REQUIREMENTS[peer])} failed:\n{_tail(log)}"
    error.write_text(message + "\n")
    return message


def prepare(cache: Path, peers: Sequence[str]) -> dict[str, str | None]:
    cache.mkdir(parents=True, exist_ok=True)
    layer = torch_layer(cache)
    outcome = {}
    for peer in peers:
        print(f"peers_speed: preparing {peer} ...", file=sys.stderr, flush=True)
        outcome[peer] = prepare_peer(cache, peer, layer)
        print(f"peers_speed: {peer}: {outcome[peer] or 'ready'}", file=sys.stderr, flush=True)
    return outcome


def install_error(cache: Path, framework: str) -> str | None:
    """Why ``framework``'s venv is missing (its error file, or "not prepared"); ``None``: ready."""
    if framework in PROJECT_MODES:
        return None
    error = cache / f"{framework}.error.txt"
    if error.exists():
        return error.read_text().strip()
    if not (cache / framework / ".peers-ready").exists():
        return "not installed: run `python -m benchmarks.peers_speed prepare` first"
    return None


def versions(cache: Path, framework: str) -> dict[str, str]:
    """The pinned versions of a peer's venv (its freeze file), or the project's packages."""
    if framework in PROJECT_MODES:
        from importlib import metadata

        names = ("torch", "flwr", "ray", "numpy")
        return {n: metadata.version(n) for n in names}
    freeze = cache / f"{framework}.freeze.txt"
    pins = {}
    for line in freeze.read_text().splitlines() if freeze.exists() else ():
        name, sep, version = line.partition("==")
        if sep:
            pins[name.lower()] = version
    torch_site = cache / "_torch" / "complete"
    if torch_site.exists():  # the shared layer's, which pip freeze may not list
        pins.setdefault("torch", TORCH[0].split("==")[1])
    return pins


# ------------------------------------------------------------------------------------------
# run: one framework at a time, measured from outside
# ------------------------------------------------------------------------------------------


def _tree_rss(root: int) -> int:
    """Summed resident memory (bytes) of ``root`` and all its descendants, from ``/proc``."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        stat = stat_fields(entry.name) if entry.name.isdigit() else None
        if stat is None:
            continue
        try:
            pid, ppid, pages = int(entry.name), int(stat[1][1]), int(stat[1][21])
        except (ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(pid)
        rss[pid] = pages * os.sysconf("SC_PAGE_SIZE")
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total


def measure(command: Sequence[str], env: dict[str, str], log: Path, timeout: float) -> dict:
    """Run ``command`` (its own session, output to ``log``); return its start time, exit
    status, wall time, the tree's sampled peak memory and the largest process's (``wait4``)."""
    peak = [0]
    with log.open("w") as out:
        started = time.time()
        proc = subprocess.Popen(
            list(command),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            peak[0] = max(peak[0], _tree_rss(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    def stop() -> None:  # TERM first: run.sh and local-federation.sh stop what they started
        for sig, grace in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 0.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            if done.wait(grace):
                return

    timer = threading.Timer(timeout, stop)
    timer.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
        done.set()
        sampler.join()
        try:  # whatever the run left behind in its session
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "started": started,
        "exit": proc.returncode,
        "process_s": time.time() - started,
        "peak_tree_rss_mb": peak[0] / 2**20,
        "peak_process_rss_mb": usage.ru_maxrss / 1024,
    }


def load_partition(shared: Path) -> dict:
    """``shared/partition.json``: ``clients`` (each client's image indices) and ``schedule``."""
    return json.loads((shared / "partition.json").read_text())


def round_ends(
    framework: str,
    run_dir: Path,
    out_dir: Path | None,
    started: float,
    partition: dict | None = None,
) -> dict:
    """Seconds from process start to the end of each round (0: the initial evaluation), each
    training round's clients and images (``trained``: ``{round: {"clients", "images"}}``), the
    initial and the final accuracy: the project's ``metrics.jsonl`` (``elapsed`` counts from
    ``run.sh``'s start, or from ``$FEDGO_STARTED`` for the deployment) and ``summary.json``,
    else the runner's ``rounds.jsonl`` and ``result.json``. A project round's clients are the
    ``schedule``'s of ``partition`` (``partition.json``), which the project's strategies draw,
    when all of them replied; a round with a missing reply has no ``trained`` entry."""
    ends: dict[int, float] = {}
    trained: dict[int, dict] = {}
    initial = None  # the initial model's accuracy: the same in every framework (same weights)
    if framework in PROJECT_MODES:
        assert out_dir is not None
        schedule = (partition or {}).get("schedule", [])
        sizes = [len(c) for c in (partition or {}).get("clients", [])]
        for line in (out_dir / "metrics.jsonl").read_text().splitlines():
            row = json.loads(line)
            r = int(row["round"])
            ends[r] = float(row["elapsed"])
            if r == 0:
                initial = row.get("test_accuracy")
            elif r <= len(schedule):
                replied, sampled = row.get("clients_replied"), row.get("clients_sampled")
                if replied is not None and replied == sampled == len(schedule[r - 1]):
                    clients = list(schedule[r - 1])
                    trained[r] = {"clients": clients, "images": sum(sizes[k] for k in clients)}
        summary = json.loads((out_dir / "summary.json").read_text())
        return {
            "ends": ends,
            "trained": trained,
            "final_accuracy": summary["final_accuracy"],
            "initial": initial,
        }
    for line in (run_dir / "rounds.jsonl").read_text().splitlines():
        row = json.loads(line)
        r = int(row["round"])
        ends[r] = float(row["time"]) - started
        if r == 0:
            initial = row.get("accuracy")
        elif row.get("images") is not None:
            trained[r] = {"clients": row.get("clients"), "images": int(row["images"])}
    result = json.loads((run_dir / "result.json").read_text())
    return {
        "ends": ends,
        "trained": trained,
        "final_accuracy": result["final_accuracy"],
        "initial": initial,
    }


def summarize_images(
    ends: dict[int, float], trained: dict[int, dict], rounds: int, schedule: list[list[int]]
) -> dict:
    """``images_per_round`` (rounds 1 to ``rounds``; ``None``: not recorded), the seconds per
    1,000 training images of every round after the first (``s_per_1000_images_rounds``: round
    ``r``'s time, ``ends[r] - ends[r - 1]``, over its images; rounds without both are left out)
    and their median (``s_per_1000_images``), and ``followed_schedule``: whether every round
    trained the clients of ``schedule[r - 1]`` (as sets; ``None``: some round's clients are not
    recorded)."""
    images = [trained.get(r, {}).get("images") for r in range(1, rounds + 1)]
    per_1000 = [
        1000.0 * (ends[r] - ends[r - 1]) / images[r - 1]
        for r in range(2, rounds + 1)
        if r in ends and r - 1 in ends and images[r - 1]
    ]
    clients = [trained.get(r, {}).get("clients") for r in range(1, rounds + 1)]
    followed = None
    if all(c is not None for c in clients) and len(schedule) >= rounds:
        followed = all(sorted(c) == sorted(schedule[r]) for r, c in enumerate(clients))
    return {
        "images_per_round": images,
        "s_per_1000_images_rounds": per_1000,
        "s_per_1000_images": statistics.median(per_1000) if per_1000 else None,
        "followed_schedule": followed,
    }


def summarize_run(ends: dict[int, float], rounds: int) -> dict:
    """Wall time to the last round, mean time per round after the first, start-up, and the
    first round alone (where a framework may start its workers)."""
    last = ends.get(rounds)
    after_first = first = None
    if rounds > 1 and last is not None and 1 in ends:
        after_first = (last - ends[1]) / (rounds - 1)
    if 0 in ends and 1 in ends:
        first = ends[1] - ends[0]
    return {
        "wall_s": last,
        "per_round_s": after_first,
        "startup_s": ends.get(0),
        "first_round_s": first,
    }


def run_one(
    framework: str, exp: Experiment, shared: Path, run_dir: Path, cache: Path, timeout: float
) -> dict:
    """One run of ``framework``: its record for ``results.json`` (``error`` on a failure)."""
    record: dict = {"framework": framework}
    error = install_error(cache, framework)
    if error is not None:
        return {**record, "error": error}
    shutil.rmtree(run_dir, ignore_errors=True)
    python = None if framework in PROJECT_MODES else venv_python(cache, framework)
    if framework in PROJECT_MODES:
        python = Path(os.environ.get("FEDGO_VENV", sys.prefix)) / "bin" / "python"
    try:
        launch: Launch = translate(framework, exp, shared, run_dir, python)
    except ValueError as exc:
        return {**record, "error": str(exc)}
    threads = str(exp.threads)
    env = {**os.environ, **launch.env, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    if framework not in PROJECT_MODES:  # a peer's venv imports nothing of this checkout
        env.pop("PYTHONPATH", None)
    env["FEDGO_STARTED"] = repr(time.time())  # the deployment's clock (run.sh sets its own)
    env["FEDGO_COMMAND"] = " ".join(launch.command)
    record["load_before"] = os.getloadavg()[0]  # 1-minute load: was the machine idle?
    measured = measure(launch.command, env, run_dir / "run.log", timeout)
    record.update(measured)
    try:
        partition = load_partition(shared)
        rounds = round_ends(framework, run_dir, launch.output_dir, measured["started"], partition)
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        tail = _tail(run_dir / "run.log", 8)
        return {**record, "error": f"exit {measured['exit']}, no records ({exc}): {tail}"}
    record.update(summarize_run(rounds["ends"], exp.rounds))
    record.update(
        summarize_images(rounds["ends"], rounds["trained"], exp.rounds, partition["schedule"])
    )
    record["final_accuracy"] = rounds["final_accuracy"]
    record["initial_accuracy"] = rounds["initial"]
    if measured["exit"] != 0:
        record["error"] = f"exit {measured['exit']}: {_tail(run_dir / 'run.log', 8)}"
    return record


def run(
    exp: Experiment,
    frameworks: Sequence[str],
    repeats: int,
    out: Path,
    cache: Path,
    timeout: float = TIMEOUT_S,
) -> list[dict]:
    """Every framework once per repeat, one after another; ``out/results.json`` is rewritten
    after each run."""
    from benchmarks.sweep import ensure_data

    data = Path(exp.data) if Path(exp.data).is_absolute() else ROOT / exp.data
    archive = os.environ.get("FEDGO_CIFAR10_ARCHIVE")
    if not (data / "train").is_dir() and not (archive and Path(archive).is_file()):
        raise SystemExit(
            f"peers_speed: no CIFAR-10 JPEG tree in {data} (no train/ folder): give it with the "
            "experiment's data=DIR, or its .tar.gz in $FEDGO_CIFAR10_ARCHIVE to unpack it there"
        )
    ensure_data(data, archive)
    shared = out / "shared"
    try:
        export_shared(exp, data, shared)
    except (ValueError, OSError) as exc:  # a ConfigError names the experiment key's project key
        raise SystemExit(
            f"peers_speed: cannot write the shared files into {shared}: {exc}"
        ) from None
    results: list[dict] = []
    meta = {
        "experiment": exp.__dict__,
        "cpus": os.cpu_count(),
        "versions": {f: versions(cache, f) for f in frameworks},
    }
    for repeat in range(repeats):
        for framework in frameworks:
            print(
                f"peers_speed: {framework}, repeat {repeat + 1}/{repeats}",
                file=sys.stderr,
                flush=True,
            )
            record = run_one(framework, exp, shared, out / f"{framework}-{repeat}", cache, timeout)
            record["repeat"] = repeat
            results.append(record)
            print(f"peers_speed: {json.dumps(record)}", file=sys.stderr, flush=True)
            (out / RESULTS).write_text(json.dumps({**meta, "runs": results}, indent=1) + "\n")
    return results


# ------------------------------------------------------------------------------------------
# table
# ------------------------------------------------------------------------------------------

COLUMNS = (
    ("wall_s", "wall to last round (s)"),
    ("per_round_s", "per round after the first (s)"),
    ("s_per_1000_images", "s per 1,000 images"),
    ("images_per_round", "images a round"),
    ("startup_s", "start-up (s)"),
    ("round1_end_s", "to the end of round 1 (s)"),
    ("peak_tree_rss_mb", "peak memory, all processes (MB)"),
    ("initial_accuracy", "initial accuracy"),  # equal everywhere: the same initial weights
    ("final_accuracy", "final accuracy"),
)
BASELINE = "fedgo-flwr"


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _pooled(runs: list[dict], key: str) -> list[float]:
    """``key``'s values over ``runs``: a list's items (every round of every run) or a figure."""
    values: list[float] = []
    for r in runs:
        value = r.get(key)
        if isinstance(value, list):
            values.extend(v for v in value if v is not None)
        elif value is not None:
            values.append(value)
    return values


POOLED = {"s_per_1000_images": "s_per_1000_images_rounds"}
"""Columns whose median is over the rounds of all repeats (the per-round list a run records),
not over each run's own median."""


def _column(runs: list[dict], key: str) -> list[float]:
    """``key``'s values over ``runs`` (:func:`_pooled`). ``round1_end_s``, process start to the
    end of round 1, is start-up plus the first round: a framework that starts its workers
    before round 1 (the project's node discovery) pays in start-up what another (the plain
    Flower app) pays in its first round, so this is the figure that compares them."""
    if key == "round1_end_s":
        return [
            r["startup_s"] + r["first_round_s"]
            for r in runs
            if r.get("startup_s") is not None and r.get("first_round_s") is not None
        ]
    return _pooled(runs, POOLED.get(key, key))


def table(results: dict) -> str:
    """``table.md``: per framework the median of each column over its successful repeats (s
    per 1,000 images and images a round: over every round, after the first for the former, of
    those repeats), the ratio of its wall time to ``./run.sh``'s, and the error of a framework
    with no success; the notes name the frameworks that trained ``partition.json``'s
    schedule."""
    runs = results.get("runs", [])
    frameworks = list(dict.fromkeys(r["framework"] for r in runs))
    ok = {f: [r for r in runs if r["framework"] == f and "error" not in r] for f in frameworks}
    medians = {f: {key: _median(_column(ok[f], key)) for key, _ in COLUMNS} for f in frameworks}
    base = medians.get(BASELINE, {}).get("wall_s")
    exp = results.get("experiment", {})
    lines = [
        f"FedAvg, {exp.get('num_clients')} clients, {exp.get('clients_per_round')} a round, "
        f"{exp.get('rounds')} rounds, {exp.get('local_epochs')} local epochs, batch "
        f"{exp.get('batch_size')}, lr {exp.get('lr')}, {exp.get('threads')} thread(s); "
        "medians over the successful repeats.",
        "",
        "| framework | runs ok | " + " | ".join(t for _, t in COLUMNS) + " | wall / ./run.sh |",
        "|---" * (len(COLUMNS) + 3) + "|",
    ]
    for f in frameworks:
        if not ok[f]:
            errors = [r.get("error", "") for r in runs if r["framework"] == f]
            text = " ".join(str(errors[-1]).split())[:300].replace("|", "/")
            lines.append(
                f"| {f} | 0/{len(errors)} | "
                + " | ".join("-" for _ in COLUMNS)
                + f" | error: {text} |"
            )
            continue
        cells = []
        for key, _ in COLUMNS:
            value = medians[f][key]
            cells.append(
                "-"
                if value is None
                else f"{value:.3f}"
                if key.endswith("accuracy") or key == "s_per_1000_images"
                else f"{value:.0f}"
                if key == "images_per_round"
                else f"{value:.1f}"
            )
        wall = medians[f]["wall_s"]
        ratio = "-" if not (base and wall) else f"{wall / base:.2f}"
        total = sum(r["framework"] == f for r in runs)
        lines.append(f"| {f} | {len(ok[f])}/{total} | " + " | ".join(cells) + f" | {ratio} |")
    followed = {f: {r.get("followed_schedule") for r in ok[f]} for f in frameworks if ok[f]}
    same = [f for f, v in followed.items() if v == {True}]
    other = [f for f, v in followed.items() if False in v]
    unknown = [f for f, v in followed.items() if v and v <= {None, True} and None in v]
    lines += [
        "",
        "s per 1,000 images: a round's seconds over the images its clients trained, median over "
        "the rounds after the first. The clients of partition.json's schedule every round: "
        + (", ".join(same) or "none")
        + "; other clients (their own sampler): "
        + (", ".join(other) or "none")
        + (f"; not recorded: {', '.join(unknown)}" if unknown else "")
        + ".",
    ]
    loads = [r["load_before"] for r in runs if r.get("load_before") is not None]
    if loads:
        lines += [
            "",
            f"1-minute load average before a run: {min(loads):.2f} to {max(loads):.2f} "
            f"({results.get('cpus')} CPUs); a timed table wants it near 0.",
        ]
    versions_ = results.get("versions", {})
    if versions_:
        lines += [
            "",
            "Versions: "
            + "; ".join(
                f"{f}: "
                + ", ".join(
                    f"{k} {v}"
                    for k, v in sorted(pins.items())
                    if k in ("torch", "flwr", "ray", "pfl", "flgo", "fedlab", "numpy")
                )
                for f, pins in versions_.items()
            ),
        ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------
# command line
# ------------------------------------------------------------------------------------------


def _names(text: str, allowed: Sequence[str]) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise SystemExit(f"peers_speed: unknown {unknown} (known: {', '.join(allowed)})")
    return names


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.peers_speed", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--cache", type=Path, default=CACHE, help="where the venvs are")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="build or update the peers' venvs")
    p.add_argument("--peers", default=",".join(PEERS))
    r = sub.add_parser("run", help="run every framework, --repeats times")
    r.add_argument(
        "--experiment",
        default="cross-device",
        help="a shape (cross-device, cross-silo, tiny) or a YAML file",
    )
    r.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results folder (default: <cache>/runs/<experiment name>)",
    )
    r.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds a run may take")
    r.add_argument("overrides", nargs="*", help="experiment key=value")
    t = sub.add_parser("table", help="table.md from results.json")
    t.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "prepare":
        outcome = prepare(args.cache, _names(args.peers, PEERS))
        failed = {k: v for k, v in outcome.items() if v}
        print(json.dumps({k: v or "ready" for k, v in outcome.items()}, indent=1))
        sys.exit(1 if failed and len(failed) == len(outcome) else 0)
    if args.command == "run":
        try:
            exp = load_experiment(args.experiment, args.overrides)
        except ValueError as exc:
            raise SystemExit(f"peers_speed: {exc}") from None
        out = (args.out or args.cache / "runs" / Path(args.experiment).stem).resolve()
        out.mkdir(parents=True, exist_ok=True)
        run(exp, _names(args.frameworks, FRAMEWORKS), args.repeats, out, args.cache, args.timeout)
        args.out = out
    path = args.out / RESULTS
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"peers_speed: cannot read {path}: {exc}") from None
    (args.out / "table.md").write_text(table(results))
    print(f"peers_speed: wrote {args.out / 'table.md'}", file=sys.stderr)


if __name__ == "__main__":
    main()
