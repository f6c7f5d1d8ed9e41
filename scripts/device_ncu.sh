#!/usr/bin/env bash
# device_ncu.sh: Nsight Compute figures (duration, throughput, occupancy, warp stall reasons) of
# the router-training kernels, on a GPU machine prepared as for device_check.sh (carry
# .devcarry). KERNELS lists kernel names, |-separated (each profiled once, at its third launch);
# the report goes to $OUT/ncu.txt.
#
#   bash scripts/device_ncu.sh
#   KERNELS='routing_backward' bash scripts/device_ncu.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/device_out}
KERNELS=${KERNELS:-routing_forward|routing_backward|attn_mma_fwd|attn_mma_bwd_dq|attn_mma_bwd_dkv}
mkdir -p "$OUT"
PKG=/tmp/focuspkg
rm -rf "$PKG" && mkdir -p "$PKG" && tar -C "$PKG" -xJf .devcarry/pkg.tar.xz
export LD_LIBRARY_PATH=$PKG/pkg/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
: > "$OUT/ncu.txt"
for k in ${KERNELS//|/ }; do
    timeout 60 "$NCU" -k "regex:$k" --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
        "$PKG/pkg/bin/focus" bench forward --preset smollm2-135m --device cuda --B 8 --T 1024 \
        --iters 1 >> "$OUT/ncu.txt" 2>&1
done
echo "ncu exit $?"
grep -E "^  [a-zA-Z_]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Occupancy|Registers Per|Stall|Warp Cycles Per Issued|Block Limit|Grid Size|Dynamic Shared|ERR|==PROF==|==ERROR==" \
    "$OUT/ncu.txt" | head -150
