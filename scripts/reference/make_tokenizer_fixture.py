#!/usr/bin/env python3
"""Write tests/fixtures/tokenizer_ref.txt: for each staged text and each vocabulary, the token
count and a 64-bit FNV-1a hash of the reference ids (Hugging Face `tokenizers`, see
tokenize_ref.py). tests/test_tokenizer.c tokenizes the same files and compares.

    python3 scripts/reference/make_tokenizer_fixture.py ../shared/data cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(__file__))
from tokenize_ref import from_gguf, from_gpt2_dir  # noqa: E402

FILES = [
    "pg19-sample/test/pg11.txt", "pg19-sample/test/pg174.txt", "pg19-sample/test/pg408.txt",
    "pg19-sample/test/pg940.txt", "pg19-sample/test/pg1237.txt", "pg19-sample/test/pg28054.txt",
    "wikitext-2/raw/wiki.test.raw", "tinyshakespeare/input.txt",
    "evals/lambada/lambada_test.shared.jsonl", "evals/hellaswag/hellaswag_val_full.part1.txt",
]


def fnv(ids):
    h = 0xCBF29CE484222325
    for b in struct.pack(f"<{len(ids)}I", *ids):
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def main():
    data, gguf = sys.argv[1], sys.argv[2]
    toks = {"gpt2": from_gpt2_dir(f"{data}/gpt2-tokenizer"), "smollm2": from_gguf(gguf)}
    out = ["# vocabulary file tokens fnv1a64(ids as u32 LE), from Hugging Face tokenizers"]
    for f in FILES:
        text = open(f"{data}/{f}", "rb").read().decode("utf-8")
        for name, tok in toks.items():
            ids = tok.encode(text, add_special_tokens=False).ids
            out.append(f"{name} {f} {len(ids)} {fnv(ids):016x}")
    os.makedirs("tests/fixtures", exist_ok=True)
    open("tests/fixtures/tokenizer_ref.txt", "w").write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
