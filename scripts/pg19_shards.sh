#!/usr/bin/env bash
# Token shards of the PG-19 sample (train, test) and WikiText-2 (test) in a model's tokenizer
# (SmolLM2's by default), for the experiments that train or evaluate on them:
# DEST/{pg19train,pg19test,wikitext2} (DEST: cache/shards). Made once; an existing folder is kept.
#   bash scripts/pg19_shards.sh [FOCUS [MODEL [DEST]]]
#   bash scripts/pg19_shards.sh build/focus cache/models/gemma-3-270m-q4_k_m.gguf cache/shards/gemma3
set -euo pipefail
focus=${1:-build/focus}
model=${2:-cache/models/SmolLM2-135M-Instruct.Q4_1.gguf}
dest=${3:-cache/shards}
[ -f "$model" ] || { echo "pg19_shards: $model missing (bash scripts/fetch_model.sh)"; exit 1; }
[ -d ../shared/data/pg19-sample ] || { echo "pg19_shards: ../shared/data is needed"; exit 1; }
mkdir -p "$dest"
for s in pg19train:../shared/data/pg19-sample/train pg19test:../shared/data/pg19-sample/test \
         wikitext2:../shared/data/wikitext-2; do
    name=${s%%:*}; src=${s#*:}
    [ -d "$dest/$name" ] && continue
    if [ "$name" = wikitext2 ]; then files=("$src"/raw/wiki.test.raw); else files=("$src"/*.txt); fi
    raw=(); [ "$name" = wikitext2 ] && raw=(--raw)
    "$focus" prepare "${raw[@]}" --tokenizer "$model" --out "$dest/$name.tmp" "${files[@]}" > /dev/null
    mv "$dest/$name.tmp" "$dest/$name"
done
