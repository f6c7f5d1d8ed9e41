#!/usr/bin/env python3
"""Plot a retrofit run from RUN_DIR/metrics.jsonl into RUN_DIR/run.png: training loss,
validation perplexity (dense / soft / hard, causal routing), the largest group's share and the
mean gate on distant pairs.

    python3 scripts/plot_run.py runs/NAME        (needs matplotlib: pip install matplotlib)
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    run = sys.argv[1].rstrip("/")
    rows = [json.loads(line) for line in open(f"{run}/metrics.jsonl") if line.strip()]
    train = [r for r in rows if r["type"] == "train"]
    ev = [r for r in rows if r["type"] == "eval"]
    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    steps = [r["step"] for r in train]
    ax[0].plot(steps, [r["loss"] for r in train], lw=0.8, label="loss")
    k = 10
    if len(train) > k:
        sm = [sum(r["loss"] for r in train[max(0, i - k + 1): i + 1]) / len(train[max(0, i - k + 1): i + 1]) for i in range(len(train))]
        ax[0].plot(steps, sm, lw=2, label=f"mean of {k}")
    ax[0].set_title("training loss (router only)")
    ax[0].set_xlabel("step")
    ax[0].legend()
    if ev:
        es = [r["step"] for r in ev]
        for key, lab in (("ppl_dense", "dense (base)"), ("ppl_soft", "Focus soft"), ("ppl_hard", f"hard k={ev[0].get('topk', 1)}")):
            ax[1].plot(es, [r[key] for r in ev], marker="o", label=lab)
        ax[1].set_title("validation perplexity, causal routing")
        ax[1].set_xlabel("step")
        ax[1].legend()
    ax[2].plot(steps, [r["largest_share"] for r in train], label="largest group share")
    ax[2].plot(steps, [r["gate_far"] for r in train], label="mean gate, distant pairs")
    ax[2].set_title("groups and gate")
    ax[2].set_xlabel("step")
    ax[2].legend()
    fig.tight_layout()
    fig.savefig(f"{run}/run.png", dpi=100)
    print(f"{run}/run.png")


if __name__ == "__main__":
    main()
