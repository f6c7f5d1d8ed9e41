#!/usr/bin/env python3
"""Reference token ids from Hugging Face `tokenizers` (an independent implementation).

Builds a byte-level BPE tokenizer either from GPT-2's encoder.json + vocab.bpe or from a GGUF
file's tokenizer.ggml.* metadata (read with the `gguf` package), with the pre-tokenizer the
model uses (GPT-2 regex; SmolLM2 also isolates every digit first), and prints the ids of a
file space-separated on one line, like `focus tokenize`.

    pip install tokenizers gguf
    python3 scripts/reference/tokenize_ref.py --gpt2-dir ../shared/data/gpt2-tokenizer FILE
    python3 scripts/reference/tokenize_ref.py --gguf cache/models/SmolLM2-135M-Instruct.Q4_1.gguf FILE
"""
import argparse
import json
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers


def from_gpt2_dir(d):
    vocab = json.load(open(f"{d}/encoder.json", encoding="utf-8"))
    merges = []
    for line in open(f"{d}/vocab.bpe", encoding="utf-8").read().split("\n")[1:]:
        if line:
            a, b = line.split(" ")
            merges.append((a, b))
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def from_gguf(path):
    from gguf import GGUFReader

    r = GGUFReader(path)

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    tokens = strings("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in strings("tokenizer.ggml.merges")]
    pre = bytes(r.fields["tokenizer.ggml.pre"].parts[-1]).decode() if "tokenizer.ggml.pre" in r.fields else "gpt-2"
    vocab = {t: i for i, t in reversed(list(enumerate(tokens)))}
    tok = Tokenizer(models.BPE(vocab, merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("smollm", "starcoder", "refact"):
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    return tok


def main():
    ap = argparse.ArgumentParser()
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--gpt2-dir")
    g.add_argument("--gguf")
    ap.add_argument("file")
    a = ap.parse_args()
    tok = from_gpt2_dir(a.gpt2_dir) if a.gpt2_dir else from_gguf(a.gguf)
    text = open(a.file, "rb").read().decode("utf-8")
    ids = tok.encode(text, add_special_tokens=False).ids
    sys.stdout.write(" ".join(map(str, ids)) + "\n")


if __name__ == "__main__":
    main()
