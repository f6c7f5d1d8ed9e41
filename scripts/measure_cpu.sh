#!/usr/bin/env bash
# The CPU measurements reported in docs/RESULTS.md, run one after another (nothing else should
# run meanwhile: timings on shared machines are noisy). Logs go to runs/measure/.
# Needs: a Release build in build/, scripts/fetch_model.sh done, ../shared/data, and the run
# runs/smollm2_pg19 (focus retrofit --config configs/smollm2_pg19.conf --out runs/smollm2_pg19).
set -uo pipefail
cd "$(dirname "$0")/.."
out=runs/measure
mkdir -p "$out"
F=build/focus
M=cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
R=runs/smollm2_pg19/router.h5
D=../shared/data
log() { echo "== $(date -u +%FT%TZ) $*" | tee -a "$out/all.log"; }
run() { local name=$1; shift; log "$*"; { /usr/bin/time -f "wall %e s, peak RSS %M KiB" "$@"; } > "$out/$name.log" 2>&1; tail -n 30 "$out/$name.log" >> "$out/all.log"; }
run gemm $F bench gemm
run forward_b1 $F bench forward --preset smollm2-135m --B 1 --T 1024 --iters 2
run eval_table bash scripts/eval_table.sh $M $R $D/pg19-sample/test 1024 16384
run groups $F groups --model $M --router $R --data $D/pg19-sample/test --tokens 16384 --out runs/smollm2_pg19/groups
run attn_k8 $F bench attention --T 4096,16384,65536,262144 --K 8 --topk 1 --heads 1 --kv-heads 1 --dhead 64 --iters 1
run attn_k4 $F bench attention --T 4096,16384,65536 --K 4 --topk 1 --heads 1 --kv-heads 1 --dhead 64 --iters 1
run attn_k4k2 $F bench attention --T 4096,16384,65536 --K 4 --topk 2 --heads 1 --kv-heads 1 --dhead 64 --iters 1
run long_dense $F eval ppl --model $M --data $D/pg19-sample/test --ctx 8192 --max-tokens 8193
run long_hard $F eval ppl --model $M --data $D/pg19-sample/test --ctx 8192 --max-tokens 8193 --router $R --attn hard --topk 1
run generate $F generate --model $M --prompt "Once upon a time, in a small village," -n 64
run generate_router $F generate --model $M --router $R --topk 1 --prompt "Once upon a time, in a small village," -n 64
run tiny $F retrofit --config configs/tiny.conf --out runs/tiny
log done
