#!/usr/bin/env bash
# Bad input through the command line: each case must exit non-zero with a one-line error that
# names the file. $2: the tiny.gguf that test_gguf leaves for it. Works in a temporary folder.
set -u
focus=$(realpath "$1")
gguf=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd) # (before the cd below)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
fail=0; pass=0
check() { # description, expected text, command...
  local what=$1 want=$2; shift 2
  local out rc
  out=$("$@" 2>&1 >/dev/null); rc=$?
  local lines; lines=$(printf '%s\n' "$out" | grep -c .)
  if [ $rc -ne 0 ] && [ "$lines" -eq 1 ] && printf '%s' "$out" | grep -q -- "$want"; then
    pass=$((pass + 1)); echo "  ok   $what: $out"
  else
    fail=$((fail + 1)); echo "  FAIL $what (exit $rc, $lines lines): $out"
  fi
}
[ -f "$gguf" ] || { echo "$gguf missing (run test_gguf first)"; exit 1; }
cp "$gguf" tiny.gguf
printf 'hello world\n' > text.txt
size=$(stat -c %s tiny.gguf)
head -c $((size / 2)) tiny.gguf > truncated.gguf
head -c 10 tiny.gguf > short_header.gguf
{ printf 'GGUX'; tail -c +5 tiny.gguf; } > magic.gguf
# offset of the first tensor pushed beyond the end: rewrite the last 8 bytes of the header entry
python3 - <<'PY' 2>/dev/null || cp truncated.gguf offset.gguf
data = bytearray(open("tiny.gguf", "rb").read())
i = data.find(b"token_embd.weight")
off = i + len("token_embd.weight") + 4 + 16 + 4
data[off:off + 8] = (1 << 40).to_bytes(8, "little")
open("offset.gguf", "wb").write(bytes(data))
PY
check "missing model" "nope.gguf" "$focus" eval ppl --model nope.gguf --data text.txt
check "truncated GGUF" "truncated.gguf" "$focus" eval ppl --model truncated.gguf --data text.txt --tokenizer tiny.gguf
check "10-byte header" "short_header.gguf" "$focus" eval ppl --model short_header.gguf --data text.txt
check "wrong magic" "magic.gguf" "$focus" generate --model magic.gguf --prompt hi
check "offset beyond file" "offset.gguf" "$focus" eval ppl --model offset.gguf --data text.txt
check "no tokenizer in file" "tokenizer" "$focus" tokenize --tokenizer tiny.gguf text.txt
check "missing data" "missing.bin" "$focus" eval ppl --model tiny.gguf --data missing.bin
printf 'FOCUSTOK' > badshard.bin; head -c 40 /dev/zero >> badshard.bin
check "corrupt shard" "badshard.bin" "$focus" eval ppl --model tiny.gguf --data badshard.bin
check "unknown command" "unknown command" "$focus" frobnicate
check "bad device" "cpu or cuda" "$focus" eval ppl --model tiny.gguf --data text.txt --device gpu
check "--attn-error on a GPU" "runs on the CPU\\|no usable CUDA device" "$focus" eval ppl --model tiny.gguf --data text.txt --attn-error --device cuda
# without a GPU (or without CUDA in the build), --device cuda must say so in one line
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi >/dev/null 2>&1; then
  check "no GPU" "device cuda" "$focus" bench forward --preset tiny-llama --B 1 --T 8 --device cuda
fi
# settings and options out of range (issue 15): refused before anything runs, naming the range
conf="$(dirname "$focus")/../configs/tiny.conf"
[ -f "$conf" ] || conf=$(realpath "$(dirname "$0")/../configs/tiny.conf" 2>/dev/null)
for kv in eval_every=0 ckpt_every=0 val_fraction=1.5 val_fraction=nan K=99999999999 lr=inf \
          beta1=-1 beta2=1 clip=nan adam_eps=0 grad_accum=99999999 iters=100000 topk=-5 \
          T=4294967304 rms=1; do
    case $kv in rms=1) want="unknown setting" ;; *) want="expected" ;; esac
    check "--set $kv" "$want" "$focus" retrofit --config "$conf" --set "$kv" --out run
done
# a loaded model decides its shape: the scratch config's [model] keys would be refused first
grep -vE '^(arch|L|C|NH|NKV|F|maxT) =' "$conf" > noshape.conf
check "T above a llama model's context" "exceeds the model's context" "$focus" retrofit --config noshape.conf --set model=tiny.gguf --set T=128 --out run
check "a scratch shape on a loaded model" "a loaded model decides its own shape" "$focus" retrofit --config "$conf" --set model=tiny.gguf --out run
check "--ctx wraps" "from 2 to" "$focus" eval ppl --model tiny.gguf --data text.txt --ctx 4294967304
check "--stride 0" "--stride" "$focus" eval ppl --model tiny.gguf --data text.txt --stride 0
check "--temperature nan" "--temperature" "$focus" generate --model tiny.gguf --temperature nan
check "--temperature abc" "--temperature" "$focus" generate --model tiny.gguf --temperature abc
check "--top-p nan" "--top-p" "$focus" generate --model tiny.gguf --top-p nan
check "prepare --val-fraction nan" "--val-fraction" "$focus" prepare --val-fraction nan --out shards text.txt
check "bench --iters huge" "--iters" "$focus" bench forward --preset tiny-llama --iters 99999999999
mkdir -p adir
check "a folder as a config file" "adir: not a regular file" "$focus" retrofit --config adir --out run
# focus average: routers only, and at least two (a shipped block selector, found beside the script)
sel=$here/../routers/smollm2-135m-pg19-blocks.h5
check "average of a block selector" "smollm2-135m-pg19-blocks.h5 is a block selector" "$focus" average --model tiny.gguf --out avg.h5 "$sel" "$sel"
check "average of one router" "at least two routers (1 given)" "$focus" average --model tiny.gguf --out avg.h5 x.h5
echo "cli_errors: $pass passed, $fail failed"
[ $fail -eq 0 ]
