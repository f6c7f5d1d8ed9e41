#!/usr/bin/env bash
# Data-parallel router training over MPI ranks (focus retrofit under mpirun) against one process
# with the same global batch, on configs/tiny.conf shrunk to seconds: 10 steps with 2 and with 4
# ranks give the same losses and the same router (its perplexity on the same base) to round-off,
# with the balanced beta, the EMA beta (beta_balance = 0) and the kl+attn objective; a run
# stopped on 2 ranks resumes in one process to the same end; B not a multiple of the ranks, and
# other commands under mpirun, are refused. Tensor parallelism (--tp): tp = 2 on 2 ranks, tp = 2
# with 2 data-parallel groups on 4, tp = 4 on 4 give the one-process run; a run stopped as tp = 2
# x dp = 2 resumes as dp = 2; ranks not a multiple of tp, and tp not dividing the heads, refused. Needs ../shared/data and mpirun (skips with 77).
set -u
focus=$1; src=$2; mpirun=${3:-mpirun}
[ -d "$src/../shared/data/tinyshakespeare" ] || { echo "cli_mpi: skipped (no ../shared/data)"; exit 77; }
command -v "$mpirun" >/dev/null || { echo "cli_mpi: skipped (no mpirun)"; exit 77; }
cd "$src"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=("$mpirun" --oversubscribe)
tok=../shared/data/gpt2-tokenizer
shk=../shared/data/tinyshakespeare/input.txt
fail=0; pass=0
ok() { pass=$((pass + 1)); echo "  ok   $1"; }
bad() { fail=$((fail + 1)); echo "  FAIL $1"; }
# the base model, once: every run below starts from the same file
"$focus" retrofit --config configs/tiny.conf --set pretrain_steps=30 --set pretrain_B=4 \
  --set steps=1 --set T=64 --set B=2 --set eval_tokens=64 --out "$work/base" > "$work/base.log" 2>&1 ||
  { cat "$work/base.log"; exit 1; }
run=(--config configs/tiny.conf --set model="$work/base/base.gguf" --set steps=10 --set B=4
     --set T=64 --set eval_every=5 --set eval_tokens=256 --set ckpt_every=5 --set warmup=2)
losses() { grep '"type": "train"' "$1/metrics.jsonl" | sed 's/.*"loss": \([^,]*\),.*/\1/'; }
same() { # two files of numbers, equal to a relative TOL (1e-5 unless a third argument)
    paste "$1" "$2" | awk -v tol="${3:-1e-5}" 'BEGIN { n = 0; bad = 0 } { n++; d = $1 - $2;
      if (d < 0) d = -d; if (d > tol * ($1 < 0 ? -$1 : $1) + 1e-7) bad++ }
      END { exit (n == 0 || bad > 0) }'
}
ppl() { # the router's hard top-1 perplexity on the base
    "$focus" eval ppl --model "$work/base/base.gguf" --tokenizer "$tok" --data "$shk" \
      --max-tokens 512 --ctx 64 --router "$1/router.h5" --attn hard --topk 1 2>/dev/null |
      sed -n 's/^perplexity \([0-9.]*\).*/\1/p'
}
# against_one WHAT REF OUT WANT: run OUT (done) has the 10 losses of one-process run REF, the same
# router perplexity, and its log says WANT. The perplexity is exp of a mean loss after ten steps
# whose sums ran in another order (tp splits the heads' projections): it is compared to 2e-4
# relative (4e-5 seen between tp = 2 and one process), the losses to 1e-5.
against_one() {
    local what=$1 ref=$2 out=$3 want=$4 got one
    losses "$out" > "$out.loss"
    got=$(ppl "$out"); one=$(ppl "$ref")
    printf '%s\n' "$one" > "$work/a"; printf '%s\n' "$got" > "$work/b"
    if same "$ref.loss" "$out.loss" && same "$work/a" "$work/b" 2e-4 &&
       [ "$(wc -l < "$out.loss")" -eq 10 ] && grep -q "$want" "$out.log"; then
        ok "$what = one process (10 losses, router perplexity $got vs $one)"
    else
        bad "$what differs (perplexity $got vs $one)"; paste "$ref.loss" "$out.loss"
    fi
}
for variant in "balanced" "ema:--set beta_balance=0" "kl+attn:--set objective=kl+attn"; do
    name=${variant%%:*}; extra=(); [ "$name" != "$variant" ] && read -r -a extra <<< "${variant#*:}"
    "$focus" retrofit "${run[@]}" "${extra[@]}" --out "$work/one_$name" > "$work/one_$name.log" 2>&1 ||
      { cat "$work/one_$name.log"; exit 1; }
    losses "$work/one_$name" > "$work/one_$name.loss"
    for np in 2 4; do
        out=$work/np${np}_$name
        "${mpi[@]}" -np $np "$focus" retrofit "${run[@]}" "${extra[@]}" --out "$out" > "$out.log" 2>&1 ||
          { bad "$name, $np ranks: the run failed"; tail -5 "$out.log"; continue; }
        against_one "$name: $np ranks" "$work/one_$name" "$out" "data-parallel over $np mpi ranks"
    done
done
# tensor parallelism (the model's 4 heads and 2 kv heads: tp = 2 splits them, tp = 4 keeps one
# shared kv copy per rank), alone and with data-parallel replicas of its groups
for layout in "2:2" "4:2" "4:4"; do
    np=${layout%%:*}; tp=${layout#*:}; out=$work/tp${tp}_np$np
    "${mpi[@]}" -np $np "$focus" retrofit "${run[@]}" --tp $tp --out "$out" > "$out.log" 2>&1 ||
      { bad "tp=$tp on $np ranks: the run failed"; tail -5 "$out.log"; continue; }
    against_one "tp=$tp on $np ranks" "$work/one_balanced" "$out" "tensor-parallel over $tp mpi ranks"
done
# stopped after 5 steps with tp = 2 and dp = 2, resumed on 2 ranks as 2 data-parallel replicas
"${mpi[@]}" -np 4 "$focus" retrofit "${run[@]}" --tp 2 --out "$work/tpswitch" --stop-after 5 > "$work/tpswitch.log" 2>&1
"${mpi[@]}" -np 2 "$focus" retrofit --resume "$work/tpswitch" > "$work/tpswitch2.log" 2>&1
losses "$work/tpswitch" > "$work/tpswitch.loss"
same "$work/one_balanced.loss" "$work/tpswitch.loss" && [ "$(wc -l < "$work/tpswitch.loss")" -eq 10 ] &&
  ok "tp=2 x dp=2 for 5 steps, then dp=2: the run of one process" ||
  { bad "resume from tp=2 with another layout differs"; paste "$work/one_balanced.loss" "$work/tpswitch.loss"; }
# stopped after 5 steps on 2 ranks, resumed in one process
"${mpi[@]}" -np 2 "$focus" retrofit "${run[@]}" --out "$work/switch" --stop-after 5 > "$work/switch.log" 2>&1
"$focus" retrofit --resume "$work/switch" > "$work/switch2.log" 2>&1
losses "$work/switch" > "$work/switch.loss"
same "$work/one_balanced.loss" "$work/switch.loss" && [ "$(wc -l < "$work/switch.loss")" -eq 10 ] &&
  ok "2 ranks for 5 steps, then one process: the run of one process" ||
  { bad "resume with another rank count differs"; paste "$work/one_balanced.loss" "$work/switch.loss"; }
# refusals
err=$("${mpi[@]}" -np 3 "$focus" retrofit "${run[@]}" --out "$work/three" 2>&1 >/dev/null)
echo "$err" | grep -q "B=4 is not a multiple of the 3 data-parallel ranks" && ok "B=4 on 3 ranks refused" || bad "3 ranks: $err"
err=$("${mpi[@]}" -np 3 "$focus" retrofit "${run[@]}" --tp 2 --out "$work/tp3" 2>&1 >/dev/null)
echo "$err" | grep -q "3 MPI ranks are not a multiple of --tp 2" && ok "3 ranks with tp=2 refused" || bad "3 ranks, tp=2: $err"
err=$("${mpi[@]}" -np 3 "$focus" retrofit "${run[@]}" --tp 3 --out "$work/tp3" 2>&1 >/dev/null)
echo "$err" | grep -q "tp=3 does not divide the model's 4 attention heads" && ok "tp=3 of 4 heads refused" || bad "tp=3: $err"
# (where no GPU is, the device is refused first)
err=$("${mpi[@]}" -np 2 "$focus" retrofit "${run[@]}" --tp 2 --device cuda --out "$work/tpgpu" 2>&1 >/dev/null)
echo "$err" | grep -q "a tensor-parallel model runs on CPU ranks (MPI)\\|--device cuda: no usable CUDA device" && ok "tp on --device cuda refused with a reason" || bad "tp cuda: $err"
# bench forward --tp: the same random model, sliced, gives the one-process loss
bl() { sed -n 's/^forward dense .* loss \([0-9.]*\).*/\1/p'; }
one=$("$focus" bench forward --preset tiny-llama --T 64 --iters 1 | bl)
two=$("${mpi[@]}" -np 2 "$focus" bench forward --preset tiny-llama --T 64 --iters 1 --tp 2 | bl)
[ -n "$one" ] && [ "$one" = "$two" ] && ok "bench forward --tp 2: loss $two, one process $one" || bad "bench forward --tp 2: '$two' vs '$one'"
err=$("${mpi[@]}" -np 2 "$focus" bench forward --preset tiny-llama --T 64 2>&1 >/dev/null)
echo "$err" | grep -q "needs mpirun -np 1 (this run has 2 ranks)" && ok "bench forward: --tp and the rank count must agree" || bad "bench ranks: $err"
err=$("${mpi[@]}" -np 2 "$focus" eval ppl --model "$work/base/base.gguf" --data "$shk" 2>&1 >/dev/null)
echo "$err" | grep -q "only retrofit and bench forward run over MPI ranks" && ok "eval under mpirun refused" || bad "eval under mpirun: $err"
echo "cli_mpi: $pass passed, $fail failed"
[ $fail -eq 0 ]
