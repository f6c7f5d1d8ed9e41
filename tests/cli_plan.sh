#!/usr/bin/env bash
# focus plan against what a run takes: a 2-step SmolLM2 router training (T = 512, on the Tiny
# Shakespeare text) prints its peak memory next to the plan; they must agree within 10 %. Also:
# plan's refusals and its fit search; the bf16 weight store (weights = bf16) the same way, its
# router accepted by the fp32 model; and the same comparison for 3 tensor-parallel ranks
# (mpirun -np 3 ... --tp 3: rank 0's peak against focus plan --tp 3). Needs the SmolLM2 file (scripts/fetch_model.sh) and
# ../shared/data (skips with 77). A third argument 1 (a sanitizer build, whose shadow memory and
# redzones add a fifth to the peak) leaves the 10 % comparison out.
set -u
focus=$1; src=$2; sanitized=${3:-0}
cd "$src"
model=cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$model" ] || { echo "cli_plan: skipped (no $model)"; exit 77; }
[ -f ../shared/data/tinyshakespeare/input.txt ] || { echo "cli_plan: skipped (no ../shared/data)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0; pass=0
ok() { pass=$((pass + 1)); echo "  ok   $1"; }
bad() { fail=$((fail + 1)); echo "  FAIL $1"; }
out=$("$focus" retrofit --config configs/smollm2_quality.conf --set T=512 --set steps=2 \
  --set eval_every=1000000 --set eval_tokens=1024 --set ckpt_every=1000 \
  --set train=../shared/data/tinyshakespeare/input.txt --set val= --set val_fraction=0.01 \
  --out "$work/run" 2>&1)
line=$(echo "$out" | grep "^memory: peak")
read -r peak plan tokens < <(echo "$line" | sed 's/memory: peak \([0-9]*\) MiB.* plan (focus plan) \([0-9]*\) MiB and the tokens \([0-9]*\) MiB/\1 \2 \3/')
if [ "$sanitized" = 1 ] && [ -n "${peak:-}" ]; then
  ok "sanitizer build: the run printed its peak ($peak MiB) and the plan ($plan MiB); not compared"
elif [ -n "${peak:-}" ] && awk -v p="$peak" -v q="$plan" -v t="$tokens" 'BEGIN { r = p / (q + t); exit !(r > 0.9 && r < 1.1) }'; then
  ok "measured peak $peak MiB, plan $plan + tokens $tokens MiB: within 10 %"
else
  bad "plan against the run: '$line'"; echo "$out" | tail -5
fi
# the same with the bf16 weight store; its router then serves the fp32 model (same fingerprint)
outb=$("$focus" retrofit --config configs/smollm2_quality.conf --set T=512 --set steps=2 \
  --set eval_every=1000000 --set eval_tokens=1024 --set ckpt_every=1000 --set weights=bf16 \
  --set train=../shared/data/tinyshakespeare/input.txt --set val= --set val_fraction=0.01 \
  --out "$work/runb" 2>&1)
lineb=$(echo "$outb" | grep "^memory: peak")
read -r peakb planb tokensb < <(echo "$lineb" | sed 's/memory: peak \([0-9]*\) MiB.* plan (focus plan) \([0-9]*\) MiB and the tokens \([0-9]*\) MiB/\1 \2 \3/')
pb=$("$focus" plan --preset smollm2-135m --T 512 --weights bf16-proj | sed -n 's/^  total *\([0-9.]*\) GB/\1/p')
if [ "$sanitized" = 1 ] && [ -n "${peakb:-}" ]; then
  ok "sanitizer build: the bf16 run printed its peak ($peakb MiB); not compared"
elif [ -n "${peakb:-}" ] && [ -n "${peak:-}" ] && awk -v p="$peakb" -v q="$planb" -v t="$tokensb" -v a="$pb" -v f="$peak" \
     'BEGIN { r = p / (q + t); d = a * 1e9 / 1048576 - q; exit !(r > 0.9 && r < 1.1 && d < 2 && d > -2 && p < 0.9 * f) }'; then
  ok "weights=bf16: peak $peakb MiB (fp32: $peak), plan $planb + tokens $tokensb MiB: within 10 %"
else
  bad "bf16 plan against the run: '$lineb', focus plan --weights bf16-proj $pb GB"; echo "$outb" | tail -5
fi
ev=$("$focus" eval ppl --model "$model" --data ../shared/data/tinyshakespeare/input.txt --max-tokens 256 \
  --ctx 128 --router "$work/runb/router.h5" --attn hard --topk 2 2>&1)
echo "$ev" | grep -q "^perplexity" && ok "the bf16-trained router evaluates on the fp32 model" || bad "bf16 router on fp32: $ev"
# the same with tensor parallelism: 3 ranks, each a third of the heads and F (mpirun, 4th argument)
mpirun=${4:-}
if [ "$sanitized" != 1 ] && [ -n "$mpirun" ] && command -v "$mpirun" >/dev/null; then
  out3=$(OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    "$mpirun" --oversubscribe -np 3 "$focus" retrofit --tp 3 --config configs/smollm2_quality.conf \
    --set T=512 --set steps=2 --set eval_every=1000000 --set eval_tokens=1024 --set ckpt_every=1000 \
    --set train=../shared/data/tinyshakespeare/input.txt --set val= --set val_fraction=0.01 \
    --out "$work/run3" 2>&1)
  line3=$(echo "$out3" | grep "^memory: peak")
  read -r peak3 plan3 tokens3 < <(echo "$line3" | sed 's/memory: peak \([0-9]*\) MiB.* plan (focus plan) \([0-9]*\) MiB and the tokens \([0-9]*\) MiB/\1 \2 \3/')
  p3=$("$focus" plan --preset smollm2-135m --T 512 --tp 3 --ranks 3 | sed -n 's/^  total *\([0-9.]*\) GB per rank/\1/p')
  if [ -n "${peak3:-}" ] && awk -v p="$peak3" -v q="$plan3" -v t="$tokens3" -v a="$p3" \
       'BEGIN { r = p / (q + t); d = a * 1e9 / 1048576 - q; exit !(r > 0.9 && r < 1.1 && d < 2 && d > -2) }'; then
    ok "tp=3: rank 0's peak $peak3 MiB, plan $plan3 + tokens $tokens3 MiB (focus plan --tp 3: $p3 GB): within 10 %"
  else
    bad "tp=3 plan against the run: '$line3', focus plan $p3 GB"; echo "$out3" | tail -5
  fi
else
  echo "  (tensor-parallel comparison skipped: no mpirun, or a sanitizer build)"
fi
p=$("$focus" plan --preset smollm2-135m --T 512 | sed -n 's/^  total *\([0-9.]*\) GB/\1/p')
awk -v a="$p" -v b="$plan" 'BEGIN { d = a * 1e9 / 1048576 - b; exit !(d < 2 && d > -2) }' &&
  ok "focus plan prints the same total ($p GB)" || bad "focus plan total $p GB vs the run's plan $plan MiB"
fit=$("$focus" plan --preset llama2-7b --T 4096 --mem 80)
echo "$fit" | grep -q "fits in 80 GB: yes (the longest T that fits at 1 row per rank: " && ok "llama2-7b at T=4096 fits 80 GB, with the longest T" || bad "fit: $fit"
err=$("$focus" plan --B 3 --ranks 2 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && echo "$err" | grep -q "B=3 is not a multiple of the 2 data-parallel groups" && ok "B not a multiple of the groups refused" || bad "rc=$rc $err"
err=$("$focus" plan --gpus 6 --tp 4 --preset llama2-7b 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && echo "$err" | grep -q "6 GPUs are not a multiple of --tp 4" && ok "6 GPUs with tp=4 refused" || bad "rc=$rc $err"
err=$("$focus" plan --tp 2 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && echo "$err" | grep -q "tp=2 does not divide the model's 9 attention heads" && ok "smollm2 tp=2 refused (9 heads)" || bad "rc=$rc $err"
fit70=$("$focus" plan --preset llama2-70b --weights bf16 --T 2048 --mem 80)
echo "$fit70" | grep -q "smallest tensor parallelism that fits 80 GB per rank at T=2048: tp 4" &&
  ok "llama2-70b bf16 at T=2048 in 80 GB: tp 4 is the smallest that fits" || bad "70b: $fit70"
echo "cli_plan: $pass passed, $fail failed"
[ $fail -eq 0 ]
