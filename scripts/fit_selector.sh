#!/usr/bin/env bash
# The recipe of the block selector the project ships (routers/smollm2-135m-pg19-blocks.h5):
# focus fit-blocks on SmolLM2-135M's own dense attention over 8 windows of 8,192 tokens spread
# over the PG-19 training books (192 sampled queries per window and layer), band 4 sinks + a
# window of 512, key blocks of 64, 8 blocks per query in every layer; one held-out window at the
# end of the same text for the report. About 14 minutes on 2 cores (docs/RESULTS.md).
#   bash scripts/fit_selector.sh OUT.h5
# Needs the model (bash scripts/fetch_model.sh) and cache/shards/pg19train
# (bash scripts/pg19_shards.sh, from ../shared/data).
set -euo pipefail
out=${1:?usage: fit_selector.sh OUT.h5}
focus=${FOCUS:-build/focus}
model=${MODEL:-cache/models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$model" ] || { echo "fit_selector: $model missing (bash scripts/fetch_model.sh)"; exit 1; }
[ -d cache/shards/pg19train ] || { echo "fit_selector: cache/shards/pg19train missing (bash scripts/pg19_shards.sh)"; exit 1; }
source scripts/blas_env.sh "$focus"
"$focus" fit-blocks --model "$model" --data cache/shards/pg19train --out "$out" --ctx 8192 \
    --windows 8 --heldout 1 --queries 192 --iters 200 --lr 0.02 --seed 1 --budget uniform \
    --set w=512 --set sinks=4 --set block=64 --set blocks=8
