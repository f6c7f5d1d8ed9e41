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
