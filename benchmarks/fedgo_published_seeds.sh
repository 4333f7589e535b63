#!/usr/bin/env bash
# FedGO as published, at CPU scale, beside FedDF on the report seeds (issue 51), two seeds at a
# time, resumable: conf/bench/cifar10-cpu-bn.yaml at alpha 0.1 (the headline rows' setting) with
#   feddf           FedDF (uniform weights), run again on this code so that the pairs share it;
#   fedgo_published FedGO G1/D1 with the paper's discriminators (App. E.2: cnn4, 30 epochs,
#                   Adam 2e-4, batch 64, trained through the double sigmoid and read through it,
#                   Eq. 9 with n_k) against a width-32 DCGAN WGAN-GP trained GEN_STEPS generator
#                   steps (the tuning seeds' choice: benchmarks/studies/headline.md, "FedGO as
#                   published"); the generator is cached per seed (.cache/generators) and shared
#                   by the next variant; a generator whose training was stopped (the sweep
#                   killed at a session's end) goes on from its snapshot in that folder;
#   fedgo_odds      the same without Eq. 9's n_k factor (weighting_params.fedgo.sizes: false):
#                   is n_k FedGO's drag at this scale?
# What stays at CPU scale (the config's header): ResNet-8, 250 images a client, 10 rounds,
# 20 local SGD epochs, 2 server epochs without flips, and the DCGAN for the paper's ResNet GAN.
#
#   benchmarks/fedgo_published_seeds.sh CIFAR10_JPEG_TREE OUT_DIR [SEED ...]   (default 100-104)
#
# Give the JPEG tree relative to the repository (.cache/cifar10-jpg). Accuracy only: it may run
# niced beside other work; two one-thread runs at a time. Every finished run is kept in
# benchmarks/results/fedgo-published-report/runs.tar.xz (the sweep's --archive), so a later
# session on a fresh machine goes on where this one stopped; after each pair of seeds the table
# of every kept run (paired against FedDF) is written next to the archive.
set -euo pipefail
data=${1:?CIFAR-10 JPEG tree}; out=${2:?output folder}; shift 2
seeds=("$@"); [[ ${#seeds[@]} -gt 0 ]] || seeds=(100 101 102 103 104)
cd "$(dirname "$0")/.."
py=${FEDGO_PYTHON:-.venv/bin/python}
kept=${FEDGO_PUBLISHED_KEPT:-benchmarks/results/fedgo-published-report}
steps=${GEN_STEPS:-1000}  # tuning seeds 0-2: 1,000 steps (headline.md, "The rule for the report rows' generator")
B=conf/bench/cifar10-cpu-bn.yaml
PUB="strategy.name=fedgo strategy.weighting=fedgo strategy.generator.steps=$steps \
strategy.generator.cache=.cache/generators strategy.discriminator.epochs=30 \
strategy.discriminator.loss=double_sigmoid strategy.discriminator.lr=0.0002 \
strategy.discriminator.batch_size=64"
FEDDF="feddf=$B strategy.name=feddf strategy.weighting=uniform"
PUBLISHED="fedgo_published=$B $PUB"
ODDS="fedgo_odds=$B $PUB 'strategy.weighting_params={fedgo: {sizes: false}}'"
sweep() {  # SEEDS [ARGS...] VARIANTS...: one sweep of the kept runs' archive
  local seeds=$1; shift
  PYTHONPATH=$PWD nice -n 19 "$py" -m fedgo_app.sweep "$@" --seeds "$seeds" --out "$out" \
    --archive "$kept/runs.tar.xz" "data.path=$data" resources.server_cpus=1 --jobs 2
}
mkdir -p "$kept"
# Two seeds at a time: first their fedgo_published runs side by side (each trains and caches
# its seed's generator), then FedDF and fedgo_odds (which loads the cached generator), so no
# generator is trained twice.
for ((i = 0; i < ${#seeds[@]}; i += 2)); do
  pair=$(IFS=,; echo "${seeds[*]:i:2}")
  sweep "$pair" "$PUBLISHED"
  sweep "$pair" "$FEDDF" "$ODDS"
  rc=0
  # exit 1: the table leaves runs out (the seeds still to come), which it says; 2: bad arguments
  sweep report --baseline feddf --table-only "$FEDDF" "$PUBLISHED" "$ODDS" > /dev/null || rc=$?
  (( rc <= 1 )) || exit "$rc"
  cp "$out/table.md" "$out/table.json" "$kept/"
done
