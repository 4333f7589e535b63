#!/usr/bin/env bash
# Start one Flower SuperNode (client machine) of a fedgo-flwr deployment: TLS to the SuperLink,
# authenticated with this node's private key. Its public key must be registered on the
# SuperLink first (`flwr supernode register`); an unregistered key is refused (Flower logs
# "Failed to activate SuperNode", "Exit Code: 305", and the process exits with status 1).
# No per-run `uv sync`: dependencies come from this repo's .venv (./run.sh --setup).
#
#   deploy/supernode.sh --superlink HOST:PORT --ca CA_CRT --key PRIVATE_KEY \
#       --partition K --num-partitions N [--data-path DIR] [--state-dir DIR] [--port PORT] \
#       [--max-threads N] [--allow-faults] [--allow-code WHAT] [-- FLAGS...]
#
#   --superlink HOST:PORT  the SuperLink's address, as named in its certificate
#   --ca CA_CRT            the deployment's ca.crt (verifies the SuperLink's certificate)
#   --key PRIVATE_KEY      this node's key, e.g. supernode-keys/supernode-K
#   --partition K          which client this node is (0 .. N-1): node config partition-id
#   --num-partitions N     the federation size, = data.num_clients of the runs
#   --data-path DIR        where this machine keeps the dataset (node config data-path; not
#                          needed for the embedded digits / four_gaussians data)
#   --state-dir DIR        where this node keeps client state between rounds (node config
#                          state-dir; default $FLWR_HOME/client-state): never a folder the
#                          server names
#   --port PORT            local Runtime API port of this SuperNode (default 9094; give each
#                          SuperNode on the same machine its own)
#   --max-threads N        the most torch threads the server may ask for (node config
#                          max-threads; default: this machine's CPUs)
#   --allow-faults         obey the run config's deliberate `faults` (crash, hang, exit, ...)
#                          on this node (node config allow-faults); off by default: ignored
#   --allow-code WHAT      import Python code that the run config names (strategy.generator.
#                          module, a generator factory): "true" for any module, or a comma-
#                          separated list of modules / folders ("my_generators,/opt/gens");
#                          node config allow-code. Off by default: such a run is refused
#   -- FLAGS...            passed on to flower-supernode unchanged
#
# Environment: FLWR_HOME (default: <repo>/.flwr/supernode-K), FEDGO_VENV (default
# <repo>/.venv). Runs in the foreground (exec); stop it with Ctrl-C or SIGTERM.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FEDGO_VENV:-$ROOT/.venv}"

usage() { sed -n '2,35p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

SUPERLINK="" CA="" KEY="" PARTITION="" NUM="" DATA="" STATE="" PORT=9094 THREADS="" FAULTS=false
CODE=""
EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --superlink) SUPERLINK="$2"; shift 2 ;;
    --ca) CA="$2"; shift 2 ;;
    --key) KEY="$2"; shift 2 ;;
    --partition) PARTITION="$2"; shift 2 ;;
    --num-partitions) NUM="$2"; shift 2 ;;
    --data-path) DATA="$2"; shift 2 ;;
    --state-dir) STATE="$2"; shift 2 ;;
    --max-threads) THREADS="$2"; shift 2 ;;
    --allow-faults) FAULTS=true; shift ;;
    --allow-code) CODE="$2"; shift 2 ;;
    --port) PORT="$2"; shift 2 ;;
    --) shift; EXTRA+=("$@"); break ;;
    -h|--help) usage; exit 0 ;;
    *) echo "supernode.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
for name in SUPERLINK CA KEY PARTITION NUM; do
  [[ -n "${!name}" ]] || { echo "supernode.sh: missing argument for $name" >&2; usage >&2; exit 2; }
done
[[ "$PARTITION" =~ ^[0-9]+$ && "$NUM" =~ ^[0-9]+$ && "$PARTITION" -lt "$NUM" ]] || {
  echo "supernode.sh: need 0 <= --partition < --num-partitions" >&2
  exit 2
}
for f in "$CA" "$KEY"; do
  [[ -f "$f" ]] || { echo "supernode.sh: $f not found" >&2; exit 2; }
done
[[ -x "$VENV/bin/flower-supernode" ]] || {
  echo "supernode.sh: $VENV/bin/flower-supernode not found (run ./run.sh --setup)" >&2
  exit 2
}

NODE_CONFIG="partition-id=$PARTITION num-partitions=$NUM"
if [[ -n "$DATA" ]]; then
  [[ -d "$DATA" ]] || { echo "supernode.sh: --data-path $DATA is not a directory on this machine" >&2; exit 2; }
  DATA="$(cd "$DATA" && pwd)"  # absolute
  NODE_CONFIG+=" data-path=\"$DATA\""
fi

export FLWR_HOME="${FLWR_HOME:-$ROOT/.flwr/supernode-$PARTITION}"
export PATH="$VENV/bin:$PATH"
mkdir -p "$FLWR_HOME"

STATE="${STATE:-$FLWR_HOME/client-state}"
mkdir -p "$STATE"
STATE="$(cd "$STATE" && pwd)"  # absolute
NODE_CONFIG+=" state-dir=\"$STATE\" allow-faults=$FAULTS"
if [[ -n "$THREADS" ]]; then
  [[ "$THREADS" =~ ^[1-9][0-9]*$ ]] || { echo "supernode.sh: --max-threads needs an integer >= 1" >&2; exit 2; }
  NODE_CONFIG+=" max-threads=$THREADS"
fi
if [[ -n "$CODE" ]]; then
  [[ "$CODE" != *[\"\\]* ]] || { echo "supernode.sh: --allow-code must not hold quotes or backslashes" >&2; exit 2; }
  NODE_CONFIG+=" allow-code=\"$CODE\""
fi

exec flower-supernode \
  --superlink "$SUPERLINK" \
  --root-certificates "$CA" \
  --auth-supernode-private-key "$KEY" \
  --node-config "$NODE_CONFIG" \
  --port "$PORT" \
  ${EXTRA[@]+"${EXTRA[@]}"}
