#!/usr/bin/env bash
# cli_methods.sh FOCUS SOURCE_DIR: the README's table of attention methods is what
# `focus settings --methods` prints from the method table (model/methods.c), and every method
# of the table is in `focus settings` and in eval's --help.
set -euo pipefail
focus=$1 src=$2
want=$("$focus" settings --methods)
have=$(sed -n '/^<!-- focus settings --methods -->$/,/^<!-- end -->$/p' "$src/README.md" | sed '1d;$d')
if [ "$want" != "$have" ]; then
    echo "README.md's table of attention methods differs from focus settings --methods:" >&2
    diff <(echo "$have") <(echo "$want") >&2 || true
    exit 1
fi
settings=$("$focus" settings)
help=$("$focus" eval passkey --help)
n=0
while read -r name; do
    n=$((n + 1))
    grep -q "^  $name " <<< "$settings" || { echo "focus settings does not list $name" >&2; exit 1; }
    grep -q "^  $name " <<< "$help" || { echo "eval passkey --help does not list $name" >&2; exit 1; }
done < <(sed -n 's/^| `\([^`]*\)` |.*/\1/p' <<< "$want")
[ "$n" -ge 9 ] || { echo "only $n methods in the table" >&2; exit 1; }
echo "cli_methods: the README, focus settings and --help list the same $n methods"
