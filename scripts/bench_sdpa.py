"""bench_sdpa.py: the external baseline for `focus bench attention --device cuda`.

Times PyTorch's scaled_dot_product_attention restricted to its FlashAttention backend, causal,
bf16, batch 1, at the same lengths, heads and head size, on random inputs, and writes one JSON
record per length. Timing: CUDA events around one call after a warm-up (the best of --iters calls
below 256K tokens, one call above), the same protocol as the C benchmark.

  python3 scripts/bench_sdpa.py --T 16384,65536 --heads 4 --dhead 64 --json sdpa.json
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def time_call(fn, reps):
    best = float("inf")
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end))
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", default="16384,65536,262144,1048576")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dhead", type=int, default=64)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rows = []
    print(f"PyTorch {torch.__version__} scaled_dot_product_attention (FLASH_ATTENTION backend), "
          f"{torch.cuda.get_device_name()}, heads {a.heads}, head dim {a.dhead}, causal, bf16")
    print(f"{'T':>9} {'ms':>10} {'TFLOP/s':>9}")
    for T in [int(x) for x in a.T.split(",")]:
        q, k, v = (torch.randn(1, a.heads, T, a.dhead, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            def run():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            small = [t[:, :, :4096] for t in (q, k, v)]
            F.scaled_dot_product_attention(*small, is_causal=True)  # warm-up
            torch.cuda.synchronize()
            ms = time_call(run, 1 if T >= (1 << 18) else a.iters)
        flops = 4.0 * a.heads * a.dhead * T * (T + 1) / 2
        print(f"{T:9d} {ms:10.2f} {flops / ms / 1e9:9.1f}", flush=True)
        rows.append({"T": T, "heads": a.heads, "head_dim": a.dhead, "sdpa_ms": ms,
                     "sdpa_tflops": flops / ms / 1e9, "torch": torch.__version__})
        del q, k, v
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
