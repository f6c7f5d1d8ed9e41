"""Shared by the plot scripts: matplotlib without a display, and the `SRC [OUT]` arguments.
If the python3 that runs them lacks matplotlib: python3 -m pip install matplotlib"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402,F401


def paths(doc):
    """(source, output png) from the command line; the png defaults to the source's name."""
    if len(sys.argv) < 2:
        sys.exit(doc)
    src = sys.argv[1]
    return src, sys.argv[2] if len(sys.argv) > 2 else src.rsplit(".", 1)[0] + ".png"


def finish(fig, ax, out, xlabel, ylabel):
    """Label the axes, add the legend and a light grid, write the picture to out."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.savefig(out, dpi=120, bbox_inches="tight")
    print(out)
