#!/usr/bin/env bash
# focus retrofit through the command line on configs/tiny.conf, shrunk to seconds:
# an interrupted run resumed with --resume reproduces the uninterrupted run's losses bit for
# bit; eval with the router works; a truncated router.h5 and a router on another base model are
# refused, and so is a resume with other attention sinks; eval with several budgets and eval
# layers work; the kl, attn, kl+attn and mass objectives run (mass resumes bit for bit); eval tasks writes its results and refuses
# a malformed task file; eval passkey and eval curve run every mode; finetune (LoRA, full) writes
# what eval loads back; pretrain trains dense and Focus models from scratch; runs killed at
# several points resume to the same router.h5 byte for byte; a folder in use is refused; the
# retrofitted model serves from its file (a batched prompt = the prompt token by token; generate
# and bench decode with the router); focus average of routers from one start. Needs
# ../shared/data (skips with 77).
set -u
focus=$1; src=$2
[ -d "$src/../shared/data/tinyshakespeare" ] || { echo "cli_retrofit: skipped (no ../shared/data)"; exit 77; }
cd "$src"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
small=(--set pretrain_steps=8 --set pretrain_B=2 --set steps=6 --set B=2 --set T=64 --set eval_every=3
       --set eval_tokens=256 --set ckpt_every=2 --set warmup=2)
fail=0; pass=0
ok() { pass=$((pass + 1)); echo "  ok   $1"; }
bad() { fail=$((fail + 1)); echo "  FAIL $1"; }
"$focus" retrofit --config configs/tiny.conf "${small[@]}" --out "$work/full" > "$work/full.log" 2>&1 || { cat "$work/full.log"; exit 1; }
"$focus" retrofit --config configs/tiny.conf "${small[@]}" --out "$work/part" --stop-after 3 > "$work/part.log" 2>&1 || { cat "$work/part.log"; exit 1; }
"$focus" retrofit --resume "$work/part" > "$work/resume.log" 2>&1 || { cat "$work/resume.log"; exit 1; }
grep '"type": "train"' "$work/full/metrics.jsonl" | sed 's/"tokens_per_s": [0-9.]*, "ms": [0-9.]*, "comm_ms": [0-9.]*, //' > "$work/a"
grep '"type": "train"' "$work/part/metrics.jsonl" | sed 's/"tokens_per_s": [0-9.]*, "ms": [0-9.]*, "comm_ms": [0-9.]*, //' > "$work/b"
if [ "$(wc -l < "$work/a")" -eq 6 ] && cmp -s "$work/a" "$work/b"; then ok "resumed run reproduces all 6 steps bit for bit"; else bad "resumed losses differ"; diff "$work/a" "$work/b"; fi
cmp -s "$work/full/router.h5" "$work/part/router.h5" && ok "resumed router.h5 equals the uninterrupted one byte for byte" || bad "resumed router.h5 differs in bytes"
# killed (SIGKILL) at several points, during training or a checkpoint write, then resumed: the
# same router.h5 byte for byte; a run killed before its first checkpoint restarts cleanly
"$focus" retrofit --config configs/tiny.conf "${small[@]}" --set ckpt_every=1 --out "$work/ref1" > /dev/null 2>&1
for delay in 0 0.2 0.5 1; do
    k="$work/kill_$delay"
    "$focus" retrofit --config configs/tiny.conf "${small[@]}" --set ckpt_every=1 --out "$k" > "$k.log" 2>&1 &
    pid=$!
    while kill -0 $pid 2>/dev/null && [ ! -f "$k/config.conf" ]; do sleep 0.05; done
    sleep $delay; kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
    [ $delay = 0 ] && { rm -f "$k/router.h5"; touch "$k/router.h5.tmp.12345"; } # before any checkpoint
    "$focus" retrofit --resume "$k" > "$k.resume.log" 2>&1
    if cmp -s "$k/router.h5" "$work/ref1/router.h5" && [ -z "$(ls "$k" | grep '\.tmp\.')" ]; then ok "killed after ${delay} s and resumed: router.h5 identical, no temporary files left"; else bad "kill at $delay s: router.h5 differs or temporary files remain"; ls "$k"; tail -3 "$k.resume.log"; fi
done
grep -q "no checkpoint yet" "$work/kill_0.resume.log" && ok "resume before the first checkpoint starts over" || bad "resume without checkpoint: $(tail -1 "$work/kill_0.resume.log")"
# a full disk (here a file-size limit) while writing a checkpoint: one line, exit 1, no crash, the
# checkpoint before it intact and still loadable
"$focus" retrofit --config configs/tiny.conf "${small[@]}" --set ckpt_every=1 --out "$work/full_disk" --stop-after 1 > /dev/null 2>&1
cp "$work/full_disk/router.h5" "$work/keep.h5"
err=$( (ulimit -f 8; trap '' XFSZ; "$focus" retrofit --resume "$work/full_disk" 2>&1 >/dev/null) ); rc=$?
[ $rc -eq 1 ] && echo "$err" | grep -q "router.h5: write failed" && [ "$(echo "$err" | wc -l)" -eq 1 ] && cmp -s "$work/keep.h5" "$work/full_disk/router.h5" && [ -z "$(ls "$work/full_disk" | grep '\.tmp\.')" ] && ok "full disk: one line, exit 1, previous checkpoint intact" || bad "full disk: rc=$rc $err"
# one run per folder: a second run on a folder in use is refused
err=$(flock "$work/full/.lock" "$focus" retrofit --resume "$work/full" 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && echo "$err" | grep -q "another focus run is using this folder" && [ "$(echo "$err" | wc -l)" -eq 1 ] && ok "a second run on a folder in use is refused" || bad "lock: rc=$rc $err"
out=$("$focus" eval ppl --model "$work/full/base.gguf" --tokenizer ../shared/data/gpt2-tokenizer --data ../shared/data/tinyshakespeare/input.txt --max-tokens 300 --ctx 64 --router "$work/full/router.h5" --attn hard --topk 1 2>/dev/null)
echo "$out" | grep -q "pairs kept" && ok "eval ppl --router --attn hard" || bad "eval with router: $out"
# a router exported for sharing (no optimizer moments): smaller, the same evaluation
"$focus" export --model "$work/full/base.gguf" --router "$work/full/router.h5" --out "$work/shared.h5" > /dev/null 2>&1
ev=(eval ppl --model "$work/full/base.gguf" --tokenizer ../shared/data/gpt2-tokenizer --data ../shared/data/tinyshakespeare/input.txt --max-tokens 300 --ctx 64 --attn hard --topk 1)
a=$("$focus" "${ev[@]}" --router "$work/full/router.h5" 2>/dev/null | grep -E "^perplexity|^pairs" | sed 's/ [0-9.]* tokens\/s.*//')
b=$("$focus" "${ev[@]}" --router "$work/shared.h5" 2>/dev/null | grep -E "^perplexity|^pairs" | sed 's/ [0-9.]* tokens\/s.*//')
[ -s "$work/shared.h5" ] && [ "$(stat -c %s "$work/shared.h5")" -lt "$(stat -c %s "$work/full/router.h5")" ] && [ -n "$a" ] && [ "$a" = "$b" ] && ok "focus export: a smaller router.h5, the same perplexity and pairs" || bad "export: '$a' vs '$b'"
out=$("$focus" eval ppl --model "$work/full/base.gguf" --tokenizer ../shared/data/gpt2-tokenizer --data ../shared/data/tinyshakespeare/input.txt --max-tokens 300 --ctx 64 --router "$work/full/router.h5" --routing sinkhorn 2>/dev/null)
echo "$out" | grep -q "non-causal" && ok "sinkhorn evaluation marked non-causal" || bad "no non-causal mark: $out"
# serving the retrofitted model from the file's blocks: a batched prompt gives the perplexity
# of one fed token by token; generate and bench decode run with the router
shk=../shared/data/tinyshakespeare/input.txt
dec=(bench decode --model "$work/full/base.gguf" --tokenizer ../shared/data/gpt2-tokenizer --data "$shk" --ctx 40 -n 8 --router "$work/full/router.h5" --topk 1 --kv f32)
a=$("$focus" "${dec[@]}" --prefill exact 2>/dev/null | grep perplexity)
b=$("$focus" "${dec[@]}" --prefill steps 2>/dev/null | grep perplexity)
close=$(awk -v a="${a##* }" -v b="${b##* }" 'BEGIN { d = a - b; if (d < 0) d = -d; print (a > 0 && d < 1e-5 * a) ? 1 : 0 }')
[ -n "$a" ] && [ "$close" = 1 ] && ok "bench decode: batched prompt = token by token ($a)" || bad "bench decode: '$a' vs '$b'"
out=$(FOCUS_PROFILE=1 "$focus" bench decode --model "$work/full/base.gguf" --ctx 40 -n 8 --router "$work/full/router.h5" --topk 1 2>/dev/null)
echo "$out" | grep -q "native (the file's blocks), attention hard top-k, KV cache f16" && echo "$out" | grep -q "pairs kept" && ok "bench decode with a router, native weights, f16 cache" || bad "bench decode: $out"
# FOCUS_PROFILE=1: the prompt's parts and the decode steps' parts, each adding up to 100 %
# the parts add up to 100 %, and the attention's own parts (in brackets, where split) to its share
sums=$(echo "$out" | grep -E "^(prompt|decode) profile" | sed 's/.*token://; s/([^)]*)//' | tr ',' '\n' | grep -o "[0-9.]* %" | awk '{ s += $1 } NR % 8 == 0 { printf "%.0f ", s; s = 0 }')
split=$(echo "$out" | grep -E "^(prompt|decode) profile" | grep -o "attention [0-9.]* % ([^)]*)" | tr -d '(),' | awk '{ s = 0; for (i = 4; i <= NF; i++) if ($i == "%") s += $(i - 1); d = s - $2; printf "%s ", (d < 0.25 && d > -0.25) ? "ok" : "off" }')
[ "$sums" = "100 100 " ] && [ -n "$split" ] && ! echo "$split" | grep -q off && ok "FOCUS_PROFILE=1: the prompt's and the decode steps' parts ($sums), the attention's parts ($split)" || bad "profile: '$sums' '$split' $out"
out=$("$focus" generate --model "$work/full/base.gguf" --tokenizer ../shared/data/gpt2-tokenizer --router "$work/full/router.h5" --topk 1 --prompt "ROMEO: what light" -n 8 2>&1)
echo "$out" | grep -q "hard top-k over the group KV cache" && ok "generate with a router" || bad "generate: $out"
# --against dense: the steps alternate with dense ones over one cache, the prompt's calls go
# into the method's cache and a dense one in turn; a dense model's perplexity is then unchanged
# to the last digit (a prompt in calls of 16 rows scored as in one), a router's steps and
# prompt keep fewer pairs than dense's
dd=(bench decode --model "$work/full/base.gguf" --tokenizer ../shared/data/gpt2-tokenizer --data "$shk" --ctx 40 -n 8 --kv f32)
a=$("$focus" "${dd[@]}" 2>/dev/null | grep perplexity | grep -o "[0-9.]*$")
out=$("$focus" "${dd[@]}" --against dense --chunk 16 2>/dev/null)
b=$(echo "$out" | grep perplexity | grep -o "[0-9.]*$")
echo "$out" | grep -q "against dense, steps interleaved (4 of the method, 4 dense, one cache).*pairs kept 1.000 of dense's" && echo "$out" | grep -q "against dense, the prompt interleaved (calls of 16 rows.*pairs kept 1.000 of dense's" && [ -n "$a" ] && [ "$a" = "$b" ] && ok "bench decode --against dense: a dense model's prompt, steps and perplexity unchanged ($a)" || bad "--against dense, dense: '$a' vs '$b' $out"
out=$("$focus" bench decode --model "$work/full/base.gguf" --ctx 40 -n 8 --router "$work/full/router.h5" --topk 1 --against dense --chunk 16 2>/dev/null)
kept=$(echo "$out" | grep "steps interleaved" | grep -o "pairs kept [0-9.]* of dense's" | grep -o "[0-9.]*")
pkept=$(echo "$out" | grep "prompt interleaved" | grep -o "pairs kept [0-9.]* of dense's" | grep -o "[0-9.]*")
echo "$out" | grep -q "^decode profile (FOCUS_PROFILE=1; the method's steps)" && awk -v p="$kept" -v q="$pkept" 'BEGIN { exit !(p > 0 && p < 1 && q > 0 && q < 1) }' && ok "bench decode --against dense with a router: its steps keep $kept of the dense steps' pairs, its prompt $pkept" || bad "--against dense, router: $out"
err=$("$focus" bench decode --model "$work/full/base.gguf" --against window 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && echo "$err" | grep -q "against takes dense" && ok "bench decode --against window refused" || bad "--against window: rc=$rc $err"
err=$("$focus" bench decode --model "$work/full/base.gguf" --kv f8 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && echo "$err" | grep -q "kv must be f16 or f32" && ok "bench decode --kv f8 refused" || bad "--kv f8: rc=$rc $err"
head -c 3000 "$work/full/router.h5" > "$work/trunc.h5"
err=$("$focus" eval ppl --model "$work/full/base.gguf" --tokenizer ../shared/data/gpt2-tokenizer --data ../shared/data/tinyshakespeare/input.txt --router "$work/trunc.h5" 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && echo "$err" | grep -q "trunc.h5" && [ "$(echo "$err" | wc -l)" -eq 1 ] && ok "truncated router.h5 refused: $err" || bad "truncated router.h5: rc=$rc $err"
# a base model trained with another seed is a different model: its fingerprint must not match
"$focus" retrofit --config configs/tiny.conf "${small[@]}" --set seed=7 --stop-after 1 --out "$work/other" > /dev/null 2>&1
err=$("$focus" eval ppl --model "$work/other/base.gguf" --tokenizer ../shared/data/gpt2-tokenizer --data ../shared/data/tinyshakespeare/input.txt --router "$work/full/router.h5" 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && echo "$err" | grep -q "different base model" && ok "router on another base model refused" || bad "other base: rc=$rc $err"
# attention sinks are part of the router: a resume that asks for other sinks is refused
err=$("$focus" retrofit --resume "$work/part" --set sinks=0 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && echo "$err" | grep -q "trained with sinks = 4" && ok "resume with other sinks refused: $err" || bad "sinks mismatch: rc=$rc $err"
# several budgets in one evaluation, an adaptive one among them
data=(--model "$work/full/base.gguf" --tokenizer ../shared/data/gpt2-tokenizer --data ../shared/data/tinyshakespeare/input.txt --max-tokens 300 --ctx 64)
out=$("$focus" eval ppl "${data[@]}" --router "$work/full/router.h5" --attn hard --topk 1,p0.8 2>/dev/null)
[ "$(echo "$out" | grep -c "pairs kept")" -eq 2 ] && echo "$out" | grep -q "k=p0.8" && ok "eval --topk 1,p0.8: two budgets" || bad "topk list: $out"
out=$("$focus" eval layers "${data[@]}" --router "$work/full/router.h5" --attn hard --topk 1 2>/dev/null)
echo "$out" | grep -q "the 2 most sensitive: dense_layers = " && ok "eval layers suggests dense_layers" || bad "eval layers: $out"
l=$(echo "$out" | sed -n 's/^the 1 most sensitive: dense_layers = //p')
out=$("$focus" eval ppl "${data[@]}" --router "$work/full/router.h5" --attn hard --set dense_layers="$l" 2>/dev/null)
echo "$out" | grep -q "dense layers $l," && ok "eval --set dense_layers=$l" || bad "dense_layers: $out"
# --attn-error: dense attention is no error, the window's error is the window column's, and a
# router's rows are there for every layer
out=$("$focus" eval ppl "${data[@]}" --set w=16 --attn-error 2>/dev/null)
rows=$(echo "$out" | sed -n '/^layer  heads/,$p' | sed 1d)
[ -n "$rows" ] && echo "$rows" | awk '$2 != 0 || $4 != 0 || $3 <= 0 { bad = 1 } END { exit bad }' && ok "eval --attn-error: dense is no error" || bad "attn-error dense: $out"
out=$("$focus" eval ppl "${data[@]}" --attn window --set w=16 --attn-error 2>/dev/null)
rows=$(echo "$out" | sed -n '/^layer  heads/,$p' | sed 1d)
[ -n "$rows" ] && echo "$rows" | awk '$2 != $3 || $4 != $5 || $2 <= 0 { bad = 1 } END { exit bad }' && ok "eval --attn-error: the window is the window column" || bad "attn-error window: $out"
out=$("$focus" eval ppl "${data[@]}" --router "$work/full/router.h5" --attn hard --topk 1 --attn-error 2>/dev/null)
L=$(echo "$out" | sed -n '/^layer  heads/,$p' | sed 1d | wc -l)
[ "$L" -ge 2 ] && ok "eval --attn-error with a router: $L layers" || bad "attn-error router: $out"
# the objectives that target the dense model run end to end
for obj in kl attn kl+attn; do
    "$focus" retrofit --config configs/tiny.conf "${small[@]}" --set steps=2 --set eval_every=2 --set objective=$obj --out "$work/obj" > "$work/obj.log" 2>&1
    grep -q "^step     2/2 | $obj " "$work/obj.log" && grep -q "after:" "$work/obj.log" && ok "objective $obj" || { bad "objective $obj"; tail -3 "$work/obj.log"; }
    rm -rf "$work/obj"
done
# the mass objective (train/mass.c): teacher windows, then router steps; a run stopped after step
# 2 and resumed gives the uninterrupted run's losses and router.h5 bit for bit, collecting no
# teacher window again; a truncated teacher file is refused in one line naming it
mass=("${small[@]}" --set objective=mass --set T=128 --set w=8 --set mass_windows=2 --set mass_every=1 --set mass_keys=8 --set steps=4)
"$focus" retrofit --config configs/tiny.conf "${mass[@]}" --out "$work/mass" > "$work/mass.log" 2>&1
"$focus" retrofit --config configs/tiny.conf "${mass[@]}" --out "$work/mass2" --stop-after 2 > "$work/mass2.log" 2>&1
"$focus" retrofit --resume "$work/mass2" > "$work/mass3.log" 2>&1
strip() { grep '"type": "train"' "$1" | sed 's/"ms": [0-9.]*, //'; }
grep -q "^step     4/4 | mass " "$work/mass.log" && grep -q "after:" "$work/mass.log" && grep -q "memory: peak .* the plan" "$work/mass.log" &&
  [ "$(strip "$work/mass/metrics.jsonl" | wc -l)" -eq 4 ] && cmp -s <(strip "$work/mass/metrics.jsonl") <(strip "$work/mass2/metrics.jsonl") &&
  cmp -s "$work/mass/router.h5" "$work/mass2/router.h5" && grep -q "2 on disk, 0 to collect" "$work/mass3.log" &&
  ok "objective mass: 4 steps, resumed bit for bit without collecting again" || { bad "objective mass"; tail -3 "$work/mass.log" "$work/mass3.log"; }
t0=$work/mass2/teacher/window_0000.bin
head -c 1000 "$t0" > "$work/cut" && mv "$work/cut" "$t0"
err=$("$focus" retrofit --resume "$work/mass2" 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && echo "$err" | grep -q "window_0000.bin: 1000 bytes, expected" && [ "$(echo "$err" | wc -l)" -eq 1 ] && ok "truncated teacher file refused: $err" || bad "truncated teacher: rc=$rc $err"
# domain adaptation: a run that starts from a trained router (init_router) loads it, not the seed's
"$focus" retrofit --config configs/tiny.conf "${mass[@]}" --set steps=2 --set init_router="$work/mass/router.h5" --out "$work/mass4" > "$work/mass4.log" 2>&1
a=$(sed -n 's/^before training.*hard k=1 \([0-9.]*\).*/\1/p' "$work/mass4.log"); b=$(sed -n 's/^  after: .*hard k=1 \([0-9.]*\).*/\1/p' "$work/mass.log")
grep -q "router initialised from $work/mass/router.h5" "$work/mass4.log" && [ -n "$a" ] && [ "$a" = "$b" ] &&
  ok "init_router: the run starts from the trained router (hard k=1 $a, as it ended)" || { bad "init_router: '$a' '$b'"; tail -3 "$work/mass4.log"; }
# anchor (L2-SP, train_anchor_step): a pull the whole way back each step (lr x anchor >= 1),
# beta frozen, leaves the router where it started: its perplexity after is the one before; a run
# with a partial pull stopped and resumed is the uninterrupted one bit for bit (the anchor read
# again from init_router); anchor without init_router refused in one line
an=("${mass[@]}" --set steps=2 --set init_router="$work/mass/router.h5")
"$focus" retrofit --config configs/tiny.conf "${an[@]}" --set anchor=1e6 --set beta_balance=0 --out "$work/mass7" > "$work/mass7.log" 2>&1
a=$(sed -n 's/^  before: .*hard k=1 \([0-9.]*\).*/\1/p' "$work/mass7.log"); c=$(sed -n 's/^  after: .*hard k=1 \([0-9.]*\).*/\1/p' "$work/mass7.log")
"$focus" retrofit --config configs/tiny.conf "${an[@]}" --set anchor=20 --out "$work/mass8" > /dev/null 2>&1
"$focus" retrofit --config configs/tiny.conf "${an[@]}" --set anchor=20 --out "$work/mass9" --stop-after 1 > /dev/null 2>&1
"$focus" retrofit --resume "$work/mass9" > /dev/null 2>&1
err=$("$focus" retrofit --config configs/tiny.conf "${mass[@]}" --set anchor=1 --out "$work/mass10" 2>&1 >/dev/null); rc=$?
[ -n "$a" ] && [ "$a" = "$c" ] && [ "$a" = "$b" ] && cmp -s "$work/mass8/router.h5" "$work/mass9/router.h5" &&
  [ $rc -ne 0 ] && echo "$err" | grep -q "init_router is not set" && [ "$(echo "$err" | wc -l)" -eq 1 ] &&
  ok "anchor: the whole pull keeps the router (hard k=1 $a before and after), resumes bit for bit; alone refused: $err" ||
  { bad "anchor: '$a' '$c' '$b' rc=$rc $err"; tail -3 "$work/mass7.log"; }
# focus average (routers retrofitted from the same init_router): a router averaged with itself
# evaluates as it does; two runs' mean evaluates as neither, whatever their order; a router
# from another start (here its seed's initialisation), or one alone, is refused in one line
mb=$work/mass4/base.gguf
avg() { "$focus" average --model "$mb" --out "$@" > /dev/null 2>&1; }
avg "$work/avg_aa.h5" "$work/mass4/router.h5" "$work/mass4/router.h5"
avg "$work/avg_ab.h5" "$work/mass4/router.h5" "$work/mass8/router.h5"
avg "$work/avg_ba.h5" "$work/mass8/router.h5" "$work/mass4/router.h5"
pe() { "$focus" eval ppl --model "$mb" --tokenizer ../shared/data/gpt2-tokenizer --data ../shared/data/tinyshakespeare/input.txt --max-tokens 300 --ctx 128 --attn hard --topk 1 --router "$1" 2>/dev/null | grep -E "^perplexity|^pairs" | sed 's/ [0-9.]* tokens\/s.*//'; }
v4=$(pe "$work/mass4/router.h5"); v8=$(pe "$work/mass8/router.h5"); vaa=$(pe "$work/avg_aa.h5"); vab=$(pe "$work/avg_ab.h5"); vba=$(pe "$work/avg_ba.h5")
err=$("$focus" average --model "$mb" --out "$work/avg_x.h5" "$work/mass4/router.h5" "$work/mass/router.h5" 2>&1 >/dev/null); rc=$?
err2=$("$focus" average --model "$mb" --out "$work/avg_x.h5" "$work/mass4/router.h5" 2>&1 >/dev/null); rc2=$?
[ -n "$v4" ] && [ "$vaa" = "$v4" ] && [ -n "$vab" ] && [ "$vab" = "$vba" ] && [ "$vab" != "$v4" ] && [ "$vab" != "$v8" ] &&
  [ $rc -ne 0 ] && echo "$err" | grep -q "only routers retrofitted from the same one" && [ "$(echo "$err" | wc -l)" -eq 1 ] &&
  [ $rc2 -ne 0 ] && [ "$(echo "$err2" | wc -l)" -eq 1 ] && [ ! -e "$work/avg_x.h5" ] &&
  ok "focus average: A with A is A, A with B is neither and commutes; another start refused" ||
  { bad "average: '$v4' '$v8' '$vaa' '$vab' '$vba' rc=$rc $err / rc2=$rc2 $err2"; }
# rehearse (domain adaptation that keeps the old text): rehearse_windows teacher windows drawn
# from it beside train's, in files of their own; train's windows are the ones a run without it
# draws (the same offsets); stopped and resumed it is the uninterrupted run bit for bit; either
# setting without the other refused in one line, before the run folder is made
rh=("${mass[@]}" --set steps=2 --set init_router="$work/mass/router.h5" --set rehearse=../shared/data/wikitext-2/raw/wiki.test.raw --set rehearse_windows=1)
"$focus" retrofit --config configs/tiny.conf "${rh[@]}" --out "$work/mass11" > "$work/mass11.log" 2>&1
"$focus" retrofit --config configs/tiny.conf "${rh[@]}" --out "$work/mass12" --stop-after 1 > /dev/null 2>&1
"$focus" retrofit --resume "$work/mass12" > "$work/mass12.log" 2>&1
err=$("$focus" retrofit --config configs/tiny.conf "${mass[@]}" --set rehearse_windows=2 --out "$work/mass13" 2>&1 >/dev/null); rc=$?
err2=$("$focus" retrofit --config configs/tiny.conf "${small[@]}" --set rehearse=../shared/data/wikitext-2/raw/wiki.test.raw --out "$work/mass13" 2>&1 >/dev/null); rc2=$?
w0=$(grep -o 'teacher window 1/2 (train tokens [0-9.]*)' "$work/mass.log")
grep -q "teacher: 3 windows of 128 tokens (2 of train, 1 of rehearse = " "$work/mass11.log" && grep -q "teacher window 3/3 (rehearse tokens" "$work/mass11.log" &&
  [ -n "$w0" ] && grep -q "teacher window 1/3 (train tokens ${w0#*train tokens }" "$work/mass11.log" &&
  [ -s "$work/mass11/teacher/rehearse_0000.bin" ] && grep -q "^step     2/2 | mass " "$work/mass11.log" &&
  cmp -s "$work/mass11/router.h5" "$work/mass12/router.h5" && grep -q "3 on disk, 0 to collect" "$work/mass12.log" &&
  [ $rc -ne 0 ] && echo "$err" | grep -q "no rehearse = PATH" && [ "$(echo "$err" | wc -l)" -eq 1 ] &&
  [ $rc2 -ne 0 ] && echo "$err2" | grep -q "is read by the mass objective" && [ "$(echo "$err2" | wc -l)" -eq 1 ] && [ ! -e "$work/mass13" ] &&
  ok "rehearse: 2 windows of train (where a run without it draws them) and 1 of rehearse, resumed bit for bit; alone refused: $err" ||
  { bad "rehearse: rc=$rc $err / rc2=$rc2 $err2"; tail -3 "$work/mass11.log" "$work/mass12.log"; }
# a resume that would draw a window from other tokens (here: another rehearse text) is refused in
# one line naming the teacher file, not trained on the old file's tokens
err=$("$focus" retrofit --resume "$work/mass12" --set rehearse=../shared/data/tinyshakespeare/input.txt 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && echo "$err" | grep -q "rehearse_0000.bin: collected from tokens .*(other data)" && [ "$(echo "$err" | wc -l)" -eq 1 ] &&
  ok "a teacher window of other tokens refused: $err" || bad "teacher of other tokens: rc=$rc $err"
# a query projection (qproj = 1) started from that router: W_q = W_g, so it begins where the
# router ended; it trains, resumes bit for bit (W_q and its moments in router.h5) and evaluates in
# hard mode by default, its setting read back from the file
qp=("${mass[@]}" --set steps=2 --set qproj=1 --set init_router="$work/mass/router.h5")
"$focus" retrofit --config configs/tiny.conf "${qp[@]}" --out "$work/mass5" > "$work/mass5.log" 2>&1
"$focus" retrofit --config configs/tiny.conf "${qp[@]}" --out "$work/mass6" --stop-after 1 > /dev/null 2>&1
"$focus" retrofit --resume "$work/mass6" > /dev/null 2>&1
a=$(sed -n 's/^before training.*hard k=1 \([0-9.]*\).*/\1/p' "$work/mass5.log")
out=$("$focus" eval ppl --model "$work/mass5/base.gguf" --tokenizer ../shared/data/gpt2-tokenizer --data ../shared/data/tinyshakespeare/input.txt --max-tokens 300 --ctx 128 --router "$work/mass5/router.h5" 2>&1)
[ -n "$a" ] && [ "$a" = "$b" ] && grep -q "^step     2/2 | mass " "$work/mass5.log" && cmp -s "$work/mass5/router.h5" "$work/mass6/router.h5" &&
  echo "$out" | grep -q "attention hard top-k" && echo "$out" | grep -q "pairs kept" &&
  ok "qproj: starts as the router it extends (hard k=1 $a), resumes bit for bit, evaluates in hard mode" || { bad "qproj: '$a' '$b' $out"; tail -3 "$work/mass5.log"; }
rm -rf "$work/mass" "$work/mass2" "$work/mass4" "$work/mass5" "$work/mass6" "$work/mass7" "$work/mass8" "$work/mass9" "$work/mass10" "$work/mass11" "$work/mass12"
# zero-shot tasks through the router: the JSON result; a malformed task file refused in one line,
# before any result file is written
tm=(--model "$work/full/base.gguf" --tokenizer ../shared/data/gpt2-tokenizer --router "$work/full/router.h5" --attn hard)
"$focus" eval tasks "${tm[@]}" --tasks arc_easy,lambada --limit 3 --shots 1 --out "$work/tasks.json" > "$work/tasks.log" 2>/dev/null
grep -q '"arc_easy"' "$work/tasks.json" && grep -q '"perplexity"' "$work/tasks.json" && grep -q "| arc_easy | 3 |" "$work/tasks.log" && ok "eval tasks writes results" || { bad "eval tasks"; cat "$work/tasks.log"; }
printf '{"question": {"stem": "s"}}\n' > "$work/bad.jsonl"
err=$("$focus" eval tasks "${tm[@]}" --tasks arc_easy --task arc_easy="$work/bad.jsonl" --out "$work/bad.json" 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && [ ! -e "$work/bad.json" ] && echo "$err" | grep -q "bad.jsonl: line 1" && [ "$(echo "$err" | wc -l)" -eq 1 ] && ok "malformed task file refused: $err" || bad "bad task file: rc=$rc $err"
# long-context evaluations: passkey grid and perplexity curve through every mode; a length beyond
# the model's context refused in one line with no result file
"$focus" eval passkey "${tm[@]:0:6}" --modes dense,soft,hard:1 --lengths 100,200 --depths 0,1 --trials 1 --out "$work/pk.tsv" > "$work/pk.log" 2>/dev/null
[ "$(grep -c "" "$work/pk.tsv")" -eq 13 ] && grep -q "hard:1: .* retrieved" "$work/pk.log" && ok "eval passkey: 12 trials" || { bad "eval passkey"; cat "$work/pk.log"; }
err=$("$focus" eval passkey "${tm[@]:0:6}" --lengths 100000 --out "$work/pk2.tsv" 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && [ ! -e "$work/pk2.tsv" ] && echo "$err" | grep -q "context" && [ "$(echo "$err" | wc -l)" -eq 1 ] && ok "passkey beyond the context refused: $err" || bad "passkey length: rc=$rc $err"
"$focus" eval curve "${tm[@]:0:6}" --data ../shared/data/tinyshakespeare/input.txt --max-tokens 600 --ctx 64,128 --modes dense,hard:2 --out "$work/curve.tsv" > "$work/curve.log" 2>/dev/null
[ "$(grep -c "" "$work/curve.tsv")" -eq 5 ] && grep -q "| hard:2 |" "$work/curve.log" && ok "eval curve: 2 modes x 2 lengths" || { bad "eval curve"; cat "$work/curve.log"; }
# the training-free patterns, no router needed: a window or a block budget covering the whole
# context is dense to the printed digits; every pattern runs in eval curve and the needle tasks
ppl() { sed -n 's/^perplexity \([0-9.]*\).*/\1/p'; }
pd=$("$focus" eval ppl "${data[@]}" 2>/dev/null | ppl)
pw=$("$focus" eval ppl "${data[@]}" --attn window --set w=64 2>/dev/null | ppl)
pb=$("$focus" eval ppl "${data[@]}" --attn blocks --set w=4 --set block=8 --set blocks=8 2>/dev/null | ppl)
out=$("$focus" eval ppl "${data[@]}" --attn window --set w=8 --set sinks=2 2>/dev/null)
same() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a > 0 && (a - b) / a < 1e-6 && (b - a) / a < 1e-6) }'; }
kept=$(echo "$out" | sed -n 's/pairs kept \([0-9.]*\).*/\1/p')
[ -n "$pd" ] && same "$pd" "$pw" && same "$pd" "$pb" && echo "$out" | grep -q "attention window (no router): sinks=2, w=8" && awk -v k="$kept" 'BEGIN { exit !(k > 0.2 && k < 0.5) }' && ok "window and blocks at full budget = dense ($pd); window w=8 keeps $(echo "$out" | sed -n 's/pairs kept \([0-9.]*\).*/\1/p')" || bad "patterns: dense $pd window $pw blocks $pb; $out"
"$focus" eval curve --model "$work/full/base.gguf" --tokenizer ../shared/data/gpt2-tokenizer --data ../shared/data/tinyshakespeare/input.txt --max-tokens 300 --ctx 64 --modes dense,window:16,random:1,blocks:2,blocks_mean:2,oracle:2 --set block=8 --out "$work/curve_p.tsv" > "$work/curve_p.log" 2>/dev/null
[ "$(grep -c "" "$work/curve_p.tsv")" -eq 7 ] && grep -q "| oracle:2 | .* of pairs" "$work/curve_p.log" && ok "eval curve: six patterns, no router" || { bad "eval curve patterns"; cat "$work/curve_p.log"; }
# the learned block selector: fit-blocks writes a selector that eval ppl and eval curve take with
# --router; a budget covering every block is dense to the printed digits; a truncated file, one
# fitted on another base model, a token-router mode with it and the mode without it are refused
fb=(--model "$work/full/base.gguf" --tokenizer ../shared/data/gpt2-tokenizer --data ../shared/data/tinyshakespeare/input.txt)
"$focus" fit-blocks "${fb[@]}" --ctx 64 --windows 2 --queries 16 --iters 20 --set w=8 --set block=8 --set blocks=2 --budget uniform --out "$work/sel.h5" > "$work/fit.log" 2>&1
grep -q "learned selector .* mean over layers" "$work/fit.log" && [ -s "$work/sel.h5" ] && ok "fit-blocks writes a selector and its held-out report" || { bad "fit-blocks"; tail -5 "$work/fit.log"; }
# per-layer budgets (the default): from the same held-out data, again from the fitted weights
"$focus" fit-blocks "${fb[@]}" --ctx 64 --windows 0 --init "$work/sel.h5" --budget layers --queries 16 --set w=8 --set block=8 --set blocks=2 --out "$work/sel_l.h5" > "$work/fit_l.log" 2>&1
out=$("$focus" eval ppl "${data[@]}" --router "$work/sel_l.h5" --attn blocks_learned --set blocks=2 2>/dev/null)
grep -q "^per-layer budgets (2 blocks on average, at least 1, at most 8): [0-9] [0-9]$" "$work/fit_l.log" && echo "$out" | grep -q "on average (per-layer budgets)" && echo "$out" | grep -q "pairs kept" && ok "fit-blocks --init --windows 0: per-layer budgets, evaluated" || { bad "per-layer budgets: $out"; tail -4 "$work/fit_l.log"; }
out=$("$focus" eval ppl "${data[@]}" --router "$work/sel.h5" --attn blocks_learned --set blocks=2 2>/dev/null)
pl=$("$focus" eval ppl "${data[@]}" --router "$work/sel.h5" --attn blocks_learned --set blocks=8 2>/dev/null | ppl)
echo "$out" | grep -q "attention blocks (learned selector): 2 key blocks of 8 per query and key/value head, sinks=4, w=8" && echo "$out" | grep -q "pairs kept" && same "$pd" "$pl" && ok "eval ppl --router SELECTOR --attn blocks_learned; every block kept = dense ($pl)" || bad "blocks_learned: dense $pd full $pl; $out"
"$focus" eval curve "${fb[@]}" --max-tokens 300 --ctx 64 --router "$work/sel.h5" --modes dense,blocks:2,blocks_learned:2 > "$work/curve_l.log" 2>/dev/null
grep -q "| blocks_learned:2 | .* of pairs" "$work/curve_l.log" && ok "eval curve --modes blocks_learned:2" || { bad "eval curve blocks_learned"; cat "$work/curve_l.log"; }
head -c 3000 "$work/sel.h5" > "$work/sel_cut.h5"
err=$("$focus" eval ppl "${data[@]}" --router "$work/sel_cut.h5" --attn blocks_learned 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && echo "$err" | grep -q "sel_cut.h5: the .* is truncated or corrupt" && [ "$(echo "$err" | wc -l)" -eq 1 ] && ok "a truncated selector refused: $err" || bad "truncated selector: rc=$rc $err"
err=$("$focus" eval ppl --model "$work/other/base.gguf" --tokenizer ../shared/data/gpt2-tokenizer --data ../shared/data/tinyshakespeare/input.txt --router "$work/sel.h5" 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && echo "$err" | grep -q "different base model" && [ "$(echo "$err" | wc -l)" -eq 1 ] && ok "a selector on another base model refused" || bad "selector other base: rc=$rc $err"
err=$("$focus" eval curve "${fb[@]}" --max-tokens 300 --ctx 64 --router "$work/sel.h5" --modes hard:1 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && echo "$err" | grep -q "needs --router" && ok "a token-router mode with a selector refused" || bad "hard:1 with selector: rc=$rc $err"
err=$("$focus" eval ppl "${data[@]}" --attn blocks_learned 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && echo "$err" | grep -q "needs --router SELECTOR.h5" && ok "blocks_learned without a selector refused" || bad "blocks_learned alone: rc=$rc $err"
# the centroids beside the selector: a qproj router trained on the mass the selector's blocks miss
# (mass_selector), then --router SELECTOR,ROUTER evaluates the blocks with the groups' keys added
# (more pairs than the blocks alone) and generates; a teacher collected beside other blocks, and
# the files in the other order, are refused in one line
ms=("${small[@]}" --set model="$work/full/base.gguf" --set objective=mass --set T=128 --set w=8 --set mass_windows=2 --set mass_every=1 --set mass_keys=8 --set steps=2 --set qproj=1 --set mass_selector="$work/sel.h5" --set mass_blocks=2)
"$focus" retrofit --config configs/tiny.conf "${ms[@]}" --out "$work/msel" > "$work/msel.log" 2>&1
o1=$("$focus" eval ppl "${data[@]}" --router "$work/sel.h5" --attn blocks_learned --set blocks=2 2>/dev/null)
o2=$("$focus" eval ppl "${data[@]}" --router "$work/sel.h5,$work/msel/router.h5" --attn blocks_learned --set blocks=2 2>/dev/null)
k1=$(echo "$o1" | sed -n 's/pairs kept \([0-9.]*\).*/\1/p'); k2=$(echo "$o2" | sed -n 's/pairs kept \([0-9.]*\).*/\1/p')
g=$("$focus" generate --model "$work/full/base.gguf" --tokenizer ../shared/data/gpt2-tokenizer --router "$work/sel.h5,$work/msel/router.h5" --prompt "To be, or not" -n 4 2>/dev/null)
grep -q "key blocks of 8 per query .* leave out" "$work/msel.log" && grep -q "^step     2/2 | mass " "$work/msel.log" &&
  [ -n "$k1" ] && [ -n "$k2" ] && awk -v a="$k1" -v b="$k2" 'BEGIN { exit !(b > a) }' && [ -n "$g" ] &&
  ok "mass_selector: the centroids beside the blocks train, evaluate (pairs $k1 -> $k2) and generate" || { bad "mass_selector: '$k1' '$k2' '$g'"; tail -3 "$work/msel.log"; }
err=$("$focus" retrofit --resume "$work/msel" --set mass_blocks=3 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && echo "$err" | grep -q "window_0000.bin: collected beside 2 blocks per query of a block selector (0: none), this run asks for 3" && [ "$(echo "$err" | wc -l)" -eq 1 ] && ok "a teacher beside other blocks refused: $err" || bad "teacher blocks mismatch: rc=$rc $err"
# a teacher scored otherwise (mass_values = V) beside the same selector trains end to end, makes
# another router than the run PREV, and its teacher is refused by a run that asks for OTHER:
# teacher_score V OTHER PREV RUN "log line" "refusal" "what it checks"
teacher_score() {
  "$focus" retrofit --config configs/tiny.conf "${ms[@]}" --set mass_values=$1 --out "$work/$4" > "$work/$4.log" 2>&1
  err=$("$focus" retrofit --resume "$work/$4" --set mass_values=$2 2>&1 >/dev/null); rc=$?
  grep -q "$5" "$work/$4.log" && grep -q "^step     2/2 | mass " "$work/$4.log" &&
    ! cmp -s "$work/$3/router.h5" "$work/$4/router.h5" && [ $rc -ne 0 ] &&
    echo "$err" | grep -q "window_0000.bin: $6" && [ "$(echo "$err" | wc -l)" -eq 1 ] &&
    ok "$7: $err" || { bad "$7: rc=$rc $err"; tail -3 "$work/$4.log"; }
}
teacher_score 1 0 msel mselv "scored by the output it restores" \
  "scored by the output restored (mass_values = 1), this run asks for mass_values = 0" \
  "mass_values: the output-restoring teacher trains; its teacher refused by a mass run"
teacher_score 3 2 mselv msels "scored by the residual stream's error it closes" \
  "scored by the stream's error closed (mass_values = 3), this run asks for mass_values = 2" \
  "mass_values = 3: the stream's teacher trains; its teacher refused by another score"
err=$("$focus" eval ppl "${data[@]}" --router "$work/msel/router.h5,$work/sel.h5" 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && echo "$err" | grep -q "the first file must be a block selector" && [ "$(echo "$err" | wc -l)" -eq 1 ] && ok "--router ROUTER,SELECTOR refused: $err" || bad "router order: rc=$rc $err"
# focus groups reads a router with a query projection (its keys' groups) and refuses a selector
"$focus" groups --model "$work/full/base.gguf" --tokenizer ../shared/data/gpt2-tokenizer --router "$work/msel/router.h5" --data ../shared/data/tinyshakespeare/input.txt --tokens 256 --ctx 64 --out "$work/mgroups" > /dev/null 2>&1
err=$("$focus" groups --model "$work/full/base.gguf" --tokenizer ../shared/data/gpt2-tokenizer --router "$work/sel.h5" --data ../shared/data/tinyshakespeare/input.txt --tokens 256 --ctx 64 --out "$work/sgroups" 2>&1 >/dev/null); rc=$?
grep -q "a query picks its own by the router's query projection" "$work/mgroups/groups.txt" && [ -s "$work/mgroups/groups.svg" ] &&
  [ $rc -ne 0 ] && echo "$err" | grep -q "is a block selector" && [ "$(echo "$err" | wc -l)" -eq 1 ] &&
  ok "groups: a query-projection router's key groups; a selector refused: $err" || bad "groups qproj: rc=$rc $err"
rm -rf "$work/msel"
"$focus" eval passkey --model "$work/full/base.gguf" --tokenizer ../shared/data/gpt2-tokenizer --task niah_multikey --modes dense,window:16 --lengths 250 --depths 0.5 --trials 2 --out "$work/niah.tsv" > "$work/niah.log" 2>/dev/null
[ "$(grep -c "niah_multikey" "$work/niah.tsv")" -eq 4 ] && grep -q "window:16: .* retrieved" "$work/niah.log" && ok "eval passkey --task niah_multikey" || { bad "niah"; cat "$work/niah.log"; }
err=$("$focus" eval passkey --model "$work/full/base.gguf" --tokenizer ../shared/data/gpt2-tokenizer --task niah_colour --lengths 150 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && echo "$err" | grep -q "unknown --task 'niah_colour'" && [ "$(echo "$err" | wc -l)" -eq 1 ] && ok "unknown task refused: $err" || bad "unknown task: rc=$rc $err"
err=$("$focus" eval ppl "${data[@]}" --attn hard 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && echo "$err" | grep -q "needs --router" && ok "--attn hard without a router refused" || bad "hard without router: rc=$rc $err"
# the baselines: LoRA adapters and full fine-tuning on the same settings; the adapters load back
# onto their base model and are refused on another
"$focus" finetune --config configs/tiny.conf "${small[@]}" --set steps=3 --set lora_targets=qkv,o,fc,fcproj --out "$work/lora" > "$work/lora.log" 2>&1
out=$("$focus" eval ppl "${data[@]}" --lora "$work/lora/lora.h5" 2>/dev/null)
grep -q "finetune (lora)" "$work/lora.log" && echo "$out" | grep -q "^perplexity" && ok "finetune --method lora, eval --lora" || { bad "lora"; tail -3 "$work/lora.log"; }
out=$("$focus" eval passkey --model "$work/full/base.gguf" --tokenizer ../shared/data/gpt2-tokenizer --lora "$work/lora/lora.h5" --lengths 100 --depths 0 --trials 1 2>/dev/null)
echo "$out" | grep -q "dense: .* retrieved" && ok "eval passkey --lora" || bad "passkey --lora: $out"
err=$("$focus" eval ppl --model "$work/other/base.gguf" --tokenizer ../shared/data/gpt2-tokenizer --data ../shared/data/tinyshakespeare/input.txt --lora "$work/lora/lora.h5" 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && echo "$err" | grep -q "different base model" && [ "$(echo "$err" | wc -l)" -eq 1 ] && ok "adapters on another base model refused" || bad "lora other base: rc=$rc $err"
"$focus" finetune --config configs/tiny.conf "${small[@]}" --set steps=2 --set method=full --set lr=0.001 --out "$work/full_ft" > "$work/full_ft.log" 2>&1
out=$("$focus" eval ppl --model "$work/full_ft/model.gguf" --tokenizer ../shared/data/gpt2-tokenizer --data ../shared/data/tinyshakespeare/input.txt --max-tokens 300 --ctx 64 2>/dev/null)
echo "$out" | grep -q "^perplexity" && ok "finetune --method full writes a loadable GGUF" || { bad "full fine-tuning"; tail -3 "$work/full_ft.log"; }
# from scratch: dense and Focus (router trained jointly) runs; the Focus run's last router belongs
# to its last weights (eval loads them together); a pretrained base is refused
for attn in dense focus; do
    "$focus" pretrain --config configs/tiny.conf "${small[@]}" --set steps=3 --set eval_every=2 --attn $attn --out "$work/scratch_$attn" > "$work/scratch_$attn.log" 2>&1 || { bad "pretrain --attn $attn"; tail -3 "$work/scratch_$attn.log"; }
done
out=$("$focus" eval ppl --model "$work/scratch_focus/model.gguf" --tokenizer ../shared/data/gpt2-tokenizer --data ../shared/data/tinyshakespeare/input.txt --max-tokens 300 --ctx 64 --router "$work/scratch_focus/router.h5" --attn hard 2>/dev/null)
[ "$(grep -c '"ppl_hard"' "$work/scratch_focus/metrics.jsonl")" -eq 3 ] && [ "$(grep -c '"ppl"' "$work/scratch_dense/metrics.jsonl")" -eq 3 ] && echo "$out" | grep -q "pairs kept" && ok "pretrain dense and focus, evaluated at steps 0, 2 and 3; model.gguf + router.h5 load" || { bad "pretrain: $out"; cat "$work/scratch_focus/metrics.jsonl"; }
err=$("$focus" pretrain --config configs/tiny.conf --set model="$work/full/base.gguf" --out "$work/scratch_bad" 2>&1 >/dev/null); rc=$?
[ $rc -ne 0 ] && echo "$err" | grep -q "model = scratch" && [ "$(echo "$err" | wc -l)" -eq 1 ] && ok "pretrain refuses a pretrained model" || bad "pretrain non-scratch: rc=$rc $err"
# a model with sliding-window layers (Gemma 3, when fetched): fit-blocks fits the global layers
# only (5, 11, 17), the others keep their own window; per-layer budgets over those three
gm=cache/models/gemma-3-270m-q4_k_m.gguf
if [ -f "$gm" ]; then
    "$focus" fit-blocks --model "$gm" --data ../shared/data/tinyshakespeare/input.txt --ctx 64 --windows 2 --queries 16 --iters 20 --set w=8 --set block=8 --set blocks=2 --budget layers --out "$work/gsel.h5" > "$work/gfit.log" 2>&1
    [ "$(grep -c "own sliding window .*not fitted" "$work/gfit.log")" -eq 15 ] && [ "$(grep -c "^  layer  *\(5\|11\|17\): [0-9.]* -> " "$work/gfit.log")" -eq 3 ] && grep -q "^per-layer budgets (2 blocks on average, at least 1, at most 8): [0-9] [0-9] [0-9]$" "$work/gfit.log" && [ -s "$work/gsel.h5" ] && ok "fit-blocks on Gemma 3: the 3 global layers fitted, 15 keep their window" || { bad "fit-blocks on Gemma 3"; tail -8 "$work/gfit.log"; }
    # the token router on Gemma: one retrofit step; its pairs count the 15 sliding-window layers
    # at their own window (at ctx 256 they keep every pair), the 3 global ones routed (w = 16)
    "$focus" retrofit --config configs/gemma3_pg19.conf --set train=../shared/data/tinyshakespeare/input.txt --set val=../shared/data/tinyshakespeare/input.txt --set T=64 --set w=16 --set steps=1 --set eval_every=1 --set eval_tokens=128 --set warmup=0 --out "$work/gemma_rt" > "$work/gemma_rt.log" 2>&1
    out=$("$focus" eval ppl --model "$gm" --router "$work/gemma_rt/router.h5" --attn hard --data ../shared/data/tinyshakespeare/input.txt --ctx 256 --max-tokens 512 2>/dev/null)
    kept=$(echo "$out" | sed -n 's/pairs kept \([0-9.]*\).*/\1/p')
    [ -n "$kept" ] && awk -v k="$kept" 'BEGIN { exit !(k > 15 / 18 && k < 1) }' && ok "retrofit on Gemma 3; hard k=1 keeps $kept of the pairs (local layers whole at ctx 256)" || { bad "Gemma router pairs: $out"; tail -3 "$work/gemma_rt.log"; }
else
    echo "  skip fit-blocks and the router on Gemma 3 ($gm absent: bash scripts/fetch_model.sh gemma3-270m)"
fi
echo "cli_retrofit: $pass passed, $fail failed"
[ $fail -eq 0 ]
