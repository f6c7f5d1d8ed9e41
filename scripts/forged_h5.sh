#!/usr/bin/env bash
# What libhdf5 does with router files crafted to pass focus's seal (checkpoints/h5file.c): the
# fuzz seed router.h5 with 1 to 8 random bytes changed after the user block and the seal
# recomputed, N of them (default 1500, seeded), each read once by build-fuzz/fuzz_router
# (libFuzzer + ASan + UBSan, leak detection). Prints how many are read cleanly or end in a leak,
# an out-of-memory, or another sanitizer error, and the kinds of the last.
#   bash scripts/forged_h5.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-1500}
command -v clang >/dev/null || { echo "forged_h5: clang is needed (bash scripts/install_deps.sh)"; exit 1; }
CC=clang cmake -S . -B build-fuzz -DFOCUS_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j2 --target fuzz_seeds fuzz_router >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
build-fuzz/fuzz_seeds "$work/seeds" >/dev/null
/usr/bin/python3 - "$work" "$n" <<'PY'
import random, struct, sys
work, n = sys.argv[1], int(sys.argv[2])
seed = bytearray(open(work + "/seeds/router/router.h5", "rb").read())
def fnv(p):
    h = 0xcbf29ce484222325
    for x in p:
        h = ((h ^ x) * 0x100000001b3) & 0xffffffffffffffff
    return h
rng = random.Random(1)
for i in range(n):
    c = bytearray(seed)
    for _ in range(rng.randint(1, 8)):
        j = rng.randrange(512, len(c))
        c[j] = rng.randrange(256) if rng.random() < 0.7 else c[j] ^ (1 << rng.randrange(8))
    c[16:24] = struct.pack("<Q", fnv(c[512:]))  # the seal: FNV-1a of everything after the block
    open("%s/f_%05d" % (work, i), "wb").write(c)
PY
clean=0 leak=0 oom=0 other=0
for f in "$work"/f_*; do
    if timeout 20 build-fuzz/fuzz_router -rss_limit_mb=2048 "$f" > "$work/log" 2>&1; then
        clean=$((clean + 1))
    elif grep -q LeakSanitizer "$work/log"; then
        leak=$((leak + 1))
    elif grep -q out-of-memory "$work/log"; then
        oom=$((oom + 1))
    else
        other=$((other + 1))
        grep -m1 -o 'ERROR: [A-Za-z]*: [A-Za-z-]* [a-z]*' "$work/log" >> "$work/errors" ||
            echo "exit without a report" >> "$work/errors"
    fi
done
[ ! -f "$work/errors" ] || sort "$work/errors" | uniq -c
echo "forged files: $n; read cleanly $clean, leak $leak, out-of-memory $oom, other errors $other"
