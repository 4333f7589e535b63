#!/usr/bin/env bash
# fedgo-flwr entry point. Sets up .venv on first use, then:
#   ./run.sh [CONFIG.yaml] [dotted.key=value ...]   run an experiment as a Flower simulation
#                                                   (results: outputs/<name>/<date-time>/)
#   ./run.sh --local [CONFIG.yaml] [k=v ...]        the same in one process, no Ray (debugging)
#   ./run.sh --stop [FLOWER_HOME ...]               stop the runs this checkout's run.sh started
#   ./run.sh --tests [pytest args]                  run the test suite
#   ./run.sh --setup                                only create/update .venv
#   ./run.sh --report RUN_DIR... [--out DIR]        plots and tables of finished runs
#   ./run.sh --sweep VARIANT... --seeds tuning|report [--baseline NAME] [--out DIR] [--archive F] [k=v ...]
#                                                   variants x seeds: mean, 95% CI, paired tests
# FEDGO_SUPERNODES=N simulates N nodes (default: one per client); each serves its share of the
# clients in turn. Each run keeps its SuperLink's address, logs and configs in a Flower home of
# its own, .flwr/run.XXXXXX (FEDGO_FLWR_HOMES=DIR: DIR/run.XXXXXX), removed after success.
# The simulation runs on a SuperLink this script starts on a free local port and stops again
# (by its process id) when the run ends; its dependencies come from .venv, never from a
# per-run `uv sync`. The script's and the SuperLink's process ids are in the home's `pids` file,
# for `--stop` (a run whose terminal is gone, or a script killed with SIGKILL).
set -euo pipefail

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
  # as `flwr run .`, without Flower walking every file of .venv/ (fedgo_flwr/app/staging.py).
  prepared="$("$PY" -m fedgo_flwr.app.cli prepare "$config" "$@" --run-toml "$run_toml" \
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
  flwr run "$FLWR_HOME/app" fedgo --run-config "$run_toml" --federation-config "$federation" --stream &
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
    # pytest-xdist workers, a test file to a worker (a file's tests share fixtures); tests
    # marked `alone` then run with nothing beside them (tests/side_by_side.py).
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
    exec "$PY" -m fedgo_flwr.experiment.report "$@"
    ;;
  --sweep)
    shift
    setup
    export FEDGO_WORKDIR="${FEDGO_WORKDIR:-$ROOT}"
    exec "$PY" -m fedgo_flwr.app.sweep "$@"
    ;;
  --local)
    shift
    setup
    export FEDGO_WORKDIR="${FEDGO_WORKDIR:-$ROOT}"
    exec "$PY" -m fedgo_flwr.app.inprocess "${1:-conf/default.yaml}" "${@:2}"
    ;;
  --stop)
    shift
    stop_runs "$@"
    ;;
  -h|--help)
    sed -n '2,18p' "$0"
    ;;
  *)
    setup
    run_experiment "$@"
    ;;
esac
