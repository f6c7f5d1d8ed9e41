#!/usr/bin/env bash
# scripts/build_llamacpp.sh TARGET [LEVEL]: builds one llama.cpp program (llama-bench,
# llama-server) from the llama.cpp source vendored in the PyPI sdist of llama-cpp-python 0.3.36
# (downloaded into cache/llama.cpp and checked by sha256), CPU only, and prints its path.
# LEVEL: native (GGML_NATIVE, the default) or avx2 | avx_vnni | avx512_vnni (GGML_NATIVE=OFF and
# the matching switches, in build-LEVEL). The build log: cache/llama.cpp/build-TARGET.log.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:?usage: scripts/build_llamacpp.sh llama-bench|llama-server [LEVEL]}
level=${2:-native}
lc=cache/llama.cpp
sdist=llama_cpp_python-0.3.36.tar.gz
sha=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
case $level in
  native) bdir=build; ggml=(-DGGML_NATIVE=ON) ;;
  avx2) bdir=build-avx2; ggml=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON
                               -DGGML_F16C=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF) ;;
  avx_vnni) bdir=build-avx_vnni; ggml=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON
                                       -DGGML_F16C=ON -DGGML_AVX_VNNI=ON -DGGML_AVX512=OFF) ;;
  avx512_vnni) bdir=build-avx512_vnni; ggml=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON
                   -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON) ;;
  *) echo "build_llamacpp: LEVEL=$level: expected native, avx2, avx_vnni or avx512_vnni" >&2; exit 1 ;;
esac
src=$lc/src/vendor/llama.cpp
bin=$src/$bdir/bin/$target
if [ ! -x "$bin" ]; then
  mkdir -p "$lc"
  if [ ! -f "$lc/$sdist" ]; then
    python3 -m pip download --quiet --no-deps --no-binary :all: -d "$lc" llama-cpp-python==0.3.36
  fi
  if ! echo "$sha  $lc/$sdist" | sha256sum -c --status; then
    echo "build_llamacpp: $lc/$sdist: sha256 mismatch (expected $sha)" >&2
    exit 1
  fi
  if [ ! -d "$src" ]; then
    rm -rf "$lc/src" && mkdir -p "$lc/src"
    tar xzf "$lc/$sdist" -C "$lc/src" --strip-components=1
  fi
  server=OFF
  [ "$target" = llama-server ] && server=ON
  log=$lc/build-$target.log
  echo "building $target (log: $log)" >&2
  if ! { cmake -S "$src" -B "$src/$bdir" -DCMAKE_BUILD_TYPE=Release "${ggml[@]}" \
    -DLLAMA_CURL=OFF -DGGML_CUDA=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=$server \
    -DLLAMA_OPENSSL=OFF && cmake --build "$src/$bdir" --target "$target" -j"$(nproc)"; } \
    >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    echo "build_llamacpp: building $target failed (log: $log)" >&2
    exit 1
  fi
fi
echo "$bin"
