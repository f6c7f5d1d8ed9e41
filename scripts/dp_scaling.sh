#!/usr/bin/env bash
# scripts/dp_scaling.sh [OUT]: data-parallel router training on the CPU with 1, 2 and 4 MPI ranks
# (RANKS), SmolLM2 and configs/smollm2_quality.conf at B = 4 x T = 1024, STEPS steps (default 4,
# the first not counted): tokens/s and the share of a step spent in collectives, one markdown
# table (OUT/table.md). Threads per rank: the cores divided among the ranks (at least 1).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/dp_scaling}
steps=${STEPS:-4}
ranks=${RANKS:-1 2 4}
bash scripts/fetch_model.sh >/dev/null
bash scripts/pg19_shards.sh >/dev/null
[ -x build/focus ] || cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target focus >/dev/null
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cores=$(nproc)
for n in $ranks; do
  t=$((cores / n)); [ "$t" -lt 1 ] && t=1
  rm -rf "$out/np$n"
  echo "$n rank(s), $t thread(s) each" >&2
  OMP_NUM_THREADS=$t mpirun --oversubscribe --bind-to none -np "$n" build/focus retrofit \
    --config configs/smollm2_quality.conf --set B=4 --set T=1024 --set steps="$steps" \
    --set eval_tokens=2048 --set eval_every=1000000 --set ckpt_every=1000 --set train=cache/shards/pg19train \
    --set val=cache/shards/pg19test --out "$out/np$n" >"$out/np$n.log" 2>&1
done
python3 - "$out" "$ranks" "$cores" <<'PY'
import json, statistics, sys, datetime
out, ranks, cores = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
lines = [f"Data-parallel router training, SmolLM2-135M, B = 4 x T = 1024, {cores} cores, "
         f"{datetime.date.today()} (scripts/dp_scaling.sh; medians over the steps after the first)", "",
         "| ranks x threads | tokens/s | ms / step | in collectives | speed-up |", "|---|---|---|---|---|"]
base = None
for n in ranks:
    rows = [json.loads(l) for l in open(f"{out}/np{n}/metrics.jsonl") if '"train"' in l][1:]
    tps = statistics.median(r["tokens_per_s"] for r in rows)
    ms = statistics.median(r["ms"] for r in rows)
    comm = statistics.median(r.get("comm_ms", 0) / r["ms"] for r in rows)
    base = base or tps
    t = max(1, cores // int(n))
    lines.append(f"| {n} x {t} | {tps:.1f} | {ms:.0f} | {100 * comm:.1f} % | {tps / base:.2f} |")
open(f"{out}/table.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
