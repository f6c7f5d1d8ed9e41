#!/usr/bin/env bash
# The corpus-replay test: write the seeds, then run every replay_TARGET over its seeds and its
# saved regressions (fuzz/regressions/TARGET). The tokenizer target needs ../shared/data.
#   bash fuzz/replay.sh BUILD_DIR SOURCE_DIR TARGET...
set -euo pipefail
build=$1; src=$2; shift 2
seeds=$(mktemp -d)
trap 'rm -rf "$seeds"' EXIT
"$build/fuzz_seeds" "$seeds"
for t in "$@"; do
    if [ "$t" = tokenizer ] && [ ! -d "$src/../shared/data/gpt2-tokenizer" ]; then
        echo "replay_tokenizer: skipped (no ../shared/data)"; continue
    fi
    "$build/replay_$t" "$seeds/$t" "$src/fuzz/regressions/$t"
done
