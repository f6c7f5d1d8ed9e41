#!/usr/bin/env bash
# scripts/tp_scaling.sh [OUT]: tensor-parallel frozen backbone on the CPU (MPI ranks, --tp):
#  1. SmolLM2 router training (configs/smollm2_quality.conf, B = 4 x T = 1024, STEPS steps, the
#     first not counted) in one process and as tp = 3 (its 9 heads / 3 kv heads split three ways);
#  2. bench forward on the LLaMA-2 7B shape cut to LAYERS layers (random weights, T = 256):
#     tp = 1, 2, 4 (TPS).
# tokens/s and the share of time in all-reduces, one markdown table (OUT/table.md). Threads per
# rank: the cores divided among the ranks (at least 1; more ranks than cores are oversubscribed).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/tp_scaling}
steps=${STEPS:-4}
tps=${TPS:-1 2 4}
layers=${LAYERS:-2}
bash scripts/fetch_model.sh >/dev/null
bash scripts/pg19_shards.sh >/dev/null
[ -x build/focus ] || cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target focus >/dev/null
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cores=$(nproc)
threads() { local t=$((cores / $1)); [ "$t" -lt 1 ] && t=1; echo "$t"; }
for tp in 1 3; do
  rm -rf "$out/smollm2_tp$tp"
  echo "SmolLM2 retrofit, tp = $tp" >&2
  OMP_NUM_THREADS=$(threads $tp) mpirun --oversubscribe --bind-to none -np "$tp" build/focus retrofit \
    --tp "$tp" --config configs/smollm2_quality.conf --set B=4 --set T=1024 --set steps="$steps" \
    --set eval_tokens=2048 --set eval_every=1000000 --set ckpt_every=1000 \
    --set train=cache/shards/pg19train --set val=cache/shards/pg19test \
    --out "$out/smollm2_tp$tp" >"$out/smollm2_tp$tp.log" 2>&1
done
for tp in $tps; do
  echo "bench forward llama2-7b L=$layers, tp = $tp" >&2
  OMP_NUM_THREADS=$(threads "$tp") mpirun --oversubscribe --bind-to none -np "$tp" build/focus bench \
    forward --preset llama2-7b --set L="$layers" --T 256 --iters 2 --tp "$tp" >"$out/llama7b_tp$tp.log" 2>&1
done
python3 - "$out" "$tps" "$cores" "$layers" <<'PY'
import json, re, statistics, sys, datetime
out, tps, cores, layers = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4]
thr = lambda n: max(1, cores // n)
lines = [f"Tensor parallelism on {cores} cores, {datetime.date.today()} (scripts/tp_scaling.sh)", "",
         "SmolLM2-135M router training, B = 4 x T = 1024 (medians over the steps after the first):", "",
         "| tp (ranks x threads) | tokens/s | ms / step | in all-reduces | loss, last step | speed-up |",
         "|---|---|---|---|---|---|"]
base = None
for tp in (1, 3):
    rows = [json.loads(l) for l in open(f"{out}/smollm2_tp{tp}/metrics.jsonl") if '"train"' in l]
    tps_ = statistics.median(r["tokens_per_s"] for r in rows[1:])
    ms = statistics.median(r["ms"] for r in rows[1:])
    comm = statistics.median(r.get("comm_ms", 0) / r["ms"] for r in rows[1:])
    base = base or tps_
    over = " (oversubscribed)" if tp > cores else ""
    lines.append(f"| {tp} ({tp} x {thr(tp)}){over} | {tps_:.1f} | {ms:.0f} | {100 * comm:.1f} % | "
                 f"{rows[-1]['loss']:.6f} | {tps_ / base:.2f} |")
lines += ["", f"LLaMA-2 7B shape, {layers} layers, random weights, B = 1 x T = 256 (bench forward --tp):", "",
          "| tp (ranks x threads) | forward tokens/s | in all-reduces | train step tokens/s | in all-reduces | loss | rank 0 peak RSS |",
          "|---|---|---|---|---|---|---|"]
for tp in tps:
    t = open(f"{out}/llama7b_tp{tp}.log").read()
    f = re.search(r"forward dense\s+([\d.]+) tokens/s.*loss ([\d.]+)(?:\s+\((\d+) % in all-reduces\))?", t)
    s = re.search(r"train step \(router-only fwd\+bwd\)\s+([\d.]+) tokens/s.*?(?:\((\d+) % in all-reduces\))?$", t, re.M)
    rss = re.search(r"peak RSS (\d+) MiB", t)
    over = " (oversubscribed)" if int(tp) > cores else ""
    lines.append(f"| {tp} ({tp} x {thr(int(tp))}){over} | {f.group(1)} | {f.group(3) or 0} % | {s.group(1)} | "
                 f"{s.group(2) or 0} % | {f.group(2)} | {rss.group(1)} MiB |")
open(f"{out}/table.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
