#!/usr/bin/env bash
# same_output.sh: does a change leave what users see alone? Runs the same commands with two
# builds of focus (OLD, NEW: paths of the binaries) and compares their output once the timings
# are taken out (tokens/s, seconds, milliseconds, memory). Meant for restructurings (issue 40:
# "nothing a user sees changes"). Needs the models of scripts/fetch_model.sh (SmolLM2, Gemma 3),
# the shipped routers and ../shared/data; takes about 10 minutes on 2 cores.
#   bash scripts/same_output.sh OLD/focus NEW/focus [OUTDIR]
# Exit status 0 when every command's output and every written file agree; the differences are
# printed and left in OUTDIR (default: a temporary folder).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: $0 OLD_FOCUS NEW_FOCUS [OUTDIR]" >&2; exit 2; }
old=$(realpath "$1") new=$(realpath "$2")
out=${3:-$(mktemp -d)}
mkdir -p "$out"
M=cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
G=cache/models/gemma-3-270m-q4_k_m.gguf
D=../shared/data
book=$D/pg19-sample/test/pg11.txt
for f in "$M" "$G" "$book"; do
    [ -e "$f" ] || { echo "same_output.sh: $f is missing (scripts/fetch_model.sh, ../shared/data)" >&2; exit 1; }
done
R=routers/smollm2-135m-pg19.h5
S=routers/smollm2-135m-pg19-blocks.h5
SG=$S,routers/smollm2-135m-pg19-8k-groups.h5
GS=routers/gemma3-270m-pg19-blocks.h5
# name | arguments (the binary is prepended)
cmds=(
    "help|--help"
    "settings|settings"
    "eval-help|eval ppl --help"
    "ppl-dense|eval ppl --model $M --data $book --ctx 512 --max-tokens 2048"
    "ppl-hard1|eval ppl --model $M --data $book --ctx 512 --max-tokens 2048 --router $R --attn hard --topk 1"
    "ppl-hard2|eval ppl --model $M --data $book --ctx 512 --max-tokens 2048 --router $R --attn hard --topk 2"
    "ppl-soft|eval ppl --model $M --data $book --ctx 512 --max-tokens 2048 --router $R --attn soft"
    "ppl-window|eval ppl --model $M --data $book --ctx 512 --max-tokens 2048 --attn window --set w=64 --set sinks=4"
    "ppl-quest|eval ppl --model $M --data $book --ctx 1024 --max-tokens 2048 --attn blocks --set w=128 --set blocks=4"
    "ppl-selector|eval ppl --model $M --data $book --ctx 1024 --max-tokens 2048 --router $S --attn blocks_learned"
    "ppl-pair|eval ppl --model $M --data $book --ctx 1024 --max-tokens 2048 --router $SG --attn blocks_learned --set w=128 --set blocks=4"
    "ppl-topp|eval ppl --model $M --data $book --ctx 1024 --max-tokens 2048 --router $S --attn blocks_learned --set w=128 --set blocks=p0.9:8"
    "ppl-qproj|eval ppl --model $M --data $book --ctx 1024 --max-tokens 2048 --router routers/smollm2-135m-pg19-8k-groups.h5 --attn hard --topk 2"
    "layers|eval layers --model $M --data $book --ctx 256 --max-tokens 1024 --router $R --attn hard --topk 1"
    "gemma-window|eval ppl --model $G --data $book --ctx 1024 --max-tokens 1025 --attn window --set w=256 --set sinks=4"
    "gemma-quest|eval ppl --model $G --data $book --ctx 1024 --max-tokens 1025 --attn blocks --set w=512 --set blocks=4"
    "curve|eval curve --model $M --data $book --ctx 512 --max-tokens 1025 --router $R --modes dense,hard:1,window:64,random:1,blocks:2,oracle:2"
    "passkey|eval passkey --model $M --router $S --modes dense,blocks_learned:4,window:128 --lengths 1024 --depths 0.5 --trials 1"
    "tasks|eval tasks --model $M --tasks lambada,piqa --limit 8"
    "decode-dense|bench decode --model $M --ctx 600 -n 16 --data $book"
    "decode-hard|bench decode --model $M --ctx 600 -n 16 --data $book --router $R"
    "decode-selector|bench decode --model $M --ctx 600 -n 16 --data $book --router $S --attn blocks_learned"
    "gemma-ppl|eval ppl --model $G --data $book --ctx 1024 --max-tokens 1025"
    "gemma-decode|bench decode --model $G --ctx 600 -n 16 --data $book"
    "gemma-selector|bench decode --model $G --ctx 600 -n 16 --data $book --router $GS --attn blocks_learned"
    "generate|generate --model $M --prompt 'The capital of France is' -n 24"
    "generate-sampled|generate --model $M --prompt 'Once upon a time' -n 24 --temperature 0.8 --seed 7"
    "generate-gemma|generate --model $G --prompt 'The capital of France is' -n 16"
    "generate-window|generate --model $M --prompt 'The capital of France is' -n 16 --attn window"
    "generate-router|generate --model $M --prompt 'The capital of France is' -n 16 --router $R"
    "tokenize|tokenize --tokenizer $M $book"
    "plan|plan --preset smollm2-135m --T 2048 --objective mass"
    "groups|groups --model $M --router $R --data $book --ctx 256 --tokens 1024 --out GROUPS"
    "unknown-mode|eval passkey --model $M --modes nonsense --lengths 1024"
    "unknown-attn|eval ppl --model $M --data $book --attn nonsense"
)
strip() {
    sed -E -e 's/[0-9]+(\.[0-9]+)?( *)(tokens\/s|tok\/s|ms|s|min|MiB|GiB|MB|GB|KiB|GFLOP\/s|it\/s)\b/<T>\2\3/g' \
        -e 's/(ETA|elapsed|took|time)[^|,;]*/\1 <T>/g' -e "s#$1#DIR#g"
}
fail=0
for entry in "${cmds[@]}"; do
    name=${entry%%|*} args=${entry#*|}
    for side in old new; do
        bin=$old; [ $side = new ] && bin=$new
        d="$out/$side/$name"; mkdir -p "$d"
        a=${args//GROUPS/$d/groups}
        set +e
        (eval "\"$bin\" $a") > "$d/stdout" 2> "$d/stderr"
        echo $? > "$d/rc"
        set -e
        strip "$d" < "$d/stdout" > "$d/stdout.cmp"
        strip "$d" < "$d/stderr" > "$d/stderr.cmp"
    done
    ok=1
    for f in rc stdout.cmp stderr.cmp; do
        cmp -s "$out/old/$name/$f" "$out/new/$name/$f" || { ok=0; diff "$out/old/$name/$f" "$out/new/$name/$f" | head -20 || true; }
    done
    if [ -d "$out/old/$name/groups" ]; then
        diff -r "$out/old/$name/groups" "$out/new/$name/groups" > /dev/null || { ok=0; echo "groups files differ"; }
    fi
    printf '%-18s %s (rc %s)\n' "$name" "$([ $ok = 1 ] && echo same || echo DIFFERENT)" "$(cat "$out/new/$name/rc")"
    [ $ok = 1 ] || fail=1
done
# a short retrofit with each: the router file, the metrics without their timings and the
# resolved configuration must agree
for side in old new; do
    bin=$old; [ $side = new ] && bin=$new
    d="$out/$side/retrofit"; rm -rf "$d"
    "$bin" retrofit --config configs/tiny.conf --out "$d" > "$out/$side/retrofit.log" 2>&1
    d2="$out/$side/mass"; rm -rf "$d2"
    "$bin" retrofit --config configs/demo.conf --set steps=4 --set mass_windows=2 --set T=512 \
        --set eval_tokens=512 --out "$d2" > "$out/$side/mass.log" 2>&1
done
for run in retrofit mass; do
    ok=1
    for f in router.h5 config.conf; do
        cmp -s "$out/old/$run/$f" "$out/new/$run/$f" || { ok=0; echo "$run/$f differs"; }
    done
    for side in old new; do
        sed -E 's/"(time|elapsed|tok_per_s|tokens_per_s|ms|step_ms|rss_mib|peak_mib)[a-z_]*": *[0-9.e+-]+,? *//g' \
            "$out/$side/$run/metrics.jsonl" > "$out/$side/$run/metrics.cmp"
    done
    cmp -s "$out/old/$run/metrics.cmp" "$out/new/$run/metrics.cmp" || { ok=0; diff "$out/old/$run/metrics.cmp" "$out/new/$run/metrics.cmp" | head; }
    printf '%-18s %s\n' "retrofit:$run" "$([ $ok = 1 ] && echo same || echo DIFFERENT)"
    [ $ok = 1 ] || fail=1
done
echo "outputs: $out"
exit $fail
