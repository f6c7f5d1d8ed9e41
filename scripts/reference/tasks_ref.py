#!/usr/bin/env python3
"""Independent check of `focus eval tasks`: builds each item's prompt and continuations again from
the task files (lm-evaluation-harness formats, written here separately from data/tasks.c),
tokenizes them with Hugging Face `tokenizers` (tokenize_ref.py), runs the NumPy forward pass of
ppl_ref.py and sums each continuation's log-probabilities; then compares with the lines focus
wrote with --details (same items, 0-shot, dense model).

    pip install gguf numpy tokenizers
    build/focus eval tasks --model M --tasks arc_easy,piqa --limit 20 --details /tmp/d.jsonl
    python3 scripts/reference/tasks_ref.py --model M --details /tmp/d.jsonl --limit 20
"""
import argparse
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from ppl_ref import Llama  # noqa: E402
from tokenize_ref import from_gguf  # noqa: E402

FILES = {
    "lambada": "lambada/lambada_test.shared.jsonl",
    "arc_easy": "arc/ARC-Easy-Dev.jsonl",
    "arc_challenge": "arc/ARC-Challenge-Dev.jsonl",
    "piqa": "piqa/valid.jsonl",
    "hellaswag": "hellaswag/hellaswag_val_full.part1.txt",
}


def hellaswag_pre(text):  # the harness's preprocess()
    text = text.strip()
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def items(task, data_dir, limit):
    path = os.path.join(data_dir, FILES[task])
    if task == "hellaswag":
        lines = open(path, encoding="utf-8").read().split("\n")
        for i in range(0, min(len(lines) - 5, 6 * limit), 6):
            yield hellaswag_pre(lines[i]), [" " + hellaswag_pre(e) for e in lines[i + 2: i + 6]]
        return
    for n, line in enumerate(open(path, encoding="utf-8")):
        if n == limit:
            return
        d = json.loads(line)
        if task == "lambada":
            ctx, word = d["text"].rsplit(" ", 1)
            yield ctx, [" " + word]
        elif task == "piqa":
            yield "Question: " + d["goal"] + "\nAnswer:", [" " + d["sol1"], " " + d["sol2"]]
        else:
            q = d["question"]
            yield "Question: " + q["stem"] + "\nAnswer:", [" " + c["text"] for c in q["choices"]]


def loglik(model, tok, context, cont):
    ctx = tok.encode(context, add_special_tokens=False).ids
    whole = tok.encode(context + cont, add_special_tokens=False).ids
    first = max(1, min(len(ctx), len(whole) - 1))
    logits = model.logits(np.array(whole[:-1]))
    logits = logits - logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return float(sum(logp[t - 1, whole[t]] for t in range(first, len(whole))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--details", required=True, help="focus eval tasks --details output")
    ap.add_argument("--data-dir", default="../shared/data/evals")
    ap.add_argument("--limit", type=int, default=20)
    a = ap.parse_args()
    tok, model = from_gguf(a.model), Llama(a.model)
    theirs = {}
    for line in open(a.details):
        d = json.loads(line)
        theirs[(d["task"], d["item"])] = d["ll"]
    worst, agree, total = 0.0, 0, 0
    for task in sorted({t for t, _ in theirs}):
        for i, (ctx, conts) in enumerate(items(task, a.data_dir, a.limit)):
            if (task, i) not in theirs:
                continue
            mine = [loglik(model, tok, ctx, c) for c in conts]
            focus = theirs[(task, i)]
            d = max(abs(x - y) for x, y in zip(mine, focus))
            worst = max(worst, d)
            agree += int(np.argmax(mine) == np.argmax(focus))
            total += 1
            print(f"{task} {i}: max |ll difference| {d:.2e}  choice {np.argmax(mine)} / {np.argmax(focus)}")
    print(f"{total} items: the same choice in {agree}; max |log-likelihood difference| {worst:.3e}")
    sys.exit(0 if total and agree == total else 1)


if __name__ == "__main__":
    main()
