#!/usr/bin/env bash
# scripts/attn_shares.sh [OUT]: where a sparse method's attention time goes, against dense, at one
# context (issue 41, item 1). Each method runs `FOCUS_PROFILE=1 focus bench decode --ctx CTX -n N`
# on SmolLM2 (random token ids, as llama-bench's); the table gives, for the prompt's rows and
# for the decoded tokens, the pairs kept p, the attention's milliseconds a token (selection
# included), that time over dense attention's, and that ratio over p (the bound is 1.5), with
# the attention's parts (window and sinks, selection, distant keys). ROUNDS > 1 runs every method
# once a round, the rounds one after another (a shared machine's load changes within minutes):
# each ratio is then taken against the same round's dense, and the table gives the median ratio
# with the rounds' least and most.
# Environment: MODEL (default: the SmolLM2 Q4_1 file of scripts/fetch_model.sh), CTX (8160),
# N (32), THREADS (2), ROUNDS (1), BUILD (the build folder: build), DATA (a token shard, e.g.
# cache/shards/pg19test/train_000.bin of scripts/pg19_shards.sh: every method and build then reads
# and decodes the same tokens, the shard's first CTX + N; default: random prompt tokens and
# sampled ones after, which differ between builds), AGAINST (1: each method's decode steps
# interleaved with as many dense ones over its own cache, `bench decode --against dense`, its
# prompt fed in calls of 1024 rows, each into its cache and then into a dense one, and two last
# columns, those ratios over p measured within the run: the method's and dense's prompt calls and
# steps under the same load of the machine; every method's prompt, dense's too, then goes in
# calls of 1024 rows). Writes OUT/table.md and each run's output in OUT/*.txt
# (default OUT: runs/attn_shares).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/attn_shares}
model=${MODEL:-$(bash scripts/fetch_model.sh)}
ctx=${CTX:-8160}
n=${N:-32}
threads=${THREADS:-2}
rounds=${ROUNDS:-1}
mkdir -p "$out"
rm -f "$out"/*.txt
source scripts/blas_env.sh
build=${BUILD:-build}
data=()
if [ -n "${DATA:-}" ]; then
  [ -f "$DATA" ] || { echo "attn_shares: DATA=$DATA: no such token shard" >&2; exit 1; }
  data=(--data "$DATA")
fi
[ -x "$build/focus" ] || cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" --target focus >/dev/null

# name, then the bench decode arguments of the method
methods=(
  "dense|"
  "window w=1024|--attn window --set w=1024"
  "Quest blocks (8 of 64, w=512)|--attn blocks --set w=512 --set blocks=8"
  "shipped selector (8 of 64, w=512)|--router routers/smollm2-135m-pg19-blocks.h5"
  "centroid router k=1 (w=512)|--router routers/smollm2-135m-pg19-8k.h5 --attn hard --topk 1 --set w=512"
  "selector + centroids (14 of 64, w=128)|--router routers/smollm2-135m-pg19-blocks.h5,routers/smollm2-135m-pg19-8k-groups.h5 --set w=128 --set blocks=14"
)
for round in $(seq 1 "$rounds"); do
  for entry in "${methods[@]}"; do
    name=${entry%%|*}
    args=${entry#*|}
    file=$out/$(echo "$name" | tr -c 'a-zA-Z0-9\n' '_').r$round.txt
    echo "round $round: $name" >&2
    steps=(-n "$n")
    if [ "${AGAINST:-0}" = 1 ]; then
      steps=(-n "$n" --chunk 1024)
      [ "$name" != dense ] && steps=(-n $((2 * n)) --against dense --chunk 1024)
    fi
    # shellcheck disable=SC2086
    FOCUS_PROFILE=1 OMP_NUM_THREADS=$threads "$build/focus" bench decode --model "$model" \
      --ctx "$ctx" "${steps[@]}" ${data[@]+"${data[@]}"} $args >"$file"
    printf '%s\n' "$name" >>"$file"
  done
done

python3 - "$out" "$ctx" <<'EOF'
import glob, os, re, statistics, sys
out, ctx = sys.argv[1], sys.argv[2]
runs = {}  # round -> name -> run
for f in glob.glob(os.path.join(out, "*.r*.txt")):
    t = open(f).read()
    name = t.strip().splitlines()[-1]
    rnd = int(re.search(r"\.r(\d+)\.txt$", f).group(1))
    m = re.search(r"prompt \d+ tokens \([^)]*\): ([\d.]+) tokens/s \| decode \d+ tokens at context \d+: ([\d.]+) tokens/s \| pairs kept ([\d.]+) \(the prompt's rows: ([\d.]+)\)", t)
    if not m:
        sys.exit("attn_shares: no speeds in %s" % f)
    r = {"name": name, "tps": (float(m.group(1)), float(m.group(2))), "p": (float(m.group(4)), float(m.group(3))),
         "mtime": os.path.getmtime(f)}
    for k, part in enumerate(("prompt", "decode")):
        pm = re.search(part + r" profile \(FOCUS_PROFILE=1[^)]*\), ([\d.]+) ms a token:(.*)", t)
        ms, rest = float(pm.group(1)), pm.group(2)
        am = re.search(r"attention ([\d.]+) %( \(([^)]*)\))?", rest)
        r[part] = ms * float(am.group(1)) / 100
        r[part + "_split"] = am.group(3) or ""
    im = re.search(r"against dense, steps interleaved .*, ([\d.]+) times that share", t)
    r["within"] = float(im.group(1)) if im else None
    im = re.search(r"against dense, the prompt interleaved .*, ([\d.]+) times that share", t)
    r["pwithin"] = float(im.group(1)) if im else None
    runs.setdefault(rnd, {})[name] = r
if not runs:
    sys.exit("attn_shares: no runs in %s" % out)
first = runs[min(runs)]
names = [r["name"] for r in sorted(first.values(), key=lambda r: r["mtime"])]
if any("dense" not in runs[k] for k in runs):
    sys.exit("attn_shares: a round without dense in %s" % out)
isa = re.search(r"kernels: (\S+)", open(glob.glob(os.path.join(out, "dense.r*.txt"))[0]).read()).group(1)
nr = len(runs)
def cell(vals, fmt):
    med = statistics.median(vals)
    return fmt % med if len(vals) == 1 else (fmt + " (" + fmt + "-" + fmt + ")") % (med, min(vals), max(vals))
within = any(r["within"] is not None for rr in runs.values() for r in rr.values())
pwithin = any(r["pwithin"] is not None for rr in runs.values() for r in rr.values())
lines = ["| method | prompt tokens/s | prompt p | prompt attention, ms a token | / dense | / (p dense) | decode tokens/s | decode p | decode attention, ms a token | / dense | / (p dense) |" + (" prompt / (p dense), interleaved |" if pwithin else "") + (" decode / (p dense), interleaved |" if within else ""),
         "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if pwithin else "") + ("---|" if within else "")]
for name in names:
    ks = [k for k in sorted(runs) if name in runs[k]]
    rs = [runs[k][name] for k in ks]
    cells = [name]
    for i, part in enumerate(("prompt", "decode")):
        rel = [runs[k][name][part] / runs[k]["dense"][part] for k in ks]
        cells += [cell([r["tps"][i] for r in rs], "%.1f"), "%.3f" % statistics.median(r["p"][i] for r in rs),
                  cell([r[part] for r in rs], "%.3f"), cell(rel, "%.3f"),
                  cell([x / r["p"][i] for x, r in zip(rel, rs)], "%.2f")]
    for key, on in (("pwithin", pwithin), ("within", within)):
        w = [r[key] for r in rs if r[key] is not None]
        if on:
            cells.append(cell(w, "%.2f") if w else "-")
    lines.append("| " + " | ".join(cells) + " |")
lines.append("")
lines.append("The attention's parts (shares of the whole prompt or step time, round 1):")
lines.append("")
for name in names:
    r = first[name]
    if r["prompt_split"] or r["decode_split"]:
        lines.append("- %s: prompt %s; decode %s" % (name, r["prompt_split"] or "-", r["decode_split"] or "-"))
head = "context %s, instruction set %s, %d round%s%s\n\n" % (
    ctx, isa, nr, "s" if nr > 1 else "", " (each cell: the median, then the least and most)" if nr > 1 else "")
text = head + "\n".join(lines) + "\n"
open(os.path.join(out, "table.md"), "w").write(text)
print(text)
EOF
