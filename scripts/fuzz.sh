#!/usr/bin/env bash
# Fuzz the readers (fuzz/): build the libFuzzer targets with clang (build-fuzz/), write the seeds,
# and run each target for SECONDS (default 3600; CI runs 20) on a corpus kept in cache/fuzz/TARGET
# (it grows from run to run). Findings land in cache/fuzz/findings/TARGET and stop that target;
# copy one into fuzz/regressions/TARGET once fixed, and the replay test keeps it fixed. Prints
# executions and findings per target and writes them to cache/fuzz/summary.tsv.
# tokenizer_smollm2 is fuzz_tokenizer on SmolLM2's vocabulary (the fetched model; skipped
# without it), whose 21 bytes without a token come back as U+FFFD.
#   bash scripts/fuzz.sh [TARGET...]    (default: all)
#   SECONDS_PER_TARGET=20 JOBS=1 bash scripts/fuzz.sh gguf
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${SECONDS_PER_TARGET:-3600}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(gguf llmc safetensors shard router config tokenizer tokenizer_smollm2)
smol=$PWD/cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
command -v clang >/dev/null || { echo "fuzz: clang is needed (bash scripts/install_deps.sh)"; exit 1; }
CC=clang cmake -S . -B build-fuzz -DFOCUS_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j2 --target fuzz_seeds $(printf 'fuzz_%s ' "${targets[@]%_smollm2}" | tr ' ' '\n' | sort -u) >/dev/null
seeds=$(mktemp -d)
trap 'rm -rf "$seeds"' EXIT
build-fuzz/fuzz_seeds "$seeds"
mkdir -p cache/fuzz
printf 'target\tseconds\texecutions\tfindings\n' > cache/fuzz/summary.tsv
status=0
for t in "${targets[@]}"; do
    bin=$t; vocab=
    if [ "$t" = tokenizer_smollm2 ]; then
        bin=tokenizer; vocab=$smol
        [ -f "$smol" ] || { echo "fuzz: $t skipped (no $smol; run scripts/fetch_model.sh)"; continue; }
    fi
    corpus=cache/fuzz/$t; findings=cache/fuzz/findings/$t
    mkdir -p "$corpus" "$findings"
    log=cache/fuzz/$t.log
    # leaks count as findings; one input may take 10 s at most and 2 GB
    if OMP_NUM_THREADS=1 FOCUS_TOKENIZER=${vocab:-${FOCUS_TOKENIZER:-}} build-fuzz/fuzz_$bin "$corpus" "$seeds/$bin" -max_total_time="$secs" \
        -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$findings/" \
        > "$log" 2>&1; then :; else status=1; fi
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    found=$(find "$findings" -type f | wc -l)
    printf '%s\t%s\t%s\t%s\n' "$t" "$secs" "${execs:-0}" "$found" | tee -a cache/fuzz/summary.tsv
    [ "$found" -eq 0 ] || { status=1; tail -40 "$log"; }
done
exit $status
