#!/usr/bin/env bash
# The FedGO Table-3 headline rows on the report seeds (issue 36), seed-major, one run at a time:
# conf/bench/cifar10-cpu-bn.yaml at alpha 0.1 (FedAvg, FedDF, FedGO with the paper's 30
# discriminator epochs, FedGO with server-referenced discriminators) and at alpha 0.05 (FedDF,
# server-referenced FedGO). Resumable: run it again and finished runs are skipped. Each run's
# server holds one torch thread, so the sweep runs two at a time on two cores (a ResNet-8's
# steps: 1.80x one thread's rate as 2x1 against 1.65x as 1x2, benchmarks/results/thread-layout).
#
#   benchmarks/headline_report_seeds.sh CIFAR10_JPEG_TREE OUT_DIR [SEED ...]   (default 100-104)
#
# Give the JPEG tree relative to the repository (.cache/cifar10-jpg, where `tar -xzf` of the
# shared archive into .cache/cifar10-jpg puts it): the kept runs' configs then name no machine
# path, and a finished run restored on another machine matches what the sweep would run there.
#
# Accuracy only: it may run niced beside other work. Every finished run's records are kept in
# benchmarks/results/headline-report/<alpha>/runs.tar.xz (the sweep's --archive), so a later
# session on a fresh machine goes on where this one stopped. After each seed the tables of every
# kept run (report seeds, paired against FedDF) are written next to the archives (table.md,
# table.json: the sweep's --table-only).
set -euo pipefail
data=${1:?CIFAR-10 JPEG tree}; out=${2:?output folder}; shift 2
seeds=("$@"); [[ ${#seeds[@]} -gt 0 ]] || seeds=(100 101 102 103 104)
cd "$(dirname "$0")/.."
py=${FEDGO_PYTHON:-.venv/bin/python}
kept=${FEDGO_HEADLINE_KEPT:-benchmarks/results/headline-report}  # the archives and tables
B=conf/bench/cifar10-cpu-bn.yaml
SR="strategy.name=fedgo strategy.weighting=fedgo strategy.discriminator.reference=server \
strategy.discriminator.epochs=30 strategy.discriminator.spectral_norm=true \
'strategy.weighting_params={fedgo: {disc_mode: sigmoid}}'"
A01=("fedavg=$B strategy.name=fedavg"
     "feddf=$B strategy.name=feddf strategy.weighting=uniform"
     "fedgo=$B strategy.name=fedgo strategy.weighting=fedgo strategy.discriminator.epochs=30"
     "fedgo_server=$B $SR")
A005=("feddf=$B strategy.name=feddf strategy.weighting=uniform" "fedgo_server=$B $SR")
sweep() {  # ALPHA_DIR SEEDS [ARGS...] VARIANTS...: one sweep of the kept runs' archive
  local dir=$1 seeds=$2; shift 2
  PYTHONPATH=$PWD nice -n 19 "$py" -m fedgo_app.sweep "$@" --baseline feddf --seeds "$seeds" \
    --out "$out/$dir" --archive "$kept/$dir/runs.tar.xz" "data.path=$data" resources.server_cpus=1
}
table() {  # ALPHA_DIR [ARGS...] VARIANTS...: the table of every kept run, next to the archive
  local dir=$1 rc=0; shift
  # exit 1: the table leaves runs out (the seeds still to come), which it says; 2: bad arguments
  sweep "$dir" report "$@" --table-only > /dev/null || rc=$?
  (( rc <= 1 )) || return "$rc"
  cp "$out/$dir/table.md" "$out/$dir/table.json" "$kept/$dir/"
}
for s in "${seeds[@]}"; do
  sweep a0.1 "$s" "${A01[@]}"
  sweep a0.05 "$s" "${A005[@]}" data.alpha=0.05
  table a0.1 "${A01[@]}"
  table a0.05 "${A005[@]}" data.alpha=0.05
done
