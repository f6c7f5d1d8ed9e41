#!/usr/bin/env python3
"""plot_quality.py: perplexity against the fraction of causal pairs kept, one curve per recipe
(its hard budgets), the dense model as a horizontal line; one panel per (data, ctx).

    python3 scripts/plot_quality.py OUT_DIR     # reads OUT_DIR/results.tsv (quality_experiment.sh)
                                                # writes OUT_DIR/quality.png
    python3 scripts/plot_quality.py FILE.tsv    # the same table in another file -> FILE.png
Needs matplotlib (pip install matplotlib, or Debian's python3-matplotlib with /usr/bin/python3)."""
import csv
import os
import sys


def main():
    arg = sys.argv[1] if len(sys.argv) > 1 else "."
    if os.path.isfile(arg):
        table, path = arg, os.path.splitext(arg)[0] + ".png"
    else:
        table, path = os.path.join(arg, "results.tsv"), os.path.join(arg, "quality.png")
    rows = list(csv.DictReader(open(table), delimiter="\t"))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["data"], int(r["ctx"])) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.5), squeeze=False)
    for ax, (data, ctx) in zip(axes[0], panels):
        here = [r for r in rows if r["data"] == data and int(r["ctx"]) == ctx]
        dense = [float(r["ppl"]) for r in here if r["recipe"] == "dense"]
        curves = {}
        for r in here:
            if r["pairs_kept"] in ("-", ""):
                continue
            curves.setdefault(r["recipe"], []).append((float(r["pairs_kept"]), float(r["ppl"])))
        for name, pts in sorted(curves.items()):
            pts.sort()
            ax.plot([p for p, _ in pts], [q for _, q in pts], "o-", label=name, ms=4)
        if dense:
            ax.axhline(dense[0], color="k", ls="--", lw=1, label="dense %.2f" % dense[0])
            ax.set_ylim(dense[0] * 0.98, dense[0] * 1.6)
        ax.set_xlabel("fraction of causal pairs kept")
        ax.set_ylabel("perplexity")
        ax.set_title("%s, ctx %d" % (data, ctx))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print("wrote", path)


if __name__ == "__main__":
    main()
