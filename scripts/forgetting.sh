#!/usr/bin/env bash
# The forgetting table: adapt SmolLM2-135M to one domain (the PG-19 sample) with a Focus router
# (the quality recipe), LoRA at two learning rates and full fine-tuning, all with the same data,
# data order, steps and batch; then measure every method on the domain (PG-19 test perplexity),
# on another domain (WikiText-2 test perplexity), on the zero-shot tasks and on passkey
# retrieval, next to the untouched base model. One markdown table (OUT/forgetting.md) and its
# numbers (OUT/forgetting.tsv).
#   bash scripts/forgetting.sh OUT
# Budget and sizes from the environment: STEPS (300: the recipe's; each step is B = 1 x T = 1024
# tokens), TASK_LIMIT (items per task), PPL_TOKENS, PASSKEY_LENGTHS, LORA_LRS, FULL_LR.
set -euo pipefail
out=$1
focus=${FOCUS:-build/focus}
model=${MODEL:-cache/models/SmolLM2-135M-Instruct.Q4_1.gguf}
config=${CONFIG:-configs/smollm2_quality.conf}
STEPS=${STEPS:-300}
TASK_LIMIT=${TASK_LIMIT:-100}
PPL_TOKENS=${PPL_TOKENS:-8192}
PASSKEY_LENGTHS=${PASSKEY_LENGTHS:-1024,2048}
LORA_LRS=${LORA_LRS:-1e-3,1e-4}
FULL_LR=${FULL_LR:-1e-5}
mkdir -p "$out"
bash scripts/pg19_shards.sh "$focus" "$model"
common=(--set train=cache/shards/pg19train --set val=cache/shards/pg19test --set steps="$STEPS"
        --set eval_every="$STEPS" --set ckpt_every="$STEPS" --set eval_tokens=4096)
run() { # name, log: train one method (skipped when its output exists)
    local name=$1; shift
    [ -e "$out/$name/done" ] && return
    "$@" > "$out/$name.log" 2>&1
    touch "$out/$name/done"
}
run focus "$focus" retrofit --config "$config" "${common[@]}" --out "$out/focus"
for lr in ${LORA_LRS//,/ }; do
    run "lora_$lr" "$focus" finetune --config "$config" "${common[@]}" --set method=lora \
        --set lr="$lr" --out "$out/lora_$lr"
done
run full "$focus" finetune --config "$config" "${common[@]}" --set method=full --set lr="$FULL_LR" \
    --out "$out/full"

opts() {
    case $1 in
        base) echo "--model $model" ;;
        focus) echo "--model $model --router $out/focus/router.h5 --attn hard --topk 2" ;;
        full) echo "--model $out/full/model.gguf --tokenizer $model" ;;
        *) echo "--model $model --lora $out/lora_$1/lora.h5" ;;
    esac
}
[ -f "$out/forgetting.tsv" ] && [ -n "${EVAL_METHODS:-}" ] || printf 'method\tpg19_ppl\twikitext2_ppl\tlambada\tarc_easy\tarc_challenge\tpiqa\thellaswag\tpasskey\n' > "$out/forgetting.tsv"
# EVAL_METHODS: evaluate only these (their rows are appended), e.g. after an interruption
for m in ${EVAL_METHODS:-base focus ${LORA_LRS//,/ } full}; do
    read -r -a o <<< "$(opts "$m")"
    o_ppl=("${o[@]}"); [ "$m" = full ] && o_ppl=(--model "$out/full/model.gguf")
    p1=$("$focus" eval ppl "${o_ppl[@]}" --data cache/shards/pg19test --ctx 1024 --max-tokens "$PPL_TOKENS" 2>/dev/null | sed -n 's/^perplexity \([0-9.]*\).*/\1/p')
    p2=$("$focus" eval ppl "${o_ppl[@]}" --data cache/shards/wikitext2 --ctx 1024 --max-tokens "$PPL_TOKENS" 2>/dev/null | sed -n 's/^perplexity \([0-9.]*\).*/\1/p')
    o_tok=("${o[@]}"); [ "$m" != full ] && o_tok+=(--tokenizer "$model")
    "$focus" eval tasks "${o_tok[@]}" --limit "$TASK_LIMIT" --out "$out/tasks_$m.json" > "$out/tasks_$m.log" 2>/dev/null
    acc() { python3 -c "import json,sys; print('%.3f' % json.load(open(sys.argv[1]))['tasks'][sys.argv[2]]['acc'])" "$out/tasks_$m.json" "$1"; }
    mode=dense; po=("${o_tok[@]}")
    if [ "$m" = focus ]; then mode=hard:2; po=(--model "$model" --router "$out/focus/router.h5"); fi
    "$focus" eval passkey "${po[@]}" --modes "$mode" --lengths "$PASSKEY_LENGTHS" --depths 0,0.25,0.5,0.75 --trials 1 > "$out/passkey_$m.log" 2>/dev/null
    pk=$(sed -n 's/^[^ ]*: \([0-9]* of [0-9]*\) retrieved.*/\1/p' "$out/passkey_$m.log" | tr ' ' _)
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$m" "$p1" "$p2" "$(acc lambada)" "$(acc arc_easy)" \
        "$(acc arc_challenge)" "$(acc piqa)" "$(acc hellaswag)" "$pk" >> "$out/forgetting.tsv"
done
python3 - "$out" "$STEPS" <<'PY'
import csv, sys
out, steps = sys.argv[1], sys.argv[2]
rows = list(csv.DictReader(open(f"{out}/forgetting.tsv"), delimiter="\t"))
cols = ["pg19_ppl", "wikitext2_ppl", "lambada", "arc_easy", "arc_challenge", "piqa", "hellaswag", "passkey"]
with open(f"{out}/forgetting.md", "w") as f:
    f.write(f"{steps} steps of 1 x 1024 tokens of PG-19 for each trained method; focus evaluated hard top-2\n\n")
    f.write("| method | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols) + "\n")
    for r in rows:
        f.write(f"| {r['method']} | " + " | ".join(r[c].replace('_', ' ') for c in cols) + " |\n")
print(open(f"{out}/forgetting.md").read())
PY
