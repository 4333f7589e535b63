#!/usr/bin/env bash
# Start the Flower SuperLink of a fedgo-flwr deployment (Flower 1.42 deployment engine):
# TLS on, SuperNode authentication on (only SuperNodes whose public key was registered with
# `flwr supernode register` may join), no per-run `uv sync` of the app's dependencies (they come
# from this repo's .venv, which must exist: ./run.sh --setup).
#
#   deploy/superlink.sh CRED_DIR [--host ADDR] [--port PORT] [--database FILE] [-- FLAGS...]
#
#   CRED_DIR         holds ca.crt, server.pem, server.key (deploy/make-credentials.py); the
#                    certificate must name the address SuperNodes and `flwr` use (its SANs)
#   --host ADDR      address to listen on (default 127.0.0.1; 0.0.0.0 for other machines)
#   --port PORT      the one HTTPS port of the SuperLink (default 9093): Fleet API for the
#                    SuperNodes, Control API for `flwr`, Runtime API for the ServerApp
#   --database FILE  keep registered SuperNodes and runs across restarts (default: in memory,
#                    so keys must be registered again after a restart)
#   -- FLAGS...      passed on to flower-superlink unchanged
#
# Environment: FLWR_HOME (default: <repo>/.flwr/superlink; apps submitted by `flwr run` are
# installed there), FEDGO_WORKDIR (default: <repo>; relative output_dirs of runs are resolved
# against it, on this machine), FEDGO_VENV (default: <repo>/.venv).
# Runs in the foreground (exec); stop it with Ctrl-C or SIGTERM.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FEDGO_VENV:-$ROOT/.venv}"

usage() { sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

[[ $# -ge 1 && "$1" != -* ]] || { usage >&2; exit 2; }
CRED="$1"
shift
HOST=127.0.0.1
PORT=9093
EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --host) HOST="$2"; shift 2 ;;
    --port) PORT="$2"; shift 2 ;;
    --database) [[ "$2" = /* ]] && db="$2" || db="$PWD/$2"; EXTRA+=(--database "$db"); shift 2 ;;
    --) shift; EXTRA+=("$@"); break ;;
    -h|--help) usage; exit 0 ;;
    *) echo "superlink.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
for f in ca.crt server.pem server.key; do
  [[ -f "$CRED/$f" ]] || { echo "superlink.sh: $CRED/$f not found" >&2; exit 2; }
done
[[ -x "$VENV/bin/flower-superlink" ]] || {
  echo "superlink.sh: $VENV/bin/flower-superlink not found (run ./run.sh --setup)" >&2
  exit 2
}
CRED="$(cd "$CRED" && pwd)"

export FLWR_HOME="${FLWR_HOME:-$ROOT/.flwr/superlink}"
export FEDGO_WORKDIR="${FEDGO_WORKDIR:-$ROOT}"
export PATH="$VENV/bin:$PATH"
mkdir -p "$FLWR_HOME"
cd "$FEDGO_WORKDIR"

exec flower-superlink \
  --ssl-ca-certfile "$CRED/ca.crt" \
  --ssl-certfile "$CRED/server.pem" \
  --ssl-keyfile "$CRED/server.key" \
  --enable-supernode-auth \
  --disable-runtime-dependency-installation \
  --host "$HOST" --port "$PORT" \
  ${EXTRA[@]+"${EXTRA[@]}"}
