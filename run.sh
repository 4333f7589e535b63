#!/usr/bin/env bash
# fedgo-flwr entry point: `./run.sh --help` says what it does (usage below). Each run records
# its script's and its SuperLink's process ids in its Flower home's `pids` file, for `--stop`.
set -euo pipefail

# Every mode and every environment variable this script, and the runs it starts, read
# (tests/unit/test_run_help.py keeps the list complete).
usage() {
  cat <<'EOF'
Usage: ./run.sh [MODE] [ARGS...]     (sets up .venv on first use, then runs MODE)

Modes:
  ./run.sh [CONFIG.yaml] [dotted.key=value ...]
        Run one experiment as a Flower simulation. CONFIG defaults to conf/default.yaml;
        a first argument key=value that is not a file is an override of that default.
        Results in outputs/<name>/<date-time>/ (metrics.jsonl, summary.json, model.pt,
        config.yaml, env.json, ...); outputs/<name>/latest links to the newest.
        A bad key or value stops it before anything starts (exit 2, one line naming it).
        Example: ./run.sh conf/fedprox.yaml data.alpha=0.05 seed=3
  ./run.sh --local [CONFIG.yaml] [k=v ...]
        The same experiment in one Python process, without Ray or a SuperLink (clients
        one after another; breakpoint() works): the same files and the same numbers.
  ./run.sh --report RUN_DIR... [--out DIR] [--label dir|strategy] [--target ACC]
        Plots and tables of finished runs (RUN_DIR: a run folder or a folder of runs) in
        --out (default report/); runs are grouped by folder name (seedN left out), or by
        strategy with --label strategy; --target: the accuracy "rounds to target" uses.
  ./run.sh --sweep VARIANT... --seeds tuning|report|N,N,... [--baseline NAME] [--out DIR]
           [--archive F.tar.xz] [--jobs N] [--stop-after S] [--metric KEY] [--table-only]
           [k=v ...]
        Variants x seeds, resumable: table.md, table.json (mean, 95% CI, paired tests
        against the baseline) and curves.png in --out (default outputs/sweep). A VARIANT
        is PATH.yaml, NAME=PATH.yaml or "NAME=PATH.yaml k=v ..." (one quoted word); a k=v
        outside a variant applies to all. Details: python -m fedgo_app.sweep --help
  ./run.sh --stop [FLOWER_HOME ...]
        Stop the runs this checkout's run.sh started (default: every run.* home under
        FEDGO_FLWR_HOMES or .flwr/), by the process ids each run recorded in its home's
        pids file: the script, its SuperLink and what they started; nothing found by name.
  ./run.sh --tests [pytest args]
        Run the test suite with pytest (about 12 minutes on two cores).
  ./run.sh --setup
        Only create or update .venv (done again whenever pyproject.toml changes).
  ./run.sh -h | --help
        This text.

Environment:
  PYTHON=python3.11       the Python that creates .venv (3.11 or later; default python3)
  FEDGO_VENV=DIR          the virtual environment to use, created if missing (default .venv;
                          that needs about 7 GB free unless torch is in it already)
  FEDGO_SKIP_DISK_CHECK=1 create it without checking the free space first
  FEDGO_SUPERNODES=N      simulate N nodes (default: one per client, data.num_clients);
                          with fewer, each node serves its share of the clients in turn
  FEDGO_FLWR_HOMES=DIR    where each run's Flower home run.XXXXXX goes (default .flwr/):
                          the SuperLink's address, configs and log; removed after a run that
                          succeeded, kept (less the app's files) after one that failed
  FEDGO_WORKDIR=DIR       the folder that outputs/ and a relative output_dir are in
                          (default: this repository's folder)
  FEDGO_ALLOW_FAULTS=1|0  let the config's faults act on the simulated clients (default 1)
  FEDGO_ALLOW_CODE=...    the code a config names (strategy.generator.module) that the
                          simulated clients may import: 1 (any; default), 0 (none), or a
                          comma-separated list of modules or folders
  FEDGO_TEST_WORKERS=N    --tests: pytest-xdist workers (default 2; auto; 0: one process)
  FEDGO_COMMAND=...       set by this script for the run it starts, not by users: the
  FEDGO_STARTED=...       command line typed and when (env.json's command, summary.json's
                          launch stage)
  RAY_ADDRESS=HOST:PORT   run the simulation on that running Ray cluster (its nodes' CPUs
                          and GPUs are checked against resources.client_cpus/client_gpus)

A run starts a SuperLink of its own on a free port of 127.0.0.1 and stops it, with all it
started, when the run ends or on Ctrl-C. The config keys: docs/configuration.md; how runs
work, and how to run them from Python: docs/running.md.
EOF
}

# What the user typed, and when (after the .venv check): a run records them (env.json's
# command; summary.json's "launch" stage), handed on in FEDGO_COMMAND and FEDGO_STARTED
# (fedgo_flwr/records/provenance.py).
COMMAND_LINE="$(printf '%q ' "$0" "$@")"
mark_start() {
  STARTED_AT="${EPOCHREALTIME:-$(date +%s)}"
  STARTED_AT="${STARTED_AT/,/.}"
}
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CALLER_DIR="$PWD"  # paths given to --stop are relative to it
cd "$ROOT"
VENV="${FEDGO_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"

setup() {
  local stamp="$VENV/.fedgo-stamp" want
  want="$(cat pyproject.toml | sha256sum | cut -d' ' -f1)"
  if [[ -x "$PY" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    return 0
  fi
  local python="${PYTHON:-python3}"
  if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "fedgo-flwr: needs Python >= 3.11 (Flower 1.42 does); $python is" \
      "$("$python" --version 2>&1 || echo missing). Set PYTHON=/path/to/python3.11" >&2
    exit 1
  fi
  # A full disk would stop pip halfway with "No space left on device": say so before starting,
  # unless torch is in the venv already (README's CPU build: nothing large left to install).
  local where free_kb need_gb=7 has_torch=""
  where="$(dirname "$VENV")"
  free_kb="$(df -Pk "$where" 2>/dev/null | awk 'NR == 2 {print $4}')"
  compgen -G "$VENV/lib/python3*/site-packages/torch" > /dev/null && has_torch=1
  if [[ -z "${FEDGO_SKIP_DISK_CHECK:-}" && -z "$has_torch" && "$free_kb" =~ ^[0-9]+$ ]] \
    && ((free_kb < need_gb * 1024 * 1024)); then
    echo "fedgo-flwr: not enough disk for $VENV: it needs about $need_gb GB free (torch" \
      "2.14.1 with its CUDA libraries is about 6 GB installed); $where has" \
      "$((free_kb / 1024)) MB free. Free some" \
      "space, set FEDGO_VENV=DIR on a larger disk, or FEDGO_SKIP_DISK_CHECK=1 to try anyway" \
      "(e.g. with a CPU-only torch, see README)" >&2
    exit 1
  fi
  echo "fedgo-flwr: setting up $VENV (first run: a few minutes; torch 2.14.1 with its CUDA" \
    "libraries is about 3 GB to download and 6 GB installed, see README for a CPU-only" \
    "torch) ..." >&2
  "$python" -m venv "$VENV"
  "$PY" -m pip install --quiet --upgrade pip
  # torch first, pinned (see pyproject.toml): pip must not resolve another build later.
  "$PY" -m pip install --quiet "torch==2.14.1" "torchvision==0.29.1"
  "$PY" -m pip install --quiet -e ".[dev]"
  echo "$want" > "$stamp"
}

# shellcheck source=deploy/proc.sh
source "$ROOT/deploy/proc.sh"  # free_port, stop_tree, record_pid, stop_recorded

# EXIT trap of a run: stop `flwr run` (it shares this script's process group, so by pid) and
# the SuperLink with everything below it; remove the Flower home unless the run failed, and
# from a failed run's the app's files (the staged app/ and Flower's unpacked apps/: about
# 1,300 copies of this repository's files), keeping its logs and configs.
cleanup() {
  trap '' INT TERM  # a second Ctrl-C must not cut the clean-up short
  if [[ -n "${FLWR_PID:-}" ]]; then kill "$FLWR_PID" 2>/dev/null || true; fi
  stop_tree "$SUPERLINK_PID" ${FLWR_PID:-}
  rm -f "$FLWR_HOME/pids"
  if finished "$OUT_DIR" "$STARTED"; then
    rm -rf "$FLWR_HOME"
  else
    rm -rf "$FLWR_HOME/app" "$FLWR_HOME/apps"
  fi
}

# Whether the run wrote its summary.json after MARKER was made: an earlier run's summary (kept
# in a resumed run's folder until its ServerApp starts) is no proof that this run succeeded.
finished() {
  [[ -f "$1/summary.json" && "$1/summary.json" -nt "$2" ]]
}

run_experiment() {
  local config="${1:-conf/default.yaml}"
  [[ $# -gt 0 ]] && shift
  # A Flower home of this invocation's own: `flwr run` reads the SuperLink address from
  # $FLWR_HOME/config.toml, so runs started side by side must not share one.
  local homes="${FEDGO_FLWR_HOMES:-$ROOT/.flwr}"
  mkdir -p "$homes"
  homes="$(cd "$homes" && pwd)"  # absolute: --stop finds the run's processes by FLWR_HOME
  export FLWR_HOME
  FLWR_HOME="$(mktemp -d "$homes/run.XXXXXX")"
  trap 'rm -rf "$FLWR_HOME"' EXIT
  export FEDGO_WORKDIR="${FEDGO_WORKDIR:-$ROOT}"
  # The simulated nodes are this user's processes running this user's config: they obey its
  # `faults` (a SuperNode of a deployment must opt in with node config allow-faults=true).
  export FEDGO_ALLOW_FAULTS="${FEDGO_ALLOW_FAULTS:-1}"
  # Likewise the code it names (strategy.generator.module): a SuperNode imports such code only
  # with node config allow-code (fedgo_flwr/runtime/trust.py).
  export FEDGO_ALLOW_CODE="${FEDGO_ALLOW_CODE:-1}"
  export PATH="$VENV/bin:$PATH"
  local run_toml="$FLWR_HOME/run-config.toml" prepared federation out_dir
  local port log pid status=0
  FLWR_PID=""  # globals, for the EXIT trap (cleanup)
  # The SuperLink starts first and boots (a few seconds of imports) while the config is
  # checked; if the check fails it is stopped again and the home removed: a bad config
  # leaves nothing behind.
  port="$(free_port "$PY")"
  log="$FLWR_HOME/superlink.log"
  cat > "$FLWR_HOME/config.toml" <<EOF
[superlink]
default = "fedgo"

[superlink.fedgo]
address = "127.0.0.1:$port"
insecure = true
EOF
  trap 'exit 130' INT
  trap 'exit 143' TERM
  # Flower's SuperExec asks the SuperLink for a new run every second by default: the run's
  # start waited 0.5 s on average for that.
  export FLWR_SUPEREXEC_TASK_POLL_INTERVAL="${FLWR_SUPEREXEC_TASK_POLL_INTERVAL:-0.2}"
  setsid flower-superlink --simulation --insecure --disable-runtime-dependency-installation \
    --host 127.0.0.1 --port "$port" > "$log" 2>&1 &
  pid=$!
  SUPERLINK_PID="$pid"
  trap 'stop_tree "$SUPERLINK_PID"; rm -rf "$FLWR_HOME"' EXIT
  record_pid "$FLWR_HOME/pids" run.sh "$$"
  record_pid "$FLWR_HOME/pids" superlink "$pid"
  # Validate the whole config: a bad key, or an output_dir that holds an earlier run
  # (without resume=true or overwrite=true), stops here (exit 2) before any run starts.
  # Then the run's folder is decided, once: output_dir, else a new outputs/<name>/<date-time>
  # (resume=true: the one outputs/<name>/latest names); the ServerApp is told which.
  # The app's files are linked into $FLWR_HOME/app, which `flwr run` bundles: the same FAB
  # as `flwr run .`, without Flower walking every file of .venv/ (fedgo_app/staging.py).
  prepared="$(FEDGO_COMMAND="$COMMAND_LINE" FEDGO_STARTED="$STARTED_AT" \
    "$PY" -m fedgo_app.cli prepare "$config" "$@" --run-toml "$run_toml" \
    --stage "$FLWR_HOME/app" ${FEDGO_SUPERNODES:+--supernodes "$FEDGO_SUPERNODES"})"
  federation="$(sed -n 1p <<< "$prepared")"
  out_dir="$(sed -n 2p <<< "$prepared")"
  STARTED="$FLWR_HOME/started"  # global, for the EXIT trap; summary.json must be newer
  touch "$STARTED"
  # Stop the SuperLink and everything it started on any exit. Its SuperExec runs in a session
  # of its own, with the simulation (ServerApp, Ray) under it: stop every descendant's group.
  OUT_DIR="$out_dir"
  trap cleanup EXIT
  for _ in $(seq 1 600); do
    if (exec 3<> "/dev/tcp/127.0.0.1/$port") 2> /dev/null; then
      break
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "fedgo-flwr: the SuperLink failed to start; see $log" >&2
      exit 1
    fi
    sleep 0.1
  done
  # In the background, so that a TERM to this script is handled at once (bash runs traps only
  # between commands, and `wait` is one).
  # Flower's notice that its default number of simulated nodes changed is left out: the run
  # sets its own (fedgo_app/noise.py, FLOWER_SUPERNODES_NOTICE).
  flwr run "$FLWR_HOME/app" fedgo --run-config "$run_toml" --federation-config "$federation" \
    --stream > >(grep --line-buffered -vF "default simulated SuperNodes changed from 10 to 2") &
  FLWR_PID=$!
  wait "$FLWR_PID" || status=$?
  FLWR_PID=""
  # `flwr run` exits 0 even when the ServerApp raised; a summary file written by this run (the
  # ServerApp writes it last, after model.pt) is the proof of success.
  if [[ "$status" -eq 0 ]] && ! finished "$out_dir" "$STARTED"; then
    echo "fedgo-flwr: the run failed (no new $out_dir/summary.json); see the log above." \
      "Flower's logs are in $FLWR_HOME" >&2
    status=1
  fi
  exit "$status"
}

# --stop [FLOWER_HOME ...]: stop the runs of these Flower homes (default: every run.* home under
# .flwr/ or $FEDGO_FLWR_HOMES, each run that this checkout's run.sh started and that still runs),
# by the process ids recorded in each home (deploy/proc.sh, stop_recorded); nothing else.
stop_runs() {
  local homes="${FEDGO_FLWR_HOMES:-$ROOT/.flwr}" arg home any=0
  if [[ $# -eq 0 ]]; then  # as run_experiment names them: relative to this checkout
    shopt -s nullglob
    set -- "$homes"/run.*/pids
    set -- "${@%/pids}"
  else  # named on the command line: relative to the caller's folder
    cd "$CALLER_DIR"
  fi
  for arg in "$@"; do
    if ! home="$(cd "$arg" 2>/dev/null && pwd)"; then
      echo "fedgo-flwr: no folder $arg" >&2
      continue
    fi
    if [[ ! -f "$home/pids" ]]; then
      echo "fedgo-flwr: $home is no Flower home of a running run.sh run (no pids file)" >&2
      continue
    fi
    if stop_recorded "$home"; then any=1; fi
  done
  if [[ "$any" -eq 0 ]]; then
    echo "fedgo-flwr: no run of this checkout's run.sh was running (homes: $homes)"
  fi
}

case "${1:-}" in
  --setup)
    setup
    ;;
  --tests)
    shift
    setup
    export PATH="$VENV/bin:$PATH"
    # FEDGO_TEST_WORKERS=N (or auto; default 2, 0 = one process, e.g. for --pdb): N
    # pytest-xdist workers, a test file to a worker (a file's tests share fixtures).
    # Python's bytecode cache on for the tests whatever the shell says: with
    # PYTHONDONTWRITEBYTECODE set, every worker re-compiles the project and re-writes the test
    # modules' asserts, and every process a test starts compiles the project again (0.3 s each).
    unset PYTHONDONTWRITEBYTECODE
    workers="${FEDGO_TEST_WORKERS:-2}"
    if [[ "$workers" != "0" ]]; then
      set -- -n "$workers" --dist loadfile "$@"
    fi
    exec "$PY" -m pytest "$@"
    ;;
  --report)
    shift
    setup
    exec "$PY" -m fedgo_flwr.records.report "$@"
    ;;
  --sweep)
    shift
    setup
    export FEDGO_WORKDIR="${FEDGO_WORKDIR:-$ROOT}"
    exec "$PY" -m fedgo_app.sweep "$@"
    ;;
  --local)
    shift
    setup
    mark_start
    export FEDGO_WORKDIR="${FEDGO_WORKDIR:-$ROOT}"
    export FEDGO_COMMAND="$COMMAND_LINE" FEDGO_STARTED="$STARTED_AT"
    exec "$PY" -m fedgo_app.inprocess "${1:-conf/default.yaml}" "${@:2}"
    ;;
  --stop)
    shift
    stop_runs "$@"
    ;;
  -h|--help)
    usage
    ;;
  -*)
    echo "fedgo-flwr: unknown option $1 (./run.sh --help lists the modes)" >&2
    exit 2
    ;;
  *)
    setup
    mark_start
    run_experiment "$@"
    ;;
esac
