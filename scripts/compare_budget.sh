#!/usr/bin/env bash
# The learned router against the training-free patterns at the same number of attention pairs
# (issue: earn its keep): for each method a sweep of its budget, perplexity at ctx 8192 and 1024
# on the PG-19 test split and WikiText-2, retrieval (passkey and RULER's multi-key needle) at 4K
# and 8K, model-level tokens/s, all against the pairs kept; plots of perplexity and retrieval
# against pairs kept, one curve per method, dense as a line.
#   bash scripts/compare_budget.sh OUT [ROUTER]
# Methods: window (sinks + sliding window, StreamingLLM), random (random groups, the router's K
# and k), blocks (Quest's query-aware bounds) and blocks_mean (MoBA's mean-pooled keys) with the
# window W_BLOCKS, oracle (the blocks holding the most dense mass: the ceiling of block
# selection), and the router along its budgets (ROUTER_MODES_*: fixed k, mass coverage pP:k,
# narrower windows; the window W_ROUTER_*) when ROUTER is given; the learned block
# selector (blocks_learned at the BLOCKS_* budgets with the window W_BLOCKS*) when SELECTOR names
# one (routers/smollm2-135m-pg19-blocks.h5, or a file of focus fit-blocks); the centroids with the
# selector (--router SELECTOR,GROUPS: the token router GROUPS_ROUTER's groups beside the selector's blocks,
# at the same BLOCKS_* budgets and window) when GROUPS_ROUTER names a token router.
# Knobs (environment): TOKENS (16385: the first 16,384 scored tokens of each set), CTX_LONG
# (8192), CTX_SHORT (1024), CURVES (a subset of "pg19_long pg19_short wiki_short"), RETRIEVAL=0
# to skip retrieval, LENGTHS, DEPTHS, TRIALS, and the budget lists below. The random groups run
# with the router's window. Needs cache/shards (bash scripts/pg19_shards.sh) and the model.
set -euo pipefail
out=${1:?usage: compare_budget.sh OUT [ROUTER]}
router=${2:-}
focus=${FOCUS:-build/focus}
model=${MODEL:-cache/models/SmolLM2-135M-Instruct.Q4_1.gguf}
tokens=${TOKENS:-16385}
ctx_long=${CTX_LONG:-8192}
ctx_short=${CTX_SHORT:-1024}
# budgets at ctx 8192 (window widths, key blocks of 64 beyond a window of W_BLOCKS, router k)
WINDOWS_LONG=${WINDOWS_LONG:-512,1050,1500,2560}
BLOCKS_LONG=${BLOCKS_LONG:-4,8,16,24,40}
W_BLOCKS=${W_BLOCKS:-512}
W_ROUTER_LONG=${W_ROUTER_LONG:-512}
# the router along the curve: top-1 with narrower windows, mass coverage (hard:pP:k keeps a
# token's groups until a share P of its routing mass, at most k), top-2 and top-3
ROUTER_MODES_LONG=${ROUTER_MODES_LONG:-hard:1@w=128,hard:1@w=256,hard:1,hard:p0.6:2,hard:2,hard:p0.8:3,hard:3}
# budgets at ctx 1024
WINDOWS_SHORT=${WINDOWS_SHORT:-200,370}
BLOCKS_SHORT=${BLOCKS_SHORT:-2,5}
W_BLOCKS_SHORT=${W_BLOCKS_SHORT:-64}
W_ROUTER_SHORT=${W_ROUTER_SHORT:-128}
ROUTER_MODES_SHORT=${ROUTER_MODES_SHORT:-hard:1,hard:2}
LENGTHS=${LENGTHS:-4096,8192}
DEPTHS=${DEPTHS:-0.25,0.5,0.75}
TRIALS=${TRIALS:-1}
[ -f "$model" ] || { echo "compare_budget: $model missing (bash scripts/fetch_model.sh)"; exit 1; }
for s in pg19test wikitext2; do
    [ -d "cache/shards/$s" ] || { echo "compare_budget: cache/shards/$s missing (bash scripts/pg19_shards.sh)"; exit 1; }
done
[ -z "$router" ] || [ -f "$router" ] || { echo "compare_budget: router $router not found"; exit 1; }
selector=${SELECTOR:-}
[ -z "$selector" ] || [ -f "$selector" ] || { echo "compare_budget: selector $selector not found"; exit 1; }
groups=${GROUPS_ROUTER:-}
[ -z "$groups" ] || [ -n "$selector" ] || { echo "compare_budget: GROUPS_ROUTER goes with SELECTOR"; exit 1; }
[ -z "$groups" ] || [ -f "$groups" ] || { echo "compare_budget: router $groups not found"; exit 1; }
mkdir -p "$out"
source scripts/blas_env.sh "$focus"
{ date -u +%FT%TZ; git rev-parse --short HEAD 2>/dev/null || true; grep -m1 "model name" /proc/cpuinfo;
  echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-} OMP_NUM_THREADS=${OMP_NUM_THREADS:-}"; } > "$out/machine.txt"
rt=(); [ -n "$router" ] && rt=(--router "$router")
modes() { # ctx windows blocks w_router -> the patterns' mode list
    local m="dense"
    for w in ${2//,/ }; do m+=",window:$w"; done
    m+=",random:1@w=$4" # the control of the router: its K, k and window, random groups
    # Quest at every budget; the mean key and the oracle (as slow per pair as dense: it scores every
    # key) at the first
    for n in ${3//,/ }; do m+=",blocks:$n"; done
    m+=",blocks_mean:${3%%,*},oracle:${3%%,*}"
    echo "$m"
}
# perplexity: one eval curve per (set, ctx); the window for groups and blocks set per run
curve() { # name data ctx windows blocks w_blocks w_router router_modes
    local name=$1 data=$2 ctx=$3
    # the patterns with blocks (their window w_blocks), then the router (its window w_router):
    # two runs, since --set w applies to every mode but window:W
    "$focus" eval curve --model "$model" --data "$data" --ctx "$ctx" --max-tokens "$tokens" \
        --modes "$(modes "$ctx" "$4" "$5" "$7")" --set w="$6" --set sinks=4 \
        --out "$out/${name}_patterns.tsv" 2> /dev/null | tee "$out/${name}_patterns.log"
    if [ -n "$router" ]; then
        "$focus" eval curve --model "$model" --data "$data" --ctx "$ctx" --max-tokens "$tokens" \
            "${rt[@]}" --modes "$8" --set w="$7" \
            --out "$out/${name}_router.tsv" 2> /dev/null | tee "$out/${name}_router.log"
    fi
    if [ -n "$selector" ]; then
        local m="" n
        for n in ${5//,/ }; do m+="${m:+,}blocks_learned:$n"; done
        "$focus" eval curve --model "$model" --data "$data" --ctx "$ctx" --max-tokens "$tokens" \
            --router "$selector" --modes "$m" --set w="$6" \
            --out "$out/${name}_selector.tsv" 2> /dev/null | tee "$out/${name}_selector.log"
        if [ -n "$groups" ]; then # the same budgets with the centroids' groups beside the blocks
            "$focus" eval curve --model "$model" --data "$data" --ctx "$ctx" --max-tokens "$tokens" \
                --router "$selector,$groups" --modes "$m" --set w="$6" \
                --out "$out/${name}_centroids.tsv" 2> /dev/null | tee "$out/${name}_centroids.log"
        fi
    fi
}
# CURVES: which of the three to run (all by default)
CURVES=${CURVES:-pg19_long pg19_short wiki_short}
on() { [[ " $CURVES " == *" $1 "* ]]; }
on pg19_long && curve pg19_long cache/shards/pg19test "$ctx_long" "$WINDOWS_LONG" "$BLOCKS_LONG" "$W_BLOCKS" "$W_ROUTER_LONG" "$ROUTER_MODES_LONG"
on pg19_short && curve pg19_short cache/shards/pg19test "$ctx_short" "$WINDOWS_SHORT" "$BLOCKS_SHORT" "$W_BLOCKS_SHORT" "$W_ROUTER_SHORT" "$ROUTER_MODES_SHORT"
on wiki_short && curve wiki_short cache/shards/wikitext2 "$ctx_short" "$WINDOWS_SHORT" "$BLOCKS_SHORT" "$W_BLOCKS_SHORT" "$W_ROUTER_SHORT" "$ROUTER_MODES_SHORT"
if [ "${RETRIEVAL:-1}" != 0 ]; then
    # retrieval: the widest and narrowest window, the blocks at the smaller budget, the router
    w0=${WINDOWS_LONG%%,*}; w1=$(echo "$WINDOWS_LONG" | tr , '\n' | sed -n 2p); n0=${BLOCKS_LONG%%,*}
    for task in passkey niah_multikey; do
        "$focus" eval passkey --model "$model" --task "$task" --modes "dense,window:$w0,window:${w1:-$w0},blocks:$n0" \
            --set w="$W_BLOCKS" --set sinks=4 --lengths "$LENGTHS" --depths "$DEPTHS" --trials "$TRIALS" \
            --out "$out/${task}_patterns.tsv" 2> /dev/null | tee "$out/${task}_patterns.log"
        if [ -n "$router" ]; then
            "$focus" eval passkey --model "$model" --task "$task" "${rt[@]}" --modes "hard:1,hard:2" \
                --set w="$W_ROUTER_LONG" --lengths "$LENGTHS" --depths "$DEPTHS" --trials "$TRIALS" \
                --out "$out/${task}_router.tsv" 2> /dev/null | tee "$out/${task}_router.log"
        fi
        if [ -n "$selector" ]; then
            "$focus" eval passkey --model "$model" --task "$task" --router "$selector" --modes "blocks_learned:$n0" \
                --set w="$W_BLOCKS" --lengths "$LENGTHS" --depths "$DEPTHS" --trials "$TRIALS" \
                --out "$out/${task}_selector.tsv" 2> /dev/null | tee "$out/${task}_selector.log"
            if [ -n "$groups" ]; then
                "$focus" eval passkey --model "$model" --task "$task" --router "$selector,$groups" \
                    --modes "blocks_learned:$n0" --set w="$W_BLOCKS" --lengths "$LENGTHS" \
                    --depths "$DEPTHS" --trials "$TRIALS" \
                    --out "$out/${task}_centroids.tsv" 2> /dev/null | tee "$out/${task}_centroids.log"
            fi
        fi
    done
fi
python3 scripts/plot_budget.py "$out"
