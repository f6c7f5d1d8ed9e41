#!/usr/bin/env python3
"""The comparison at equal budget (scripts/compare_budget.sh OUT): perplexity against pairs kept,
one panel per (data set, context), one curve per method, dense as a line; retrieval accuracy
against pairs kept (the pairs a mode keeps on PG-19 at the long context); and OUT/summary.md,
every row with its change against dense and its speed against dense from the same run.
    python3 scripts/plot_budget.py OUT
"""
import csv
import glob
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(__file__))
from plotting import plt  # noqa: E402

SETS = [("pg19_long", "PG-19 test"), ("pg19_short", "PG-19 test"), ("wiki_short", "WikiText-2 test")]
LABELS = {"window": "sinks + window", "random": "random groups", "blocks": "Quest blocks",
          "blocks_mean": "mean-key blocks", "oracle": "oracle blocks", "hard": "Focus router",
          "blocks_learned": "learned block selector",
          "centroids+blocks_learned": "centroids + learned selector"}


def method(mode):
    """window:1050 -> window; blocks:8@w=256 -> blocks@w=256 (a curve of its own); the router's
    budgets (hard:1, hard:p0.5:2, hard:1@w=256: groups, mass coverage, window) are one curve"""
    base = mode.split("@")[0].split(":")[0]
    if base == "hard":
        return base
    budget = mode.split("@")[0].split(":")[1:]
    if base != "hard" and budget and budget[0].startswith("p"):
        base += "~top-p"  # blocks:p0.9:40, a mass-adaptive budget: a curve of its own
    return base + ("@" + mode.split("@", 1)[1] if "@" in mode else "")


def read(path):
    """a table's rows; in OUT/*_centroids.tsv (the selector with the centroids' groups, the same
    mode names as the selector's) each mode is named centroids+MODE"""
    with open(path) as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    if path.endswith("_centroids.tsv"):
        for r in rows:
            r["mode"] = "centroids+" + r["mode"]
    return rows


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    curves, summary = {}, []
    for name, title in SETS:
        rows = []
        for p in sorted(glob.glob(os.path.join(out, name + "_*.tsv"))):
            rows += read(p)
        if not rows:
            continue
        curves[name] = rows
        dense = [r for r in rows if r["mode"] == "dense"]
        d_ppl = float(dense[0]["perplexity"]) if dense else None
        d_tps = float(dense[0]["tokens_per_s"]) if dense else None
        ctx = rows[0]["ctx"]
        summary.append(f"\n### {title}, ctx {ctx}\n")
        summary.append("| mode | pairs kept | perplexity | vs dense | tokens/s | speed vs dense |")
        summary.append("|---|---|---|---|---|---|")
        for r in sorted(rows, key=lambda r: float(r["pairs_kept"])):
            ppl, tps = float(r["perplexity"]), float(r["tokens_per_s"])
            rel = f"{100 * (ppl / d_ppl - 1):+.1f} %" if d_ppl else ""
            spd = f"{tps / d_tps:.2f}x" if d_tps else ""
            summary.append(f"| {r['mode']} | {float(r['pairs_kept']):.3f} | {ppl:.3f} | {rel} | {tps:.1f} | {spd} |")
    if not curves:
        sys.exit(f"{out}: no curve tables (*_patterns.tsv)")
    fig, axes = plt.subplots(1, len(curves), figsize=(5.5 * len(curves), 4.2), squeeze=False)
    for ax, (name, rows) in zip(axes[0], curves.items()):
        title = dict(SETS)[name]
        by = defaultdict(list)
        for r in rows:
            by[method(r["mode"])].append((float(r["pairs_kept"]), float(r["perplexity"])))
        for m, pts in by.items():
            pts.sort()
            if m == "dense":
                ax.axhline(pts[0][1], color="k", ls="--", label="dense")
                continue
            base, _, extra = m.partition("@")
            base, _, topp = base.partition("~")
            label = LABELS.get(base, base) + (", top-p" if topp else "") + (f" ({extra})" if extra else "")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
        ax.set_title(f"{title}, ctx {rows[0]['ctx']}")
        ax.set_xlabel("share of causal pairs kept")
        ax.set_ylabel("perplexity")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.savefig(os.path.join(out, "perplexity_vs_pairs.png"), dpi=120, bbox_inches="tight")
    print(os.path.join(out, "perplexity_vs_pairs.png"))
    # retrieval: accuracy of each mode against the pairs it keeps at the long context
    kept = {r["mode"]: float(r["pairs_kept"]) for r in curves.get("pg19_long", [])}
    tasks = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for p in sorted((glob.glob(os.path.join(out, "*_patterns.tsv")) + glob.glob(os.path.join(out, "*_router.tsv"))
                    + glob.glob(os.path.join(out, "*_selector.tsv"))
                    + glob.glob(os.path.join(out, "*_centroids.tsv")))):
        rows = read(p)
        if not rows or "retrieved" not in rows[0]:
            continue
        for r in rows:
            c = tasks[r["task"]][r["mode"]]
            c[0] += int(r["retrieved"])
            c[1] += 1
    if tasks:
        summary.append("\n### Retrieval (lengths and depths together)\n")
        summary.append("| task | mode | pairs kept (PG-19, long context) | retrieved |")
        summary.append("|---|---|---|---|")
        fig, ax = plt.subplots(figsize=(6, 4))
        for task, modes in tasks.items():
            pts = []
            for mode, (ok, n) in modes.items():
                summary.append(f"| {task} | {mode} | {kept.get(mode, float('nan')):.3f} | {ok}/{n} |")
                if mode == "dense":
                    ax.axhline(ok / n, ls="--", color="k", alpha=0.5)
                elif mode in kept:
                    pts.append((kept[mode], ok / n, mode))
            for x, y, mode in pts:
                ax.annotate(mode, (x, y), fontsize=7)
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", label=task)
        ax.set_xlabel("share of causal pairs kept (PG-19, long context)")
        ax.set_ylabel("retrieved (share of trials)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.savefig(os.path.join(out, "retrieval_vs_pairs.png"), dpi=120, bbox_inches="tight")
        print(os.path.join(out, "retrieval_vs_pairs.png"))
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(summary) + "\n")
    print(os.path.join(out, "summary.md"))


if __name__ == "__main__":
    main()
