#!/usr/bin/env bash
# The demo: install what is needed, build, fetch SmolLM2-135M and a public-domain text, and
# retrofit the Focus router for a few minutes on the CPU, printing perplexity before and after.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh --demo
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
source scripts/blas_env.sh
model=$(bash scripts/fetch_model.sh)
text=$(bash scripts/fetch_text.sh)
echo "model: $model"
echo "text:  $text (King James Bible, public domain)"
run=runs/demo
rm -rf "$run"
./build/focus retrofit --config configs/demo.conf --out "$run"
./build/focus groups --model "$model" --router "$run/router.h5" --data "$text/val.txt" --ctx 512 --tokens 4096 --out "$run/groups" >/dev/null
python3 scripts/plot_run.py "$run" >/dev/null
# Does the trained router earn its keep? On the held-out text, at the same share of attention
# pairs: the router's hard top-k against a sliding window with the same sinks (StreamingLLM's
# pattern, no training) and against random groups of the same K and k (what the groups are
# worth before training); then a passkey beyond the window.
ev=(./build/focus eval ppl --model "$model" --data "$text/val.txt" --ctx 512 --max-tokens 4096)
field() { sed -n "s/^$1 \([0-9.]*\).*/\1/p"; }
# the window whose sinks + band keep share $1 of the causal pairs at ctx $2 with $3 sinks
match_w() { awk -v p="$1" -v T="$2" -v s="$3" 'BEGIN { tot = T * (T + 1) / 2
    for (w = 0; w < T; w++) { k = 0
        for (i = 0; i < T; i++) { f = i - w; k += (i < w ? i : w) + 1 + (f > 0 ? (f < s ? f : s) : 0) }
        if (k / tot >= p) { print w; exit } } print T }'; }
dense=$("${ev[@]}" 2>/dev/null | field perplexity)
echo
echo "held-out text, ctx 512: dense $dense"
printf '| budget | pairs kept | Focus router | sinks + window (same pairs) | random groups (untrained) |\n|---|---|---|---|---|\n'
for k in 1 2; do
    r=$("${ev[@]}" --router "$run/router.h5" --attn hard --topk $k 2>/dev/null)
    rp=$(echo "$r" | field perplexity); kept=$(echo "$r" | field "pairs kept")
    w=$(match_w "$kept" 512 4)
    wp=$("${ev[@]}" --attn window --set w="$w" --set sinks=4 2>/dev/null | field perplexity)
    xp=$("${ev[@]}" --attn random --topk $k --set sinks=4 2>/dev/null | field perplexity)
    printf '| k=%s | %s | %s | %s (w = %s) | %s |\n' "$k" "$kept" "$rp" "$wp" "$w" "$xp"
done
echo
echo "passkey at 1024 tokens (the key beyond the window at every depth but the last):"
./build/focus eval passkey --model "$model" --router "$run/router.h5" --modes dense,window:"$w",hard:1,hard:2 \
    --set sinks=4 --lengths 1024 --depths 0,0.25,0.5,0.75 --trials 2 2>/dev/null | grep "retrieved ("
# No training at all: the block selector the project ships (fitted to SmolLM2's own attention on
# PG-19 books, routers/README.md) on this text at ctx 4096, against the window and Quest's blocks
# at about the same pairs, then the passkey beyond the window.
sel=routers/smollm2-135m-pg19-blocks.h5
ev4=(./build/focus eval ppl --model "$model" --data "$text/val.txt" --ctx 4096 --max-tokens 8192)
d4=$("${ev4[@]}" 2>/dev/null | field perplexity)
r=$("${ev4[@]}" --router "$sel" --attn blocks_learned 2>/dev/null)
sp=$(echo "$r" | field perplexity); sk=$(echo "$r" | field "pairs kept")
w4=$(match_w "$sk" 4096 4)
wp4=$("${ev4[@]}" --attn window --set w="$w4" --set sinks=4 2>/dev/null | field perplexity)
qp4=$("${ev4[@]}" --attn blocks --set w=512 --set blocks=8 --set sinks=4 2>/dev/null | field perplexity)
echo
echo "the shipped block selector ($sel, no training), held-out text, ctx 4096: dense $d4"
printf '| pairs kept | learned block selector | sinks + window (same pairs) | Quest blocks (no training) |\n|---|---|---|---|\n'
printf '| %s | %s | %s (w = %s) | %s |\n' "$sk" "$sp" "$wp4" "$w4" "$qp4"
echo "passkey at 4096 tokens:"
./build/focus eval passkey --model "$model" --router "$sel" --modes dense,window:"$w4",blocks_learned:8 \
    --set w=512 --lengths 4096 --depths 0.25,0.5,0.75 --trials 1 2>/dev/null | grep "retrieved ("
echo
echo "run files: $run/ (router.h5, metrics.jsonl, config.conf, groups/groups.txt, groups/groups.svg, run.png)"
echo "evaluate: ./build/focus eval ppl --model $model --data $text/val.txt --ctx 512 --router $run/router.h5 --attn hard --topk 1,2"
