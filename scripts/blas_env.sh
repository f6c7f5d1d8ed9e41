# Sourced by the scripts that run long jobs (demo, comparisons): Debian's OpenBLAS 0.3.21 does not
# recognise some newer x86 CPUs (seen on a Xeon with AVX-512 and AMX, 2026-12-01) and falls back
# to its Prescott (SSE3) kernels, about 5x slower products (sgemm 512: 12.9 against 70.7 GFLOP/s
# with SkylakeX kernels on one core). When that happens, name the kernels the CPU can run:
# SkylakeX where it has AVX-512, Haswell where it has AVX2. A core type set by the caller stays.
#   source scripts/blas_env.sh [FOCUS]
# (the output is read whole: under pipefail a grep -q that stops early would fail the pipe)
if [ -z "${OPENBLAS_CORETYPE:-}" ] &&
    [[ "$(OPENBLAS_VERBOSE=2 "${1:-build/focus}" bench gemm --n 64 2>&1)" == *"Core: Prescott"* ]]; then
    if grep -qw avx512f /proc/cpuinfo; then
        export OPENBLAS_CORETYPE=SkylakeX
    elif grep -qw avx2 /proc/cpuinfo; then
        export OPENBLAS_CORETYPE=Haswell
    fi
    [ -n "${OPENBLAS_CORETYPE:-}" ] &&
        echo "note: OpenBLAS took this CPU for a Prescott; using its $OPENBLAS_CORETYPE kernels" >&2
fi
