#!/usr/bin/env bash
# Does a retrofit keep what the model could do? Zero-shot tasks (0-shot, and k-shot prompts long
# enough for the router to act), passkey retrieval and perplexity against context length, dense
# against Focus modes, on one model and router. Sized for a 2-core CPU by default (about 45
# minutes for SmolLM2-135M); the environment variables below scale it.
#   bash scripts/long_evals.sh OUT MODEL ROUTER [DATA]
# OUT gets tasks0.json, tasks_k.json, passkey.tsv/.png, curve.tsv/.png and the logs.
set -euo pipefail
out=$1; model=$2; router=$3; data=${4:-../shared/data/pg19-sample/test}
focus=${FOCUS:-build/focus}
LIMIT0=${LIMIT0:-100}           # items per task, 0-shot
SHOTS=${SHOTS:-16}              # k-shot prompts (hundreds of tokens: the router acts)
LIMITK=${LIMITK:-40}            # items per task, k-shot
MODES=${MODES:-dense,hard:1,hard:2}
LENGTHS=${LENGTHS:-1024,2048,4096}
DEPTHS=${DEPTHS:-0,0.25,0.5,0.75,1}
TRIALS=${TRIALS:-2}
CTX=${CTX:-512,1024,2048,4096,8192}
CURVE_TOKENS=${CURVE_TOKENS:-8192}
CURVE_MODES=${CURVE_MODES:-dense,soft,hard:1,hard:2}
mkdir -p "$out"
python3 -c "import matplotlib" 2>/dev/null || python3 -m pip install --quiet matplotlib
for mode in ${MODES//,/ }; do
    args=(); [ "$mode" != dense ] && args=(--router "$router" --attn hard --topk "${mode#hard:}")
    "$focus" eval tasks --model "$model" "${args[@]}" --limit "$LIMIT0" \
        --out "$out/tasks0_${mode/:/}.json" > "$out/tasks0_${mode/:/}.log" 2> /dev/null
    "$focus" eval tasks --model "$model" "${args[@]}" --tasks arc_easy,piqa --shots "$SHOTS" \
        --limit "$LIMITK" --out "$out/tasks${SHOTS}_${mode/:/}.json" > "$out/tasks${SHOTS}_${mode/:/}.log" 2> /dev/null
done
"$focus" eval passkey --model "$model" --router "$router" --modes "$MODES" --lengths "$LENGTHS" \
    --depths "$DEPTHS" --trials "$TRIALS" --out "$out/passkey.tsv" > "$out/passkey.log" 2> /dev/null
python3 scripts/plot_passkey.py "$out/passkey.tsv" "$out/passkey.png"
"$focus" eval curve --model "$model" --router "$router" --data "$data" --modes "$CURVE_MODES" --ctx "$CTX" \
    --max-tokens "$CURVE_TOKENS" --out "$out/curve.tsv" > "$out/curve.log" 2> /dev/null
python3 scripts/plot_curve.py "$out/curve.tsv" "$out/curve.png"
cat "$out"/tasks*.log "$out/passkey.log" "$out/curve.log"
