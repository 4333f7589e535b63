#!/usr/bin/env bash
# A whole fedgo-flwr deployment on this machine, for trying the deployment path end to end:
# TLS credentials, a SuperLink with SuperNode authentication, the K = data.num_clients SuperNode
# keys registered, K SuperNodes (one process each, partition-id 0..K-1; they obey the config's
# `faults` and import the code it names: --allow-faults --allow-code true), one `flwr run` of
# the experiment with a node map (partition k: the node with key k), then everything this
# script started is stopped again.
#
#   deploy/local-federation.sh CONFIG.yaml [dotted.key=value ...]
#   deploy/local-federation.sh conf/fedavg.yaml rounds=2 data.num_clients=3 fraction=1.0
#
# Work files (credentials, FLWR_HOMEs, logs of every process) go to $FEDGO_DEPLOY_DIR
# (default <repo>/.flwr/local-federation); credentials there are reused by later calls.
# Exit status: 0 if the run wrote its summary.json, 2 for an invalid configuration (or an
# output_dir holding an earlier run, without resume=true or overwrite=true), else 1.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FEDGO_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
DIR="${FEDGO_DEPLOY_DIR:-$ROOT/.flwr/local-federation}"
CONNECTION=local-deploy

if [[ $# -lt 1 || "$1" == -h || "$1" == --help ]]; then
  sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  exit 2
fi
[[ -x "$PY" ]] || { echo "local-federation.sh: $PY not found (run ./run.sh --setup)" >&2; exit 2; }
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
export PATH="$VENV/bin:$PATH"
export FEDGO_WORKDIR="${FEDGO_WORKDIR:-$ROOT}"
cd "$ROOT"

# Validate the experiment first (nothing starts on a bad key) and get K and the output dir.
# The app's files are staged into $DIR/app, which `flwr run` submits: the same FAB as
# `flwr run .`, without Flower walking every file of .venv/ (fedgo_app/staging.py).
rm -rf "$DIR/app"
prepared="$("$PY" -m fedgo_app.cli prepare "$@" --run-toml "$DIR/run-config.toml" \
  --stage "$DIR/app")" || exit 2
K="$(sed -n 1p <<< "$prepared" | sed -n 's/.*num-supernodes=\([0-9]*\).*/\1/p')"
OUT_DIR="$(sed -n 2p <<< "$prepared")"
[[ -n "$K" && "$K" -gt 0 ]] || { echo "local-federation.sh: cannot read K" >&2; exit 1; }
STARTED="$DIR/started"  # this run's summary.json must be newer (an old one proves nothing)
touch "$STARTED"

CRED="$DIR/credentials"
if [[ ! -f "$CRED/ca.crt" || ! -f "$CRED/supernode-keys/supernode-$((K - 1))" ]]; then
  "$PY" "$ROOT/deploy/make-credentials.py" "$CRED" --supernodes "$K" --force
fi

# shellcheck source=proc.sh
source "$ROOT/deploy/proc.sh"  # free_port, stop_tree
PIDS=()
stop_all() {
  stop_tree ${PIDS[@]+"${PIDS[@]}"}
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

PORT="$(free_port "$PY")"
LOGS="$DIR/logs"
mkdir -p "$LOGS"
echo "local-federation: SuperLink on 127.0.0.1:$PORT (TLS, SuperNode auth), $K SuperNodes;" \
  "logs in $LOGS" >&2
FLWR_HOME="$DIR/superlink" setsid "$ROOT/deploy/superlink.sh" "$CRED" \
  --host 127.0.0.1 --port "$PORT" > "$LOGS/superlink.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 120); do
  "$PY" -c "import socket,sys; s=socket.socket(); sys.exit(s.connect_ex(('127.0.0.1',$PORT)))" \
    && break
  kill -0 "${PIDS[0]}" 2>/dev/null || {
    echo "local-federation: the SuperLink failed to start; see $LOGS/superlink.log" >&2
    exit 1
  }
  sleep 0.5
done

# The flwr CLI's connection: address plus the CA that signed the SuperLink's certificate.
export FLWR_HOME="$DIR/cli"
mkdir -p "$FLWR_HOME"
cat > "$FLWR_HOME/config.toml" <<EOF
[superlink]
default = "$CONNECTION"

[superlink.$CONNECTION]
address = "127.0.0.1:$PORT"
root-certificates = "$CRED/ca.crt"
EOF

for k in $(seq 0 $((K - 1))); do
  flwr supernode register "$CRED/supernode-keys/supernode-$k.pub" "$CONNECTION" \
    > "$LOGS/register-$k.log" 2>&1 || {
    echo "local-federation: registering supernode-$k failed:" >&2
    cat "$LOGS/register-$k.log" >&2
    exit 1
  }
done

# Partition k belongs to the SuperNode authenticated with key k, whatever a node claims
# (run config node-map: fedgo_app/discovery.py).
"$PY" - "$CRED/supernode-keys" "$K" "$DIR/node-map.json" "$DIR/run-config.toml" <<'PYEOF'
import json, sys
from pathlib import Path
keys, k, out, toml = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
lines = {str(i): (keys / f"supernode-{i}.pub").read_text().strip() for i in range(k)}
out.write_text(json.dumps(lines, indent=1) + "\n")
with toml.open("a") as f:
    f.write(f"node-map = {json.dumps(str(out))}\n")
PYEOF

for k in $(seq 0 $((K - 1))); do
  FLWR_HOME="$DIR/supernode-$k" setsid "$ROOT/deploy/supernode.sh" \
    --superlink "127.0.0.1:$PORT" --ca "$CRED/ca.crt" \
    --key "$CRED/supernode-keys/supernode-$k" \
    --partition "$k" --num-partitions "$K" --port "$(free_port "$PY")" --allow-faults \
    --allow-code true \
    > "$LOGS/supernode-$k.log" 2>&1 &
  PIDS+=($!)
done

status=0
flwr run "$DIR/app" "$CONNECTION" --run-config "$DIR/run-config.toml" --stream || status=$?
# `flwr run` exits 0 even when the ServerApp raised; the summary file is the proof of success.
if [[ "$status" -eq 0 ]] && ! [[ -f "$OUT_DIR/summary.json" && "$OUT_DIR/summary.json" -nt "$STARTED" ]]; then
  echo "local-federation: the run failed (no new $OUT_DIR/summary.json); see the log above" >&2
  status=1
fi
exit "$status"
