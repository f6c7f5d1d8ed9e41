#!/usr/bin/env bash
# From scratch, dense against Focus: the same small LLaMA trained twice on the same tokens in the
# same order (focus pretrain --attn dense, --attn focus: the router trained jointly), validation
# perplexity at every evaluation, then both final models evaluated on more PG-19 test tokens
# (dense; Focus soft and hard top-1 / top-2). OUT/scratch.tsv, OUT/scratch.md, OUT/scratch.png.
#   bash scripts/scratch_compare.sh OUT [CONFIG]
# CONFIG defaults to configs/scratch_pg19.conf (about 35 minutes on 2 cores); STEPS, EVAL_EVERY
# and PPL_TOKENS (final evaluation) from the environment override it.
set -euo pipefail
out=$1
config=${2:-configs/scratch_pg19.conf}
focus=${FOCUS:-build/focus}
PPL_TOKENS=${PPL_TOKENS:-65536}
sets=()
[ -n "${STEPS:-}" ] && sets+=(--set steps="$STEPS")
[ -n "${EVAL_EVERY:-}" ] && sets+=(--set eval_every="$EVAL_EVERY" --set ckpt_every="$EVAL_EVERY")
mkdir -p "$out"
bash scripts/pg19_shards.sh "$focus"
python3 -c "import matplotlib" 2>/dev/null || python3 -m pip install --quiet matplotlib
for attn in dense focus; do
    [ -e "$out/$attn/done" ] && continue
    "$focus" pretrain --config "$config" "${sets[@]}" --attn "$attn" --out "$out/$attn" > "$out/$attn.log"
    touch "$out/$attn/done"
done
ppl() { "$focus" eval ppl "$@" --data cache/shards/pg19test --ctx "$T" --max-tokens "$PPL_TOKENS" 2>/dev/null | sed -n 's/^perplexity \([0-9.]*\).*/\1/p'; }
T=$(sed -n 's/^T *= *//p' "$out/dense/config.conf")
tok=(--tokenizer cache/models/SmolLM2-135M-Instruct.Q4_1.gguf)
{
    printf 'model\tattention\tppl\n'
    printf 'dense\tdense\t%s\n' "$(ppl --model "$out/dense/model.gguf" "${tok[@]}")"
    printf 'focus\tdense\t%s\n' "$(ppl --model "$out/focus/model.gguf" "${tok[@]}")"
    fr=(--model "$out/focus/model.gguf" "${tok[@]}" --router "$out/focus/router.h5")
    printf 'focus\tsoft\t%s\n' "$(ppl "${fr[@]}" --attn soft)"
    printf 'focus\thard:1\t%s\n' "$(ppl "${fr[@]}" --attn hard --topk 1)"
    printf 'focus\thard:2\t%s\n' "$(ppl "${fr[@]}" --attn hard --topk 2)"
} > "$out/final.tsv"
python3 scripts/plot_scratch.py "$out" "$out/scratch.png"
cat "$out/scratch.md"
