#!/usr/bin/env bash
# scripts/plan_tables.sh [T] [WEIGHTS]: focus plan's per-GPU memory of router training (B = 1 x T,
# default 8192; WEIGHTS bf16 or fp32, default bf16) for LLaMA-2 7B, 13B and 70B with all of 1, 2,
# 4 or 8 GPUs tensor-parallel, and whether it fits GPUs of 80 GB and 141 GB; then the smallest tp
# that fits each. Markdown on stdout. From the shapes alone: no GPU needed.
set -euo pipefail
cd "$(dirname "$0")/.."
T=${1:-8192}; W=${2:-bf16}
[ -x build/focus ] || cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target focus >/dev/null
f=build/focus
gbof() { sed -n "s/^  $1 *\([0-9.]*\) GB.*/\1/p"; }
echo "Router training memory per GPU, B = 1 x T = $T, $W frozen weights, all GPUs tensor-parallel"
echo "(\`bash scripts/plan_tables.sh $T $W\`, $(date -u +%F)); GB = 1e9 bytes"
echo
echo "| model | GPUs = tp | weights | activations | logits + router + scratch | total per GPU | 80 GB | 141 GB | all-reduced per step |"
echo "|---|---|---|---|---|---|---|---|---|"
for m in llama2-7b llama2-13b llama2-70b; do
  for n in 1 2 4 8; do
    p=$("$f" plan --preset "$m" --gpus "$n" --tp "$n" --T "$T" --weights "$W")
    w=$(echo "$p" | gbof "frozen weights ([^)]*)"); a=$(echo "$p" | gbof "activations kept for the backward")
    l=$(echo "$p" | gbof "logits (and their gradient, in place)"); r=$(echo "$p" | gbof "router, gradients, AdamW moments")
    s=$(echo "$p" | gbof "backward scratch, masks, token ids"); t=$(echo "$p" | sed -n 's/^  total *\([0-9.]*\) GB.*/\1/p')
    c=$(echo "$p" | sed -n 's/^tensor-parallel over [0-9]*: \([0-9.]*\) GB all-reduced.*/\1 GB/p'); c=${c:--}
    fit() { awk -v t="$t" -v g="$1" 'BEGIN { print (t <= g ? "fits" : "no") }'; }
    o=$(awk -v l="$l" -v r="$r" -v s="$s" 'BEGIN { printf "%.2f", l + r + s }')
    echo "| $m | $n | $w | $a | $o | $t | $(fit 80) | $(fit 141) | $c |"
  done
done
echo
echo "| model | smallest tp for 80 GB | smallest tp for 141 GB | longest T on 8 GPUs of 80 GB (tp 8) |"
echo "|---|---|---|---|"
for m in llama2-7b llama2-13b llama2-70b; do
  s80=$("$f" plan --preset "$m" --T "$T" --weights "$W" --mem 80 | sed -n 's/.*at T=[0-9]*: tp \([0-9]*\)/\1/p'); s80=${s80:-none}
  s141=$("$f" plan --preset "$m" --T "$T" --weights "$W" --mem 141 | sed -n 's/.*at T=[0-9]*: tp \([0-9]*\)/\1/p'); s141=${s141:-none}
  lt=$("$f" plan --preset "$m" --gpus 8 --tp 8 --T "$T" --weights "$W" --mem 80 | sed -n 's/.*longest T that fits at 1 row per rank: \([0-9]*\)).*/\1/p'); lt=${lt:-none}
  echo "| $m | $s80 | $s141 | $lt |"
done
