#!/usr/bin/env python3
"""Perplexity against context length (`focus eval curve --out FILE.tsv`): one line per mode.
    python3 scripts/plot_curve.py curve.tsv [out.png]
"""
import csv
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(__file__))
from plotting import finish, paths, plt  # noqa: E402


def main():
    src, out = paths(__doc__)
    lines = defaultdict(list)
    with open(src) as f:
        for r in csv.DictReader(f, delimiter="\t"):
            lines[r["mode"]].append((int(r["ctx"]), float(r["perplexity"]), float(r["pairs_kept"])))
    if not lines:
        sys.exit(f"{src}: no rows")
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, pts in lines.items():
        pts.sort()
        style = "k--" if mode == "dense" else "o-"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=mode)
    ax.set_xscale("log", base=2)
    finish(fig, ax, out, "context length (tokens)", "perplexity")


if __name__ == "__main__":
    main()
