#!/usr/bin/env bash
# Perplexity table of a retrofit run: base model (dense), Focus soft, hard top-k for k = 1, 2, 3
# and K, in causal routing, then the same in sinkhorn routing (non-causal).
# usage: scripts/eval_table.sh MODEL ROUTER DATA [CTX] [MAX_TOKENS] [TOKENIZER]
set -euo pipefail
model=$1 router=$2 data=$3 ctx=${4:-1024} max=${5:-16384} tok=${6:-}
focus=${FOCUS:-build/focus}
K=$(sed -n 's/^K = //p' "$(dirname "$router")/config.conf")
args=(--model "$model" --data "$data" --ctx "$ctx" --max-tokens "$max")
[ -n "$tok" ] && args+=(--tokenizer "$tok")
row() { # label, extra args...
  local label=$1; shift
  local out; out=$("$focus" eval ppl "${args[@]}" "$@" 2>/dev/null)
  local ppl kept
  ppl=$(echo "$out" | sed -n 's/^perplexity \([0-9.]*\).*/\1/p')
  kept=$(echo "$out" | sed -n 's/^pairs kept \([0-9.]*\).*/\1/p')
  local tps; tps=$(echo "$out" | sed -n 's/.* \([0-9.]*\) tokens\/s.*/\1/p')
  printf "| %-34s | %9s | %10s | %8s |\n" "$label" "$ppl" "${kept:--}" "$tps"
}
echo "data: $data, first $max tokens, ctx $ctx; K = $K"
printf "| %-34s | %9s | %10s | %8s |\n" "mode" "ppl" "pairs kept" "tok/s"
printf "|%s|%s|%s|%s|\n" "------------------------------------" "-----------" "------------" "----------"
row "base model (dense)"
for routing in causal sinkhorn; do
  mark=""; [ $routing = sinkhorn ] && mark=" (non-causal)"
  row "Focus soft, $routing$mark" --router "$router" --attn soft --routing $routing
  for k in 1 2 3 "$K"; do
    [ "$k" -gt "$K" ] && continue
    [ "$k" = "$K" ] && [ "$K" -le 3 ] && continue
    row "hard k=$k, $routing$mark" --router "$router" --attn hard --topk "$k" --routing $routing
  done
done
