#!/usr/bin/env bash
# device_pack.sh: prepares what scripts/device_check.sh needs on a GPU machine that has nvcc,
# CMake, PyTorch and the CUDA libraries but no package registry (our Debian libraries are not
# there). Run it on the development machine after `bash scripts/install_deps.sh`:
#
#   bash scripts/device_pack.sh            # -> .devcarry/ (about 40 MiB) and .devcarry2/
#
# .devcarry/ holds a Release build of `focus` and `test_cuda` (sm_90), the shared libraries they
# load that a CUDA image lacks (OpenBLAS, HDF5 and its dependencies, PCRE2, cJSON, inih, libgomp;
# not glibc, libstdc++ or the CUDA libraries, which the device has), the GPT-2 tokenizer and
# tinyshakespeare for a from-scratch retrofit, and the first part of the SmolLM2 GGUF. .devcarry2/
# holds the same build, a slice of the PG-19 sample and the rest of the GGUF: a device call carries
# at most 64 MiB, so the real model travels in two calls made back to back while the machine is
# still held (device_check.sh stashes the first part, joins the two and checks the sha256).
# Both folders are git-ignored.
#
#   bash scripts/device_pack.sh quality    # the quality experiment (scripts/quality_experiment.sh)
#
# packs differently: .devcarry/ holds the build and the first 48 MiB of the GGUF (device_check.sh
# quality1 runs the GPU tests and stashes both on the machine), .devcarry2/ the rest of the GGUF
# and the token shards of PG-19 (train and test) and WikiText-2 (quality2 runs the experiment with
# the stashed build; the two calls must follow each other while the machine is held).
set -euo pipefail
QUALITY=0
[ "${1:-}" = quality ] && QUALITY=1 && PART1_MB=48
cd "$(dirname "$0")/.."
DATA=${FOCUS_DATA:-../shared/data}
MODEL=cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
PART1_MB=${PART1_MB:-46}

cmake -S . -B build-device -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
cmake --build build-device -j2 --target focus test_cuda >/dev/null

rm -rf .devcarry .devcarry2 && mkdir -p .devcarry/pkg/bin .devcarry/pkg/lib .devcarry2
cp build-device/focus build-device/test_cuda .devcarry/pkg/bin/
# the library closure, minus what every CUDA image has
ldd build-device/focus build-device/test_cuda | awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux-x86-64|libcudart|libcublas|libcublasLt)\.so' |
    while read -r lib; do cp -L "$lib" .devcarry/pkg/lib/; done
tar -C .devcarry -cJf .devcarry/pkg.tar.xz pkg && rm -rf .devcarry/pkg
if [ $QUALITY = 1 ]; then
    FOCUS=build-device/focus
    M=$MODEL
    for d in pg19train:train pg19test:test; do
        dir=cache/shards/${d%%:*}
        [ -d "$dir" ] || $FOCUS prepare --tokenizer "$M" --out "$dir" --val-fraction 0 "$DATA"/pg19-sample/${d##*:}/*.txt >/dev/null
    done
    [ -d cache/shards/wikitext2 ] || $FOCUS prepare --raw --tokenizer "$M" --out cache/shards/wikitext2 \
        --val-fraction 0 "$DATA"/wikitext-2/raw/wiki.test.raw >/dev/null
    tar -C cache -cJf .devcarry2/shards.tar.xz shards/pg19train shards/pg19test shards/wikitext2
    head -c $((PART1_MB * 1048576)) "$MODEL" > .devcarry/model.part1
    tail -c +$((PART1_MB * 1048576 + 1)) "$MODEL" > .devcarry2/model.part2
    du -sh .devcarry .devcarry2
    exit 0
fi
cp .devcarry/pkg.tar.xz .devcarry2/  # the second call must not depend on the first's files

if [ -d "$DATA" ]; then
    mkdir -p .devcarry/data/gpt2-tokenizer .devcarry2/data/pg19 .devcarry2/data/pg19-test
    cp "$DATA"/gpt2-tokenizer/encoder.json "$DATA"/gpt2-tokenizer/vocab.bpe .devcarry/data/gpt2-tokenizer/
    cp "$DATA"/tinyshakespeare/input.txt .devcarry/data/tinyshakespeare.txt
    # a slice of the PG-19 sample for the SmolLM2 run: two training books (~0.9 MB), one test book
    cp "$DATA"/pg19-sample/train/pg11030.txt "$DATA"/pg19-sample/train/pg120.txt .devcarry2/data/pg19/
    cp "$DATA"/pg19-sample/test/pg11.txt .devcarry2/data/pg19-test/
fi
if [ -f "$MODEL" ]; then
    head -c $((PART1_MB * 1048576)) "$MODEL" > .devcarry/model.part1
    tail -c +$((PART1_MB * 1048576 + 1)) "$MODEL" > .devcarry2/model.part2
fi
du -sh .devcarry .devcarry2
