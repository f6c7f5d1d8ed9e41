#!/usr/bin/env bash
# scripts/vs_llamacpp.sh [OUT]: focus against llama.cpp on the same GGUF file, the same machine,
# in the same run (the measurements interleaved, REPS rounds; medians reported).
#   llama.cpp: llama-bench, built from the llama.cpp source vendored in the PyPI sdist of
#              llama-cpp-python 0.3.36 (into cache/llama.cpp; checked by sha256), CPU only,
#              GGML_NATIVE; tests pp1024, tg64 and tg64 at depth 1024.
#   focus:     `focus bench decode` (native weights, f16 KV cache): the prompt of 1024 tokens,
#              64 tokens decoded after a 1-token prompt, 64 decoded after the 1024-token prompt.
# With DEPTH=1 a depth sweep too (issue 41): llama-bench pp$DEPTH_CTX and tg32 at depth
# $DEPTH_CTX (default 8160: SmolLM2's context is 8192) against focus dense, the window (w = 1024),
# Quest's blocks (8 beyond w = 512), the shipped block selector
# (routers/smollm2-135m-pg19-blocks.h5, its default 8 blocks beyond w = 512), the shipped
# centroid router (routers/smollm2-135m-pg19-8k.h5, k = 1) and the selector with the shipped
# groups beside it (14 blocks beyond w = 128); DEPTH_ROUTERS=0 leaves the routers out (another
# model than SmolLM2), DEPTH_ROUTERS=gemma takes Gemma 3's (MODEL=its file, DEPTH_CTX=32736).
# With BUSY=1 a second table: the same decode runs while a busy loop holds one core, focus
# with its thread governor, with --threads THREADS and with --threads 1, llama.cpp with
# -t THREADS and -t 1.
# LEVEL=avx2 | avx_vnni | avx512_vnni compares at one instruction-set level: llama.cpp built
# with GGML_NATIVE=OFF and the matching GGML_AVX2 / GGML_AVX_VNNI / GGML_AVX512(_VNNI) switches
# (in build-LEVEL), focus forced to it with FOCUS_ISA; default: both at this CPU's best. FOCUS_ISA
# forces focus's int8 kernels only; the rest of focus is compiled for the build's -march. To
# compile all of it for an AVX2 CPU: BUILD=build-haswell MARCH=haswell LEVEL=avx2.
# Environment: MODEL (default: the SmolLM2 Q4_1 file of scripts/fetch_model.sh), THREADS (2),
# REPS (3), BUSY (0), LEVEL (native), BUILD (focus's build folder: build), MARCH (its FOCUS_MARCH
# when BUILD is made here: native). Writes OUT/raw.tsv and OUT/table.md (default OUT: runs/vs_llamacpp).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/vs_llamacpp}
threads=${THREADS:-2}
reps=${REPS:-3}
model=${MODEL:-$(bash scripts/fetch_model.sh)}
mkdir -p "$out"
# OpenBLAS without its own kernels for this CPU would slow the fp32 panels (scripts/blas_env.sh)
source scripts/blas_env.sh

# focus, release build (in BUILD, for MARCH)
bdir=${BUILD:-build}
if [ ! -x "$bdir/focus" ] || [ -n "${MARCH:-}" ]; then
  cmake -S . -B "$bdir" -DCMAKE_BUILD_TYPE=Release -DFOCUS_MARCH="${MARCH:-native}" >/dev/null
fi
cmake --build "$bdir" -j"$(nproc)" --target focus >/dev/null
march=$(sed -n 's/^FOCUS_MARCH:STRING=//p' "$bdir/CMakeCache.txt")

# llama-bench from the PyPI source package
level=${LEVEL:-native}
if [ "$level" = native ]; then unset FOCUS_ISA; else export FOCUS_ISA=$level; fi
# below AVX-512, the BLAS of focus's fp32 panels at that level too
case $level in avx2|avx_vnni) export OPENBLAS_CORETYPE=Haswell ;; esac
bench=$(bash scripts/build_llamacpp.sh llama-bench "$level")

raw=$out/raw.tsv
printf 'round\tload\tsystem\ttest\tthreads\ttokens_per_s\n' >"$raw"

# llama-bench: one test, one repetition; prints tokens/s
lbench() { # threads, then llama-bench test arguments
  local t=$1
  shift
  # a test llama-bench cannot run here (a native build may use AMX tiles the kernel does not
  # grant: "Illegal instruction") is recorded as nan and shown as failed
  { "$bench" -m "$model" -t "$t" -r 1 -o csv "$@" 2>/dev/null || true; } |
    python3 -c 'import csv,sys; rows=list(csv.DictReader(sys.stdin)); print(rows[-1]["avg_ts"] if rows else "nan")'
}
# focus bench decode: prints "prompt_tokens_per_s decode_tokens_per_s"
fbench() { # threads (0: the governor up to THREADS), ctx, more arguments (FB_N: tokens decoded)
  local t=$1 ctx=$2
  shift 2
  local extra=()
  [ "$t" != 0 ] && extra=(--threads "$t")
  OMP_NUM_THREADS=$threads "$bdir/focus" bench decode --model "$model" --ctx "$ctx" -n "${FB_N:-64}" \
    "${extra[@]}" "$@" | python3 -c '
import re, sys
t = sys.stdin.read()
m = re.search(r"prompt \d+ tokens \([^)]*\): ([\d.]+) tokens/s \| decode \d+ tokens at context \d+: ([\d.]+)", t)
if not m: sys.exit("vs_llamacpp: no speeds in focus output:\n" + t)
print(m.group(1), m.group(2))'
}
row() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$raw"; }

for r in $(seq 1 "$reps"); do
  echo "round $r of $reps" >&2
  row "$r" idle llama.cpp pp1024 "$threads" "$(lbench "$threads" -p 1024 -n 0)"
  row "$r" idle llama.cpp tg64 "$threads" "$(lbench "$threads" -p 0 -n 64)"
  row "$r" idle llama.cpp "tg64 at depth 1024" "$threads" "$(lbench "$threads" -p 0 -n 64 -d 1024)"
  read -r p d < <(fbench 0 1024)
  row "$r" idle focus pp1024 "$threads" "$p"
  row "$r" idle focus "tg64 at depth 1024" "$threads" "$d"
  read -r p d < <(fbench 0 1)
  row "$r" idle focus tg64 "$threads" "$d"
done

if [ "${DEPTH:-0}" = 1 ]; then
  dctx=${DEPTH_CTX:-8160}
  for r in $(seq 1 "$reps"); do
    echo "depth round $r of $reps" >&2
    row "$r" depth llama.cpp "pp$dctx" "$threads" "$(lbench "$threads" -p "$dctx" -n 0)"
    row "$r" depth llama.cpp "tg32 at depth $dctx" "$threads" \
      "$(lbench "$threads" -p 0 -n 32 -d "$dctx")"
    read -r p d < <(FB_N=32 fbench 0 "$dctx")
    row "$r" depth "focus dense" "pp$dctx" "$threads" "$p"
    row "$r" depth "focus dense" "tg32 at depth $dctx" "$threads" "$d"
    # the training-free methods at about the selector's pairs (0.23 of a prompt's at 8K)
    read -r p d < <(FB_N=32 fbench 0 "$dctx" --attn window --set w=1024)
    row "$r" depth "focus window w=1024" "pp$dctx" "$threads" "$p"
    row "$r" depth "focus window w=1024" "tg32 at depth $dctx" "$threads" "$d"
    read -r p d < <(FB_N=32 fbench 0 "$dctx" --attn blocks --set w=512 --set blocks=8)
    row "$r" depth "focus Quest 8 blocks" "pp$dctx" "$threads" "$p"
    row "$r" depth "focus Quest 8 blocks" "tg32 at depth $dctx" "$threads" "$d"
    if [ "${DEPTH_ROUTERS:-1}" = 1 ]; then
      read -r p d < <(FB_N=32 fbench 0 "$dctx" --router routers/smollm2-135m-pg19-blocks.h5)
      row "$r" depth "focus selector" "pp$dctx" "$threads" "$p"
      row "$r" depth "focus selector" "tg32 at depth $dctx" "$threads" "$d"
      read -r p d < <(FB_N=32 fbench 0 "$dctx" --router routers/smollm2-135m-pg19-8k.h5 --topk 1)
      row "$r" depth "focus centroids k=1" "pp$dctx" "$threads" "$p"
      row "$r" depth "focus centroids k=1" "tg32 at depth $dctx" "$threads" "$d"
      # the pair of routers/README.md: 14 selector blocks beyond w = 128 and the groups beside
      read -r p d < <(FB_N=32 fbench 0 "$dctx" --set w=128 --set blocks=14 \
        --router routers/smollm2-135m-pg19-blocks.h5,routers/smollm2-135m-pg19-8k-groups.h5)
      row "$r" depth "focus selector + centroids" "pp$dctx" "$threads" "$p"
      row "$r" depth "focus selector + centroids" "tg32 at depth $dctx" "$threads" "$d"
    elif [ "${DEPTH_ROUTERS:-1}" = gemma ]; then
      # Gemma 3 270M: its shipped selector (32 blocks beyond w = 512 on the global layers) and
      # its centroid router trained at 32K (k = 1)
      read -r p d < <(FB_N=32 fbench 0 "$dctx" --router routers/gemma3-270m-pg19-blocks.h5 \
        --set blocks=32)
      row "$r" depth "focus selector" "pp$dctx" "$threads" "$p"
      row "$r" depth "focus selector" "tg32 at depth $dctx" "$threads" "$d"
      read -r p d < <(FB_N=32 fbench 0 "$dctx" --router routers/gemma3-270m-pg19-32k.h5 --topk 1)
      row "$r" depth "focus centroids k=1" "pp$dctx" "$threads" "$p"
      row "$r" depth "focus centroids k=1" "tg32 at depth $dctx" "$threads" "$d"
    fi
  done
fi

if [ "${BUSY:-0}" = 1 ]; then
  # one core held by a busy loop for the length of these runs
  ( while :; do :; done ) &
  busy=$!
  trap 'kill $busy 2>/dev/null || true' EXIT
  for r in $(seq 1 "$reps"); do
    echo "busy round $r of $reps" >&2
    row "$r" busy llama.cpp tg64 "$threads" "$(lbench "$threads" -p 0 -n 64)"
    row "$r" busy llama.cpp tg64 1 "$(lbench 1 -p 0 -n 64)"
    read -r p d < <(fbench 0 1)
    row "$r" busy focus tg64 "governor up to $threads" "$d"
    read -r p d < <(fbench "$threads" 1)
    row "$r" busy focus tg64 "$threads" "$d"
    read -r p d < <(fbench 1 1)
    row "$r" busy focus tg64 1 "$d"
  done
  kill $busy
  trap - EXIT
fi

python3 - "$raw" "$out/table.md" "$model" "$threads" "$reps" "$level" "$march" <<'PY'
import csv, statistics, sys, datetime, platform
raw, dest, model, threads, reps, level, march = sys.argv[1:]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
flags = next((l.split(":", 1)[1].split() for l in open("/proc/cpuinfo") if l.startswith("flags")), [])
isa = ", ".join(f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni") if f in flags)
rows = list(csv.DictReader(open(raw), delimiter="\t"))
med = {}
for r in rows:
    med.setdefault((r["load"], r["test"], r["threads"], r["system"]), []).append(float(r["tokens_per_s"]))
lines = [f"Model {model}, level {level} (both programs; focus compiled with -march={march}), {reps} rounds (medians, tokens/s), {datetime.date.today()}, "
         f"{platform.node()} ({cpu}; {isa}; {len([l for l in open('/proc/cpuinfo') if l.startswith('processor')])} "
         f"cores); written by scripts/vs_llamacpp.sh.", ""]
lines += ["| test | threads | llama.cpp | focus | focus / llama.cpp |", "|---|---|---|---|---|"]
for test in ["pp1024", "tg64", "tg64 at depth 1024"]:
    a = med.get(("idle", test, threads, "llama.cpp")); b = med.get(("idle", test, threads, "focus"))
    if a and b:
        a, b = statistics.median(a), statistics.median(b)
        if a != a:  # nan: llama-bench failed on this test
            lines.append(f"| {test} | {threads} | failed | {b:.1f} | - |")
        else:
            lines.append(f"| {test} | {threads} | {a:.1f} | {b:.1f} | {b / a:.2f} |")
depth = sorted({k[1] for k in med if k[0] == "depth"})
if depth:
    lines += ["", "Depth (llama-bench -p N / -d N; focus bench decode --ctx N -n 32):", "",
              "| test | system | tokens/s | / llama.cpp |", "|---|---|---|---|"]
    for test in depth:
        base = med.get(("depth", test, threads, "llama.cpp"))
        a = statistics.median(base) if base else float("nan")
        for k in sorted(k for k in med if k[0] == "depth" and k[1] == test):
            b = statistics.median(med[k])
            ratio = "-" if k[3] == "llama.cpp" or a != a else f"{b / a:.2f}"
            lines.append(f"| {test} | {k[3]} | {b:.1f} | {ratio} |")
busy = [k for k in med if k[0] == "busy"]
if busy:
    lines += ["", "One core held by a busy loop (tg64):", "",
              "| system | threads | tokens/s |", "|---|---|---|"]
    for k in sorted(busy, key=lambda k: (k[3], k[2])):
        lines.append(f"| {k[3]} | {k[2]} | {statistics.median(med[k]):.1f} |")
open(dest, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
