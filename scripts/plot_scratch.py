#!/usr/bin/env python3
"""From scratch, dense against Focus (scripts/scratch_compare.sh): validation perplexity at every
evaluation of both runs (their metrics.jsonl) as a picture, and as OUT/scratch.tsv and
OUT/scratch.md together with the final evaluation (OUT/final.tsv).
    python3 scripts/plot_scratch.py OUT [out.png]
"""
import csv
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from plotting import finish, paths, plt  # noqa: E402


def evals(path):
    rows = []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r["type"] == "eval":
                rows.append(r)
    if not rows:
        sys.exit(f"{path}: no evaluations")
    return rows


def main():
    run, out = paths(__doc__)
    dense = {r["step"]: r["ppl"] for r in evals(f"{run}/dense/metrics.jsonl")}
    focus = {r["step"]: r for r in evals(f"{run}/focus/metrics.jsonl")}
    steps = sorted(s for s in dense if s in focus and s > 0)
    cols = ["step", "dense", "focus_dense", "focus_soft", "focus_hard", "pairs_kept"]
    table = [[s, dense[s], focus[s]["ppl_dense"], focus[s]["ppl_soft"], focus[s]["ppl_hard"],
              focus[s]["pairs_kept"]] for s in steps]
    with open(f"{run}/scratch.tsv", "w") as f:
        f.write("\t".join(cols) + "\n")
        for r in table:
            f.write("\t".join(str(r[0]) if i == 0 else f"{v:.4f}" for i, v in enumerate(r)) + "\n")
    topk = focus[steps[-1]]["topk"]
    with open(f"{run}/scratch.md", "w") as f:
        f.write(f"Validation perplexity during training (Focus hard at top-{topk})\n\n")
        f.write("| step | dense | Focus (soft) | Focus (hard) | Focus model, dense attention | pairs kept |\n")
        f.write("|---|---|---|---|---|---|\n")
        for s, d, fd, fs, fh, k in table:
            f.write(f"| {s} | {d:.2f} | {fs:.2f} | {fh:.2f} | {fd:.2f} | {k:.3f} |\n")
        final = f"{run}/final.tsv"
        if os.path.exists(final):
            f.write("\nFinal models on more test tokens\n\n| model | attention | perplexity |\n|---|---|---|\n")
            for r in csv.DictReader(open(final), delimiter="\t"):
                f.write(f"| {r['model']} | {r['attention']} | {r['ppl']} |\n")
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(steps, [dense[s] for s in steps], "k--", label="dense")
    ax.plot(steps, [focus[s]["ppl_soft"] for s in steps], "o-", label="Focus (soft)")
    ax.plot(steps, [focus[s]["ppl_hard"] for s in steps], "s-", label=f"Focus (hard, top-{topk})")
    ax.set_yscale("log")
    finish(fig, ax, out, "training step", "validation perplexity")


if __name__ == "__main__":
    main()
