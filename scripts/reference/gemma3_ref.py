#!/usr/bin/env python3
"""Independent forward pass of a GGUF `gemma3` model in NumPy, float64 throughout: the `gguf`
package reads and dequantises the tensors, the layer is written out from Gemma 3's published
structure (not from focus): embeddings scaled by sqrt(C); per layer RMSNorm, q/k/v, RMSNorm of
each q and k head, RoPE on half-split pairs (base 1e4 on the local layers, the file's on every
6th, global, layer), attention scaled by 1/sqrt(head size) within a sliding window of the file's
width on the local layers, RMSNorm of the attention output before the residual add, RMSNorm,
GELU(tanh)-gated MLP, RMSNorm of its output before the add; final RMSNorm, the tied head. The
GGUF norm weights carry Gemma's +1 already. Writes the fixture of tests/test_gemma3.c: the first
logits of 16 tokens at 8 vocabulary ids.

    pip install gguf numpy
    python3 scripts/reference/gemma3_ref.py --model cache/models/gemma-3-270m-q4_k_m.gguf \
        --ids 2,237922,818,7879,180558,236858,236751,32858,236858,236751,63492,528,114732,236764,684,18811 \
        --fixture tests/fixtures/gemma3_first_logits.txt
"""
import argparse

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

VOCAB_IDS = [0, 1, 107, 496, 818, 1902, 9259, 236761]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--ids", required=True, help="comma-separated token ids (BOS first)")
    ap.add_argument("--fixture", required=True)
    a = ap.parse_args()
    r = GGUFReader(a.model)
    f = r.fields

    def val(k):
        return f[k].parts[f[k].data[0]][0]

    L = int(val("gemma3.block_count"))
    C = int(val("gemma3.embedding_length"))
    NH = int(val("gemma3.attention.head_count"))
    NKV = int(val("gemma3.attention.head_count_kv"))
    hs = int(val("gemma3.attention.key_length"))
    eps = float(val("gemma3.attention.layer_norm_rms_epsilon"))
    theta = float(val("gemma3.rope.freq_base"))
    swa = int(val("gemma3.attention.sliding_window"))
    w = {}
    for t in r.tensors:
        arr = dequantize(t.data, t.tensor_type).astype(np.float64)
        w[t.name] = arr.reshape([int(x) for x in reversed(t.shape)])
    ids = np.array([int(x) for x in a.ids.split(",")])
    T = len(ids)

    def rms(x, g):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * g

    def rope(x, base):  # (T, H, hs), pairs (i, i + hs/2)
        half = hs // 2
        inv = base ** (-np.arange(0, half, dtype=np.float64) * 2 / hs)
        ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x0, x1 = x[..., :half], x[..., half:]
        return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], -1)

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))

    x = w["token_embd.weight"][ids] * np.sqrt(C)
    i = np.arange(T)[:, None]
    j = np.arange(T)[None, :]
    for l in range(L):
        p = f"blk.{l}."
        local = l % 6 != 5
        h = rms(x, w[p + "attn_norm.weight"])
        q = rms((h @ w[p + "attn_q.weight"].T).reshape(T, NH, hs), w[p + "attn_q_norm.weight"])
        k = rms((h @ w[p + "attn_k.weight"].T).reshape(T, NKV, hs), w[p + "attn_k_norm.weight"])
        v = (h @ w[p + "attn_v.weight"].T).reshape(T, NKV, hs)
        q, k = rope(q, 1e4 if local else theta), rope(k, 1e4 if local else theta)
        keep = (j <= i) & ((i - j < swa) if local else True)
        out = np.empty((T, NH, hs))
        for hh in range(NH):
            kv = hh // (NH // NKV)
            s = np.where(keep, q[:, hh] @ k[:, kv].T / np.sqrt(hs), -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            out[:, hh] = (s / s.sum(-1, keepdims=True)) @ v[:, kv]
        x = x + rms(out.reshape(T, NH * hs) @ w[p + "attn_output.weight"].T,
                    w[p + "post_attention_norm.weight"])
        h = rms(x, w[p + "ffn_norm.weight"])
        g = h @ w[p + "ffn_gate.weight"].T
        u = h @ w[p + "ffn_up.weight"].T
        x = x + rms((gelu(g) * u) @ w[p + "ffn_down.weight"].T, w[p + "post_ffw_norm.weight"])
    x = rms(x, w["output_norm.weight"])
    lg = x @ w["token_embd.weight"][VOCAB_IDS].T
    with open(a.fixture, "w") as fo:
        fo.write(f"# {T} token ids (BOS first), then logits at vocabulary ids {' '.join(map(str, VOCAB_IDS))} "
                 "for each position (NumPy float64 reference, scripts/reference/gemma3_ref.py)\n")
        fo.write(" ".join(map(str, ids)) + "\n")
        for t in range(T):
            fo.write(" ".join(f"{v:.5f}" for v in lg[t]) + "\n")


if __name__ == "__main__":
    main()
