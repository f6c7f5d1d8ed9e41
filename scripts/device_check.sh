#!/usr/bin/env bash
# device_check.sh: every GPU check of the CUDA path in one run, for a machine with a GPU, nvcc,
# PyTorch and no package registry. Prepare the carried files on the development machine first
# (bash scripts/device_pack.sh); results go to $OUT (default ./device_out), summary.json first.
#
#   bash scripts/device_check.sh           # compile check, GPU tests, attention benchmark against
#                                          # PyTorch SDPA, router-training throughput, a short
#                                          # from-scratch retrofit; SmolLM2 too if it is whole
#   bash scripts/device_check.sh profile   # GPU tests and the phase profile of a training step
#   bash scripts/device_check.sh smollm2   # join the SmolLM2 parts (second device call), then a
#                                          # short SmolLM2 retrofit and its training throughput
#   bash scripts/device_check.sh quality1  # (device_pack.sh quality) compile check and GPU tests;
#                                          # stashes the build and the first part of the GGUF
#   bash scripts/device_check.sh quality2  # second call: join the GGUF, run the quality
#                                          # experiment (scripts/quality_experiment.sh) on the GPU
#
# Environment: LENGTHS= (empty) skips the attention benchmark; FP32_TOO=1 runs the SmolLM2 retrofit
# a second time with training on the fp32 attention kernels (FOCUS_ATTN_MMA=0).
#
# Each step has its own time limit, so one failure cannot eat the rest of the run.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device_out}
mkdir -p "$OUT"
MODE=${1:-all}
PKG=/tmp/focuspkg
STASH=/root/focus_stash
MODEL=cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_SHA=$(sed -n "s/^sha=//p" scripts/fetch_model.sh)
LENGTHS=${LENGTHS-16384,65536,262144,1048576}
HEADS=${HEADS:-4}
log() { echo "== $* ($(date -u +%H:%M:%S))"; }

# ---- environment and the carried build ----
log "environment"
{
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    nvcc --version | tail -2
    python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"
    nproc
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
CARRIED=.devcarry
[ "$MODE" = smollm2 ] && CARRIED=.devcarry2
if [ "$MODE" = quality2 ]; then
    CARRIED=$STASH  # the build stashed by quality1
fi
if [ ! -f $CARRIED/pkg.tar.xz ]; then
    echo "device_check: $CARRIED/pkg.tar.xz is missing; run scripts/device_pack.sh and carry $CARRIED"
    exit 1
fi
rm -rf "$PKG" && mkdir -p "$PKG" && tar -C "$PKG" -xJf $CARRIED/pkg.tar.xz
LIBS=$PKG/pkg/lib
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && LIBS=$LIBS:$d
done
PYNV=$(python3 -c "import nvidia, os; print(os.path.dirname(nvidia.__path__[0]) + '/nvidia')" 2>/dev/null)
for d in "$PYNV"/cublas/lib "$PYNV"/cuda_runtime/lib "$PYNV"/cu13/lib; do
    [ -d "$d" ] && LIBS=$LIBS:$d
done
export LD_LIBRARY_PATH=$LIBS:${LD_LIBRARY_PATH:-}
FOCUS=$PKG/pkg/bin/focus
ldd "$FOCUS" | grep -i "not found" && echo "device_check: a library is missing (above)"

if [ "$MODE" = smollm2 ] || [ "$MODE" = quality2 ]; then
    log "joining the SmolLM2 parts"
    mkdir -p cache/models
    cat "$STASH/model.part1" .devcarry2/model.part2 > "$MODEL" 2>/dev/null
fi
if [ -f "$MODEL" ] && ! echo "$MODEL_SHA  $MODEL" | sha256sum -c --quiet 2>/dev/null; then
    echo "device_check: $MODEL does not match its sha256; SmolLM2 steps skipped"
    rm -f "$MODEL"
fi

# run_smollm2 [fp32]: the retrofit (training attention on tensor cores, or fp32 when asked)
run_smollm2() {
    local tag=smollm2 envset=""
    [ "${1:-}" = fp32 ] && tag=smollm2_fp32 && envset="FOCUS_ATTN_MMA=0"
    log "SmolLM2 retrofit on the GPU, $tag (PG-19 slice; its tokens/s is the real-weights throughput)"
    rm -rf /tmp/run_smollm2
    env $envset timeout 420 "$FOCUS" retrofit --config configs/smollm2_pg19.conf --device cuda \
        --set train=.devcarry2/data/pg19 --set val=.devcarry2/data/pg19-test \
        --set B=8 --set steps=100 --set warmup=10 --set eval_every=50 --set eval_tokens=16384 \
        --set ckpt_every=50 --out /tmp/run_smollm2 > "$OUT/retrofit_$tag.txt" 2>&1
    echo "exit $?" >> "$OUT/retrofit_$tag.txt"
    grep -E "device:|before|after|step +(1|50|100)/|took|focus:" "$OUT/retrofit_$tag.txt"
    cp /tmp/run_smollm2/metrics.jsonl "$OUT/retrofit_${tag}_metrics.jsonl" 2>/dev/null
}

# ---- GPU tests: every kernel and a training step against the CPU ----
run_tests() {
    log "GPU tests"
    timeout 120 "$PKG/pkg/bin/test_cuda" > "$OUT/test_cuda.txt" 2>&1
    echo "exit $?" >> "$OUT/test_cuda.txt"
    cat "$OUT/test_cuda.txt"
    if ! grep -q " 0 failed" "$OUT/test_cuda.txt" && command -v compute-sanitizer >/dev/null; then
        log "tensor-core checks under compute-sanitizer (a check failed above)"
        timeout 120 compute-sanitizer --tool memcheck --print-limit 8 "$PKG/pkg/bin/test_cuda" mma \
            > "$OUT/sanitizer.txt" 2>&1
        tail -40 "$OUT/sanitizer.txt"
    fi
}

# ---- where a training step's time goes (FOCUS_PROFILE=1: CUDA events between phases) ----
run_profile() {
    log "phase profile of router training, B = 8"
    FOCUS_PROFILE=1 timeout 100 "$FOCUS" bench forward --preset smollm2-135m \
        --device cuda --B 8 --T 1024 --iters 3 > "$OUT/profile.txt" 2>&1
    cat "$OUT/profile.txt"
}

if [ "$MODE" = all ]; then
    # ---- the CUDA sources with this machine's nvcc ----
    log "nvcc compile check (sm_90, warnings are errors)"
    for f in $(cd kernels/cuda && ls *.cu | sed "s/\.cu$//"); do
        nvcc -arch=sm_90 -std=c++17 -O3 -lineinfo -Werror all-warnings \
            -Xcompiler -Wall,-Wextra,-Werror,-Wno-unused-parameter -Xptxas -v \
            -c kernels/cuda/$f.cu -o /tmp/$f.o > "/tmp/nvcc_$f.log" 2>&1 &
    done
    wait
    ok=1
    for f in $(cd kernels/cuda && ls *.cu | sed "s/\.cu$//"); do [ -f /tmp/$f.o ] || ok=0; done
    cat /tmp/nvcc_*.log | grep -E "error|spill" | grep -v " 0 bytes spill" | head -20
    echo "nvcc compile check: $([ $ok = 1 ] && echo passed || echo FAILED)" | tee "$OUT/nvcc.txt"

    run_tests

    # ---- attention: ours (dense, Focus K=8 and K=4, k=1) and PyTorch SDPA ----
    [ -n "$LENGTHS" ] && log "attention benchmark"
    [ -n "$LENGTHS" ] && timeout 200 "$FOCUS" bench attention --device cuda --T "$LENGTHS" --K 8,4 --topk 1 \
        --heads "$HEADS" --kv-heads "$HEADS" --dhead 64 --w 128 --iters 3 \
        --json "$OUT/attention.json" 2>&1 | tee "$OUT/attention.txt"
    [ -n "$LENGTHS" ] && log "PyTorch SDPA baseline"
    [ -n "$LENGTHS" ] && PYTHONUNBUFFERED=1 timeout 150 python3 scripts/bench_sdpa.py --T "$LENGTHS" --heads "$HEADS" \
        --dhead 64 --json "$OUT/sdpa.json" 2>&1 | tee "$OUT/sdpa.txt"

    # ---- router training throughput at T = 1024 (SmolLM2 shape) ----
    log "router training throughput, smollm2-135m shape, random weights"
    for B in 8 16; do
        timeout 100 "$FOCUS" bench forward --preset smollm2-135m --device cuda --B $B --T 1024 \
            --iters 3 --json "$OUT/train_B$B.json" 2>&1 | tail -4
    done
    log "the same with training attention on the fp32 kernels (FOCUS_ATTN_MMA=0)"
    for B in 8; do
        FOCUS_ATTN_MMA=0 timeout 100 "$FOCUS" bench forward --preset smollm2-135m --device cuda \
            --B $B --T 1024 --iters 3 --json "$OUT/train_fp32_B$B.json" 2>&1 | tail -4
    done
    run_profile

    # ---- a short retrofit of a model trained from scratch here (no download needed) ----
    log "from-scratch retrofit (configs/tiny.conf; backbone on the CPU, router on the GPU)"
    rm -rf /tmp/run_tiny
    timeout 150 "$FOCUS" retrofit --config configs/tiny.conf --device cuda \
        --set tokenizer=.devcarry/data/gpt2-tokenizer --set train=.devcarry/data/tinyshakespeare.txt \
        --out /tmp/run_tiny > "$OUT/retrofit_tiny.txt" 2>&1
    echo "exit $?" >> "$OUT/retrofit_tiny.txt"
    grep -E "device:|before|after|took|focus:" "$OUT/retrofit_tiny.txt"
    cp /tmp/run_tiny/metrics.jsonl "$OUT/retrofit_tiny_metrics.jsonl" 2>/dev/null

    if [ -f .devcarry/model.part1 ]; then mkdir -p "$STASH" && cp .devcarry/model.part1 "$STASH/"; fi
    [ -f "$MODEL" ] && [ -d .devcarry2/data ] && run_smollm2
elif [ "$MODE" = quality1 ]; then
    log "nvcc compile check (sm_90, warnings are errors)"
    ok=1
    for f in $(cd kernels/cuda && ls *.cu | sed "s/\.cu$//"); do
        nvcc -arch=sm_90 -std=c++17 -O3 -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror,-Wno-unused-parameter \
            -c kernels/cuda/$f.cu -o /tmp/$f.o > "/tmp/nvcc_$f.log" 2>&1 &
    done
    wait
    for f in $(cd kernels/cuda && ls *.cu | sed "s/\.cu$//"); do [ -f /tmp/$f.o ] || ok=0; done
    cat /tmp/nvcc_*.log | grep -E "error" | head -20
    echo "nvcc compile check: $([ $ok = 1 ] && echo passed || echo FAILED)" | tee "$OUT/nvcc.txt"
    mkdir -p "$STASH" && cp .devcarry/model.part1 .devcarry/pkg.tar.xz "$STASH/"
    run_tests
elif [ "$MODE" = quality2 ]; then
    if [ ! -f "$MODEL" ]; then
        echo "device_check: no SmolLM2 model (was quality1 run on this machine?)"
    else
        log "quality experiment on the GPU"
        mkdir -p cache && tar -C cache -xJf .devcarry2/shards.tar.xz
        FOCUS=$FOCUS FOCUS_DATA=/nonexistent timeout "${QUALITY_LIMIT:-480}" \
            bash scripts/quality_experiment.sh /tmp/quality cuda > "$OUT/quality.txt" 2>&1
        echo "exit $?" >> "$OUT/quality.txt"
        tail -60 "$OUT/quality.txt"
        cp /tmp/quality/results.tsv "$OUT/" 2>/dev/null
        cp /tmp/quality/layers.txt "$OUT/" 2>/dev/null
        (cd /tmp/quality && tar czf "$OUT/quality_logs.tar.gz" train_*.log run_*/metrics.jsonl run_*/config.conf 2>/dev/null)
    fi
elif [ "$MODE" = profile ]; then
    run_tests
    run_profile
elif [ "$MODE" = smollm2 ]; then
    if [ ! -f "$MODEL" ]; then
        echo "device_check: no SmolLM2 model"
    elif [ "${FP32_TOO:-0}" = 1 ]; then
        run_smollm2 && run_smollm2 fp32
    else
        run_smollm2
    fi
fi

# ---- summary ----
log "summary"
python3 - "$OUT" "$MODE" <<'EOF'
import glob, json, os, re, sys
out, mode = sys.argv[1], sys.argv[2]
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except Exception:
        return None
s = {"mode": mode}
try:
    s["environment"] = open(os.path.join(out, "env.txt")).read().strip().splitlines()
except Exception:
    pass
t = os.path.join(out, "test_cuda.txt")
if os.path.exists(t):
    txt = open(t).read()
    m = re.search(r"test_cuda: (\d+) passed, (\d+) failed", txt)
    s["gpu_tests"] = ({"passed": int(m.group(1)), "failed": int(m.group(2))} if m else
                      "skipped: no GPU" if "skipped" in txt else "did not finish")
    s["gpu_test_failures"] = [l for l in txt.splitlines() if l.startswith("FAIL")][:40]
att, sdpa = load("attention.json"), load("sdpa.json")
if att:
    by_t = {r["T"]: r for r in (sdpa or [])}
    rows = []
    for r in att:
        x = dict(r)
        b = by_t.get(r["T"])
        if b:
            x["sdpa_ms"] = round(b["sdpa_ms"], 4)
            x["focus_speedup_vs_sdpa"] = round(b["sdpa_ms"] / r["focus_ms"], 3)
            x["dense_speed_vs_sdpa"] = round(b["sdpa_ms"] / r["dense_ms"], 3)
        x["focus_speedup_vs_dense"] = round(r["dense_ms"] / r["focus_ms"], 3)
        rows.append(x)
    s["attention"] = rows
for f in sorted(glob.glob(os.path.join(out, "train_B*.json")) + glob.glob(os.path.join(out, "train_fp32_B*.json"))):
    s.setdefault("throughput", []).append(dict(load(os.path.basename(f)), file=os.path.basename(f)))
for run in ("tiny", "smollm2", "smollm2_fp32"):
    p = os.path.join(out, f"retrofit_{run}_metrics.jsonl")
    if os.path.exists(p):
        recs = [json.loads(l) for l in open(p) if l.strip()]
        ev = [r for r in recs if r.get("type") == "eval"]
        tr = [r for r in recs if r.get("type") == "train"]
        s[f"retrofit_{run}"] = {"evals": ev, "steps": len(tr),
                                "median_tokens_per_s": sorted(r["tokens_per_s"] for r in tr)[len(tr) // 2] if tr else None,
                                "final_loss": tr[-1]["loss"] if tr else None}
name = "summary.json" if mode == "all" else f"summary_{mode}.json"
with open(os.path.join(out, name), "w") as f:
    json.dump(s, f, indent=1)
print(json.dumps(s, indent=1)[:6000])
EOF
# The device tool returns at most 8 files: keep the summary, pack the rest.
[ "$MODE" = quality2 ] && exit 0  # its few files come back as they are
(cd "$OUT" && tar czf "results_$MODE.tar.gz" --exclude='summary*.json' --exclude='results_*.tar.gz' \
    --exclude='*.log' . ; find . -maxdepth 1 -type f ! -name 'summary*.json' ! -name 'results_*.tar.gz' \
    ! -name '*.log' -delete)
