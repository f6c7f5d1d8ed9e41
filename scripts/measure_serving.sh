#!/usr/bin/env bash
# scripts/measure_serving.sh: the serving measurements of docs/RESULTS.md ("Serving on a CPU from
# the file's own blocks") that are not against llama.cpp (scripts/vs_llamacpp.sh is): the quality
# of the serving arithmetic at ctx 1024 (perplexity of the same PG-19 test tokens with fp32 or
# native weights, fp32 or int8 prompt products, f32 or f16 KV cache) and dense against Focus
# decode at ctx 8192. Needs build/focus, the SmolLM2 file (scripts/fetch_model.sh), the PG-19
# test shard (scripts/pg19_shards.sh) and, for the long-context rows, ROUTER (a router.h5 of
# SmolLM2; default runs/cpu_quality300/router.h5). THREADS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
model=cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
data=cache/shards/pg19test
router=${ROUTER:-runs/cpu_quality300/router.h5}
export OMP_NUM_THREADS=${THREADS:-2}
for args in "--weights f32 --kv f32 --prefill exact" "--kv f32 --prefill exact" \
  "--kv f16 --prefill exact" "--kv f16" "--kv f16 --prefill steps"; do
  echo "== ctx 1024 $args"
  # shellcheck disable=SC2086
  build/focus bench decode --model "$model" --ctx 1024 -n 64 --data "$data" $args |
    grep -E "prompt|perplex"
done
for r in "" "--router $router --topk 1" "--router $router --topk 2"; do
  echo "== ctx 8192 $r"
  # shellcheck disable=SC2086
  build/focus bench decode --model "$model" --ctx 8192 -n 64 $r | grep -E "prompt|resident"
done
