#!/usr/bin/env bash
# Nothing lost, nothing silent, nothing hangs (issue 25): the reproducers of the probe, each a
# case. A run folder that holds a run is never overwritten (a finished retrofit, a LoRA run);
# --resume refuses a config.conf that disagrees with the checkpoint (naming the key), a folder
# of another command, and --config/--out; a deleted config.conf is restored; prepare leaves no
# stale shard; writes that fail (a full disk, a size limit) exit 1 with one line and leave no
# half file; a FIFO as any input is refused at once; a binary file is not read as text; a prompt
# or --ctx beyond the context is refused; a NaN or infinite weight stops generate and bench
# decode naming the file and layer; --task for a task not run is refused; tokenize reads
# standard input. Needs ../shared/data (skips with 77); the SmolLM2 cases need the fetched model.
set -u
focus=$(realpath "$1"); src=$(realpath "$2")
[ -d "$src/../shared/data/tinyshakespeare" ] || { echo "cli_safety: skipped (no ../shared/data)"; exit 77; }
cd "$src"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tok=../shared/data/gpt2-tokenizer
shk=../shared/data/tinyshakespeare/input.txt
fail=0; pass=0
ok() { pass=$((pass + 1)); echo "  ok   $1"; }
bad() { fail=$((fail + 1)); echo "  FAIL $1"; }
# refused WHAT WANT CMD...: exit non-zero, one line on stderr that says WANT, within 20 s
refused() {
    local what=$1 want=$2 err rc; shift 2
    err=$(timeout 20 "$@" 2>&1 >/dev/null); rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(printf '%s\n' "$err" | grep -c .)" -eq 1 ] &&
       printf '%s' "$err" | grep -q -- "$want"; then
        ok "$what: $err"
    else
        bad "$what (exit $rc): $err"
    fi
}
small=(--set pretrain_steps=4 --set pretrain_B=2 --set steps=2 --set B=2 --set T=32 --set eval_every=2
       --set eval_tokens=64 --set ckpt_every=1 --set warmup=1)
run=$work/run
"$focus" retrofit --config configs/tiny.conf "${small[@]}" --out "$run" > "$work/run.log" 2>&1 ||
    { cat "$work/run.log"; exit 1; }
base=$run/base.gguf

# --- runs are never overwritten
cp "$run/router.h5" "$work/router.keep"; cp "$run/metrics.jsonl" "$work/metrics.keep"
refused "--out on a finished run" "already holds a retrofit run" \
    "$focus" retrofit --config configs/tiny.conf "${small[@]}" --out "$run"
cmp -s "$run/router.h5" "$work/router.keep" && cmp -s "$run/metrics.jsonl" "$work/metrics.keep" &&
    ok "the finished run's files are untouched" || bad "the finished run was changed"
refused "--resume with --out" "does not go with it" "$focus" retrofit --resume "$run" --out "$work/x"
refused "--resume with --config" "does not go with it" \
    "$focus" retrofit --resume "$run" --config configs/tiny.conf
cp "$run/config.conf" "$work/conf.keep"
sed -i 's/^K = 4$/K = 8/' "$run/config.conf"
refused "--resume with an edited config.conf" "K = 8, but the run was trained with K = 4" \
    "$focus" retrofit --resume "$run"
cp "$work/conf.keep" "$run/config.conf"
printf 'garbage\n' > "$run/config.conf"
refused "--resume with a garbage config.conf" "config.conf: line 1" "$focus" retrofit --resume "$run"
: > "$run/config.conf"
refused "--resume with an empty config.conf" "but the run was trained with" "$focus" retrofit --resume "$run"
rm "$run/config.conf"
out=$("$focus" retrofit --resume "$run" --set steps=3 2>&1)
grep -q "restored from the checkpoint" <<< "$out" && grep -q "^steps = 3$" "$run/config.conf" &&
    grep -q "^# focus retrofit run" "$run/config.conf" &&
    ok "a deleted config.conf is restored, with the --set change" || bad "config.conf restore: $out"
"$focus" finetune --config configs/tiny.conf --set model="$base" --set method=lora --set steps=1 \
    --set B=2 --set T=32 --set eval_every=1 --set eval_tokens=64 --out "$work/lora" > /dev/null 2>&1
cp "$work/lora/metrics.jsonl" "$work/lora.keep"
refused "--resume on a LoRA run" "holds a finetune run" "$focus" retrofit --resume "$work/lora"
refused "finetune --out on a LoRA run" "already holds a finetune run" \
    "$focus" finetune --config configs/tiny.conf --set model="$base" --set method=lora --out "$work/lora"
cmp -s "$work/lora/metrics.jsonl" "$work/lora.keep" && [ ! -e "$work/lora/router.h5" ] &&
    ok "the LoRA run is untouched" || bad "the LoRA run was changed"
refused "--resume on no run" "holds no run to resume" "$focus" retrofit --resume "$work"

# --- prepare: no stale shard from an earlier prepare
"$focus" prepare --tokenizer $tok --out "$work/shards" --val-fraction 0.1 $shk > /dev/null
"$focus" prepare --tokenizer $tok --out "$work/shards" $shk > "$work/prep.log"
[ ! -e "$work/shards/val_000.bin" ] && grep -q "removed .*val_000.bin" "$work/prep.log" &&
    ok "prepare again: the earlier val_000.bin removed" || bad "stale shard: $(ls "$work/shards")"

# --- writes that fail
printf 'hello world\n' > "$work/h.txt"
err=$("$focus" tokenize --tokenizer $tok "$work/h.txt" 2>&1 > /dev/full); rc=$?
[ $rc -eq 1 ] && [ "$err" = "focus: standard output: write failed: No space left on device" ] &&
    ok "tokenize > /dev/full: exit 1 ($err)" || bad "tokenize > /dev/full: exit $rc: $err"
err=$( (ulimit -f 1; exec "$focus" tokenize --tokenizer $tok $shk > "$work/big.txt") 2>&1 ); rc=$?
[ $rc -eq 1 ] && grep -q "File too large" <<< "$err" && ok "a file-size limit: exit 1, one line ($err)" ||
    bad "size limit: exit $rc: $err"
err=$( (ulimit -f 1; exec "$focus" groups --model "$base" --tokenizer $tok --router "$run/router.h5" \
    --data $shk --tokens 256 --ctx 64 --out "$work/groups") 2>&1 ); rc=$?
[ $rc -eq 1 ] && grep -q "write failed" <<< "$err" && ! grep -q "^wrote" <<< "$err" &&
    [ -z "$(ls "$work/groups" 2>/dev/null)" ] &&
    ok "groups under a size limit: exit 1, no half-written file" || bad "groups size limit: exit $rc: $err; $(ls "$work/groups")"
"$focus" retrofit --config configs/tiny.conf "${small[@]}" --set steps=3 --out "$work/cut" --stop-after 1 > /dev/null 2>&1
err=$( (ulimit -f 2; exec "$focus" retrofit --resume "$work/cut" --set eval_every=1 > /dev/null) 2>&1 ); rc=$?
[ $rc -eq 1 ] && grep -q "write failed" <<< "$err" && ok "retrofit under a size limit: exit 1 ($err)" ||
    bad "retrofit size limit: exit $rc: $err"
echo "99999999" > "$work/ids"
refused "tokenize --decode an id outside the vocabulary" "outside the vocabulary" \
    "$focus" tokenize --tokenizer $tok --decode "$work/ids"
a=$(printf 'hello world' | "$focus" tokenize --tokenizer $tok -); b=$("$focus" tokenize --tokenizer $tok "$work/h.txt")
[ -n "$a" ] && [ "$a 198" = "$b" ] && ok "tokenize - reads standard input" || bad "tokenize -: '$a' vs '$b'"

# --- inputs that are not regular files
mkfifo "$work/fifo"
refused "FIFO as --model" "FIFO" "$focus" eval ppl --model "$work/fifo" --data $shk
refused "FIFO as --data" "FIFO" "$focus" eval ppl --model "$base" --tokenizer $tok --data "$work/fifo"
refused "FIFO as --router" "FIFO" "$focus" eval ppl --model "$base" --tokenizer $tok --data $shk --router "$work/fifo"
refused "FIFO as --tokenizer" "FIFO" "$focus" tokenize --tokenizer "$work/fifo" "$work/h.txt"
refused "FIFO to tokenize" "FIFO" "$focus" tokenize --tokenizer $tok "$work/fifo"
refused "FIFO to prepare" "FIFO" "$focus" prepare --tokenizer $tok --out "$work/p2" "$work/fifo"
refused "FIFO as train=" "FIFO" "$focus" retrofit --config configs/tiny.conf --set train="$work/fifo" --out "$work/f1"
refused "FIFO as a task file" "FIFO" "$focus" eval tasks --model "$base" --tokenizer $tok --task arc_easy="$work/fifo"
printf 'FOCUSTOX' > "$work/bad.bin"; head -c 400 /dev/urandom | tr -d '\n' >> "$work/bad.bin"; printf '\0' >> "$work/bad.bin"
refused "a shard with a wrong magic" "not text" "$focus" eval ppl --model "$base" --tokenizer $tok --data "$work/bad.bin"
refused "--task for a task not run" "not among the tasks run" \
    "$focus" eval tasks --model "$base" --tokenizer $tok --tasks piqa --task arc_easy=/nonexistent
refused "--task with a missing file" "nonexistent" \
    "$focus" eval tasks --model "$base" --tokenizer $tok --task arc_easy=/nonexistent

# --- the context: prompts and --ctx beyond it refused; generation stops at it
long=$(head -c 3000 $shk)
refused "a prompt beyond the context" "the prompt is .* more than the model's context of 256" \
    "$focus" generate --model "$base" --tokenizer $tok --prompt "$long" -n 4
refused "eval ppl --ctx beyond the context" "more than the model's context" \
    "$focus" eval ppl --model "$base" --tokenizer $tok --data $shk --ctx 100000
refused "eval curve --ctx beyond the context" "model's context" \
    "$focus" eval curve --model "$base" --tokenizer $tok --data $shk --ctx 64,512
refused "bench decode beyond the context" "more than the model's context" \
    "$focus" bench decode --model "$base" --ctx 250 -n 64
err=$(timeout 20 "$focus" generate --model "$base" --tokenizer $tok --prompt "${long:0:700}" -n 100 2>&1 >/dev/null); rc=$?
[ $rc -eq 0 ] && grep -q "stopped at the model's context of 256" <<< "$err" &&
    grep -q "+ 48 generated" <<< "$err" && ok "generate stops at the context" || bad "generate at the context: $rc $err"

# --- non-finite weights: one line naming the file and the layer, never tokens made of them
python3 tests/gguf_poison.py "$base" "$work/nan_norm.gguf" blk.1.attn_norm.weight nan
refused "generate, NaN norm weight" "nan_norm.gguf: non-finite activations .* after layer 1 of 2" \
    "$focus" generate --model "$work/nan_norm.gguf" --tokenizer $tok --prompt "ROMEO:" -n 4
refused "bench decode --data, NaN norm weight" "nan_norm.gguf: non-finite" \
    "$focus" bench decode --model "$work/nan_norm.gguf" --tokenizer $tok --data $shk --ctx 16 -n 4
python3 tests/gguf_poison.py "$base" "$work/heads0.gguf" llama.attention.head_count 0
refused "a GGUF with head_count = 0" "head_count' = 0; a model needs at least 1" \
    "$focus" eval ppl --model "$work/heads0.gguf" --tokenizer $tok --data $shk
smol=cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f $smol ]; then
    python3 tests/gguf_poison.py $smol "$work/q41_inf.gguf" blk.3.ffn_down.weight inf
    refused "generate, infinite Q4_1 scale" "q41_inf.gguf: non-finite activations .* after layer 3 of 30" \
        "$focus" generate --model "$work/q41_inf.gguf" --prompt "hello" -n 4
    python3 tests/gguf_poison.py $smol "$work/q41_emb.gguf" token_embd.weight nan
    refused "generate, NaN embedding row" "q41_emb.gguf: non-finite activations" \
        "$focus" generate --model "$work/q41_emb.gguf" --prompt "hello" -n 4
    rm -f "$work"/q41_*.gguf
else
    echo "  skip SmolLM2 cases (run scripts/fetch_model.sh)"
fi
# --- settings a loaded model decides, validation that would be empty, messages that name the
# problem
refused "--set L=3 on a loaded model (retrofit)" "L = 3, but the model .* has L = 2" \
    "$focus" retrofit --config configs/tiny.conf --set model="$base" --set L=3 --out "$work/L3"
refused "--set arch=gpt2 on a loaded model (eval)" "arch is the model's own setting" \
    "$focus" eval ppl --model "$base" --tokenizer $tok --data $shk --set arch=gpt2
: > "$work/empty.txt"
refused "val = an empty file" "0 validation tokens" \
    "$focus" retrofit --config configs/tiny.conf --set val="$work/empty.txt" --out "$work/v1"
refused "val_fraction = 0 without val" "val_fraction = 0 and no val" \
    "$focus" retrofit --config configs/tiny.conf --set val_fraction=0 --out "$work/v2"
ev=(eval ppl --model "$base" --tokenizer $tok --data $shk --max-tokens 100 --ctx 32)
refused "a router file given as --lora" "a router checkpoint, not a LoRA adapter file" \
    "$focus" "${ev[@]}" --lora "$run/router.h5"
refused "a LoRA file given as --router" "a LoRA adapter file, not a router checkpoint" \
    "$focus" "${ev[@]}" --router "$work/lora/lora.h5"
out=$("$focus" "${ev[@]}" --lora "$work/lora/lora.h5" 2>/dev/null)
grep -q "^model .* + LoRA .*lora.h5 (rank 8)" <<< "$out" && ok "eval names the LoRA adapter" || bad "LoRA not named: $out"
refused "an option missing its value" "option --tokenizer needs a value" \
    "$focus" eval ppl --model "$base" --tokenizer --data $shk
refused "bench attention --K 0" "--K '0': expected positive integers" "$focus" bench attention --K 0
refused "bench forward --config PRESET" "--preset tiny-llama" "$focus" bench forward --config tiny-llama
"$focus" retrofit --config configs/tiny.conf "${small[@]}" --set tau=0.0001 --set lr=0.001 --set steps=1 \
    --out "$work/tau" > /dev/null 2>&1
grep -q "^tau = 0.0001$" "$work/tau/config.conf" && grep -q "^lr = 0.001$" "$work/tau/config.conf" &&
    grep -q "^rope_theta = 10000$" "$work/tau/config.conf" &&
    ok "tau = 0.0001 (the printed bound) accepted; floats written as given" ||
    bad "float settings: $(grep -E '^(tau|lr|rope_theta) ' "$work/tau/config.conf" | tr '\n' ' ')"
"$focus" groups --model "$base" --tokenizer $tok --router "$run/router.h5" --data $shk --tokens 256 \
    --ctx 64 > /dev/null 2>&1
[ -s "$run/groups/groups.txt" ] && [ -s "$run/groups/groups.svg" ] &&
    ok "groups without --out writes into the run's folder" || bad "groups default folder: $(ls "$run")"
echo "cli_safety: $pass passed, $fail failed"
[ $fail -eq 0 ]
