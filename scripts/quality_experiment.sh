#!/usr/bin/env bash
# quality_experiment.sh: the quality ablation of issue 11 (docs/RESULTS.md, "Quality under
# sparsity"): SmolLM2-135M retrofitted on the PG-19 sample with the paper's recipe, then with each
# addition (attention sinks, balanced causal routing, the kl / attn / kl+attn objectives), each
# router evaluated on the PG-19 test split at ctx 1024 and 8192 and on WikiText-2 at ctx 1024,
# dense and every Focus mode, with the fraction of causal pairs kept. Then the per-layer
# sensitivity of the best recipe and that recipe with its most sensitive layers dense.
#
#   bash scripts/quality_experiment.sh OUT_DIR [cpu|cuda]
#
# Environment (defaults sized for one GPU; on the CPU use far fewer steps and tokens):
#   STEPS=300 B=8 T=1024         router training per recipe
#   TOK1K=32768 TOK8K=65536      evaluation tokens at ctx 1024 and 8192 (PG-19 test split)
#   TOKWIKI=32768 TOKLAYERS=16384
#   TRAIN=cache/shards/pg19train  TEST=cache/shards/pg19test  WIKI=cache/shards/wikitext2
#   (made by: focus prepare, see `prepare_data` below, when missing)
#   RECIPES="paper sinks balance kl attn klattn"
# Output: OUT_DIR/results.tsv (recipe, data, ctx, mode, perplexity, pairs kept, tokens/s), the
# training logs, OUT_DIR/layers.txt; scripts/plot_quality.py OUT_DIR draws PPL against pairs kept.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: quality_experiment.sh OUT_DIR [cpu|cuda]}
device=${2:-cpu}
FOCUS=${FOCUS:-build/focus}
MODEL=${MODEL:-cache/models/SmolLM2-135M-Instruct.Q4_1.gguf}
DATA=${FOCUS_DATA:-../shared/data}
STEPS=${STEPS:-300} B=${B:-8} T=${T:-1024}
TOK1K=${TOK1K:-32768} TOK8K=${TOK8K:-65536} TOKWIKI=${TOKWIKI:-32768} TOKLAYERS=${TOKLAYERS:-16384}
TRAIN=${TRAIN:-cache/shards/pg19train} TEST=${TEST:-cache/shards/pg19test}
WIKI=${WIKI:-cache/shards/wikitext2}
RECIPES=${RECIPES:-paper sinks balance kl attn klattn}
BUDGETS=${BUDGETS:-1,2,p0.6,p0.8}
mkdir -p "$out"

prepare_data() { # token shards of the PG-19 train and test books and WikiText-2 test (raw)
    local dir=$1 frac=$2; shift 2
    [ -d "$dir" ] && return
    "$FOCUS" prepare --tokenizer "$MODEL" --out "$dir" --val-fraction "$frac" "$@" > /dev/null
}
prepare_data "$TRAIN" 0 "$DATA"/pg19-sample/train/*.txt
prepare_data "$TEST" 0 "$DATA"/pg19-sample/test/*.txt
[ -d "$WIKI" ] || "$FOCUS" prepare --raw --tokenizer "$MODEL" --out "$WIKI" --val-fraction 0 \
    "$DATA"/wikitext-2/raw/wiki.test.raw > /dev/null

# recipe NAME -> the --set options that define it
recipe() {
    case $1 in
        paper) echo "objective=lm sinks=0 beta_balance=0 beta_momentum=0.99" ;;
        sinks) echo "objective=lm sinks=4 beta_balance=0 beta_momentum=0.99" ;;
        balance) echo "objective=lm sinks=4 beta_balance=1 beta_momentum=0.9" ;;
        kl) echo "objective=kl sinks=4 beta_balance=1 beta_momentum=0.9" ;;
        attn) echo "objective=attn sinks=4 beta_balance=1 beta_momentum=0.9" ;;
        klattn) echo "objective=kl+attn sinks=4 beta_balance=1 beta_momentum=0.9" ;;
        *) echo "unknown recipe $1" >&2; exit 2 ;;
    esac
}

res=$out/results.tsv
[ -f "$res" ] || printf "recipe\tdata\tctx\tmode\tppl\tpairs_kept\ttokens_per_s\n" > "$res"
# evaluate RECIPE DATA_NAME DATA CTX TOKENS [eval options...]: one row per budget
evaluate() {
    local name=$1 dname=$2 data=$3 ctx=$4 tok=$5; shift 5
    "$FOCUS" eval ppl --model "$MODEL" --data "$data" --ctx "$ctx" --max-tokens $((tok + 1)) \
        --device "$device" "$@" 2>/dev/null | awk -v r="$name" -v d="$dname" -v c="$ctx" '
        /^attention / { sub(/^attention /, ""); mode = $0; gsub(/\t/, " ", mode) }
        /^perplexity / { ppl = $2; tps = $(NF-3); kept = "-"; pending = 1
                         if (mode !~ /^hard/) { printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r, d, c, mode, ppl, kept, tps; pending = 0 } }
        /^pairs kept / { printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r, d, c, mode, ppl, $3, tps; pending = 0 }' \
        | tee -a "$res"
}

if ! grep -q "^dense" "$res"; then
    evaluate dense pg19 "$TEST" 1024 "$TOK1K"
    evaluate dense pg19 "$TEST" 8192 "$TOK8K"
    evaluate dense wikitext2 "$WIKI" 1024 "$TOKWIKI"
fi

for r in $RECIPES; do
    run=$out/run_$r
    sets=()
    for kv in $(recipe "$r"); do sets+=(--set "$kv"); done
    if [ ! -f "$run/router.h5" ]; then
        echo "== training recipe $r: $(recipe "$r")"
        "$FOCUS" retrofit --config configs/smollm2_pg19.conf --device "$device" --out "$run" \
            --set train="$TRAIN" --set val="$TEST" --set B="$B" --set T="$T" --set steps="$STEPS" \
            --set warmup=$((STEPS / 10)) --set eval_every="$STEPS" --set eval_tokens=8192 \
            --set ckpt_every="$STEPS" "${sets[@]}" > "$out/train_$r.log" 2>&1
        grep -E "before|after|took" "$out/train_$r.log" || true
    fi
    R=(--router "$run/router.h5")
    evaluate "$r" pg19 "$TEST" 1024 "$TOK1K" "${R[@]}" --attn soft
    evaluate "$r" pg19 "$TEST" 1024 "$TOK1K" "${R[@]}" --attn hard --topk "$BUDGETS"
    evaluate "$r" pg19 "$TEST" 8192 "$TOK8K" "${R[@]}" --attn hard --topk "$BUDGETS"
    evaluate "$r" wikitext2 "$WIKI" 1024 "$TOKWIKI" "${R[@]}" --attn hard --topk 1,2
done

# the best recipe by hard k=1 at ctx 1024: its layers, and its most sensitive layers dense
best=$(awk -F'\t' '$2 == "pg19" && $3 == 1024 && $4 ~ /k=1$/ { print $5, $1 }' "$res" | sort -n | head -1 | cut -d' ' -f2)
echo "== best recipe by hard k=1 perplexity at ctx 1024: $best"
if [ -n "$best" ] && [ "${LAYERS:-1}" = 1 ]; then
    "$FOCUS" eval layers --model "$MODEL" --data "$TEST" --ctx 1024 --max-tokens $((TOKLAYERS + 1)) \
        --device "$device" --router "$out/run_$best/router.h5" --attn hard --topk 1 2>/dev/null | tee "$out/layers.txt"
    for c in 2 4; do
        dl=$(sed -n "s/^the $c most sensitive: dense_layers = //p" "$out/layers.txt")
        [ -z "$dl" ] && continue
        evaluate "$best+dense$c" pg19 "$TEST" 1024 "$TOK1K" --router "$out/run_$best/router.h5" \
            --attn hard --topk "$BUDGETS" --set dense_layers="$dl"
        evaluate "$best+dense$c" pg19 "$TEST" 8192 "$TOK8K" --router "$out/run_$best/router.h5" \
            --attn hard --topk 1,2 --set dense_layers="$dl"
    done
fi
echo "results: $res"
