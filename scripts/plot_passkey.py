#!/usr/bin/env python3
"""Heat maps of passkey retrieval (`focus eval passkey --out FILE.tsv`): one panel per mode,
accuracy by context length (rows) and depth of the key (columns).
    python3 scripts/plot_passkey.py passkey.tsv [out.png]
"""
import csv
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(__file__))
from plotting import paths, plt  # noqa: E402


def main():
    src, out = paths(__doc__)
    cells = defaultdict(lambda: [0, 0])  # (mode, length, depth) -> [retrieved, trials]
    modes, lengths, depths = [], set(), set()
    with open(src) as f:
        for r in csv.DictReader(f, delimiter="\t"):
            key = (r["mode"], int(r["length"]), float(r["depth"]))
            cells[key][0] += int(r["retrieved"])
            cells[key][1] += 1
            if r["mode"] not in modes:
                modes.append(r["mode"])
            lengths.add(int(r["length"]))
            depths.add(float(r["depth"]))
    if not modes:
        sys.exit(f"{src}: no rows")
    lengths, depths = sorted(lengths), sorted(depths)
    fig, axes = plt.subplots(1, len(modes), figsize=(3.2 * len(modes) + 1, 3.2), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        grid = [[cells[(mode, L, d)][0] / max(1, cells[(mode, L, d)][1]) for d in depths] for L in lengths]
        im = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="lower")
        ax.set_xticks(range(len(depths)), [f"{d:g}" for d in depths])
        ax.set_yticks(range(len(lengths)), [str(L) for L in lengths])
        ax.set_xlabel("depth of the key")
        ax.set_title(mode)
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                ax.text(j, i, f"{v:.0%}", ha="center", va="center", fontsize=8)
    axes[0][0].set_ylabel("context (tokens)")
    fig.colorbar(im, ax=axes[0].tolist(), label="retrieved")
    fig.savefig(out, dpi=120, bbox_inches="tight")
    print(out)


if __name__ == "__main__":
    main()
