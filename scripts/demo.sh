#!/usr/bin/env bash
# The demo: install what is needed, build, fetch SmolLM2-135M and a public-domain text, and
# retrofit the Focus router for a few minutes on the CPU, printing perplexity before and after.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh --demo
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
model=$(bash scripts/fetch_model.sh)
text=$(bash scripts/fetch_text.sh)
echo "model: $model"
echo "text:  $text (King James Bible, public domain)"
run=runs/demo
rm -rf "$run"
./build/focus retrofit --config configs/demo.conf --out "$run"
./build/focus groups --model "$model" --router "$run/router.h5" --data "$text/val.txt" --ctx 512 --tokens 4096 --out "$run/groups" >/dev/null
python3 scripts/plot_run.py "$run" >/dev/null
echo
echo "run files: $run/ (router.h5, metrics.jsonl, config.conf, groups/groups.txt, groups/groups.svg, run.png)"
echo "evaluate: ./build/focus eval ppl --model $model --data $text/val.txt --ctx 512 --router $run/router.h5 --attn hard --topk 1,2"
