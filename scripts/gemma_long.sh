#!/usr/bin/env bash
# Gemma 3 270M at long context (issue 26): its learned block selector fitted on the PG-19
# training books, then against dense and the training-free patterns at the same budget, on the
# global layers (the 15 sliding-window layers keep their own window of 512 in every mode):
# perplexity against context length (PG-19 test), passkey retrieval, model-level speed of the
# prompt and of decoding. Writes OUT/{selector.h5,fit.txt,curve*.tsv,passkey.tsv,speed.txt}.
#   bash scripts/gemma_long.sh [OUT]     (default OUT: runs/gemma_long; about 75 minutes on 2 cores)
# Needs build/focus, the model (bash scripts/fetch_model.sh gemma3-270m) and its PG-19 shards
# (bash scripts/pg19_shards.sh build/focus cache/models/gemma-3-270m-q4_k_m.gguf cache/shards/gemma3).
# PARTS (default "fit curve passkey speed") picks the parts to run; PARTS=router evaluates the
# token router of `focus retrofit --config configs/gemma3_pg19.conf --out runs/gemma3` (ROUTER,
# default runs/gemma3/router.h5): Focus k = 1 and k = 2 on the same tokens, passkey, speed;
# PARTS=mid every method at 16K (perplexity on the first 16,384 test tokens, prompt and decoding
# speed), the selector and the token router included (about 45 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/gemma_long}
focus=${FOCUS:-build/focus}
model=cache/models/gemma-3-270m-q4_k_m.gguf
shards=cache/shards/gemma3
parts=${PARTS:-fit curve passkey speed}
[ -f "$model" ] || { echo "gemma_long: $model missing (bash scripts/fetch_model.sh gemma3-270m)"; exit 1; }
[ -d "$shards/pg19test" ] || { echo "gemma_long: $shards missing (bash scripts/pg19_shards.sh ...)"; exit 1; }
mkdir -p "$out"
source scripts/blas_env.sh "$focus"
band=(--set w=512 --set sinks=4 --set block=64)
has() { [[ " $parts " == *" $1 "* ]]; }
if has fit; then
  # 4 windows of 8,192 training tokens, one held out; 8 blocks of 64 beyond the window of 512
  "$focus" fit-blocks --model "$model" --data "$shards/pg19train" --out "$out/selector.h5" \
      --ctx 8192 --windows 4 --heldout 1 --queries 192 --iters 200 --lr 0.02 --seed 1 \
      --budget uniform "${band[@]}" --set blocks=8 | tee "$out/fit.txt"
fi
modes=dense,window:512,blocks:8,blocks_learned:8
if has curve; then
  "$focus" eval curve --model "$model" --data "$shards/pg19test" --router "$out/selector.h5" \
      --modes dense,window:512 --ctx 1024 --max-tokens 16385 "${band[@]}" --out "$out/curve1k.tsv"
  "$focus" eval curve --model "$model" --data "$shards/pg19test" --router "$out/selector.h5" \
      --modes "$modes" --ctx 8192 --max-tokens 16385 "${band[@]}" --out "$out/curve8k.tsv"
  "$focus" eval curve --model "$model" --data "$shards/pg19test" --router "$out/selector.h5" \
      --modes "$modes" --ctx 32768 --max-tokens 32769 "${band[@]}" --out "$out/curve32k.tsv"
fi
if has passkey; then
  "$focus" eval passkey --model "$model" --router "$out/selector.h5" \
      --modes dense,window:512,blocks_learned:8 --lengths 8192,32768 --depths 0.25,0.75 \
      --trials 1 "${band[@]}" --out "$out/passkey.tsv"
fi
if has router; then
  router=${ROUTER:-runs/gemma3/router.h5}
  [ -f "$router" ] || { echo "gemma_long: $router missing (focus retrofit --config configs/gemma3_pg19.conf)"; exit 1; }
  "$focus" eval curve --model "$model" --data "$shards/pg19test" --router "$router" \
      --modes hard:1,hard:2 --ctx 8192 --max-tokens 16385 "${band[@]}" --out "$out/curve8k_router.tsv"
  "$focus" eval curve --model "$model" --data "$shards/pg19test" --router "$router" \
      --modes hard:1,hard:2 --ctx 32768 --max-tokens 32769 "${band[@]}" --out "$out/curve32k_router.tsv"
  "$focus" eval passkey --model "$model" --router "$router" --modes hard:1,hard:2 \
      --lengths 8192,32768 --depths 0.25,0.75 --trials 1 "${band[@]}" --out "$out/passkey_router.tsv"
  for ctx in 8192 32736; do
    for k in 1 2; do
      echo "== ctx $ctx router k=$k" | tee -a "$out/speed_router.txt"
      "$focus" bench decode --model "$model" --ctx "$ctx" -n 32 --router "$router" --topk $k \
          "${band[@]}" | tee -a "$out/speed_router.txt"
    done
  done
fi
if has speed; then
  : >"$out/speed.txt"
  for ctx in 8192 32736; do  # 32736 + 32 decoded = the context of 32,768
    for a in dense "window" "selector"; do
      case $a in
        dense) opt=() ;;
        window) opt=(--attn window) ;;
        selector) opt=(--router "$out/selector.h5") ;;
      esac
      echo "== ctx $ctx $a" | tee -a "$out/speed.txt"
      "$focus" bench decode --model "$model" --ctx "$ctx" -n 32 "${opt[@]}" "${band[@]}" \
          --set blocks=8 | tee -a "$out/speed.txt"
    done
  done
fi
if has mid; then
  router=${ROUTER:-runs/gemma3/router.h5}
  [ -f "$router" ] || { echo "gemma_long: $router missing (focus retrofit --config configs/gemma3_pg19.conf)"; exit 1; }
  "$focus" eval curve --model "$model" --data "$shards/pg19test" --router "$out/selector.h5" \
      --modes "$modes" --ctx 16384 --max-tokens 16385 "${band[@]}" --out "$out/curve16k.tsv"
  "$focus" eval curve --model "$model" --data "$shards/pg19test" --router "$router" \
      --modes hard:1,hard:2 --ctx 16384 --max-tokens 16385 "${band[@]}" --out "$out/curve16k_router.tsv"
  : >"$out/speed16k.txt"
  ctx=16352  # + 32 decoded = 16,384
  for a in dense window selector k1 k2; do
    case $a in
      dense) opt=() ;;
      window) opt=(--attn window) ;;
      selector) opt=(--router "$out/selector.h5" --set blocks=8) ;;
      k1) opt=(--router "$router" --topk 1) ;;
      k2) opt=(--router "$router" --topk 2) ;;
    esac
    echo "== ctx $ctx $a" | tee -a "$out/speed16k.txt"
    "$focus" bench decode --model "$model" --ctx "$ctx" -n 32 "${opt[@]}" "${band[@]}" \
        | tee -a "$out/speed16k.txt"
  done
fi
