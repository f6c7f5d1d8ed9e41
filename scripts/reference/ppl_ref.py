#!/usr/bin/env python3
"""Independent perplexity of a GGUF `llama` model: the `gguf` package reads and dequantises
the tensors, NumPy runs the forward pass, Hugging Face `tokenizers` tokenizes (tokenize_ref.py).
Used to check `focus eval ppl` (docs/RESULTS.md). Also writes the first logits of a short text
as the fixture of tests/test_smollm2.c (--fixture).

    pip install gguf numpy tokenizers
    python3 scripts/reference/ppl_ref.py --model cache/models/SmolLM2-135M-Instruct.Q4_1.gguf \
        --text ../shared/data/pg19-sample/test/pg11.txt --ctx 1024 --max-tokens 8192
"""
import argparse
import os
import sys
import time

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

sys.path.insert(0, os.path.dirname(__file__))
from tokenize_ref import from_gguf  # noqa: E402


class Llama:
    def __init__(self, path):
        r = GGUFReader(path)
        f = r.fields

        def val(k):
            return f[k].parts[f[k].data[0]][0]

        self.L = int(val("llama.block_count"))
        self.C = int(val("llama.embedding_length"))
        self.NH = int(val("llama.attention.head_count"))
        self.NKV = int(val("llama.attention.head_count_kv"))
        self.eps = float(val("llama.attention.layer_norm_rms_epsilon"))
        self.theta = float(val("llama.rope.freq_base"))
        self.w = {}
        for t in r.tensors:
            a = dequantize(t.data, t.tensor_type).astype(np.float32)
            shape = [int(x) for x in reversed(t.shape)]  # ne[0] is the fastest dimension
            self.w[t.name] = a.reshape(shape)

    def rms(self, x, g):
        return x / np.sqrt(np.mean(x.astype(np.float64) ** 2, -1, keepdims=True) + self.eps).astype(np.float32) * g

    def rope(self, x):  # x: (T, H, hs); GGUF llama rotates adjacent pairs
        T, H, hs = x.shape
        inv = self.theta ** (-np.arange(0, hs, 2, dtype=np.float64) / hs)
        ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
        c, s = np.cos(ang)[:, None, :].astype(np.float32), np.sin(ang)[:, None, :].astype(np.float32)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * c - x1 * s
        out[..., 1::2] = x0 * s + x1 * c
        return out

    def logits(self, ids):
        T, C, NH, NKV = len(ids), self.C, self.NH, self.NKV
        hs = C // NH
        w = self.w
        x = w["token_embd.weight"][ids]
        mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)
        for l in range(self.L):
            p = f"blk.{l}."
            h = self.rms(x, w[p + "attn_norm.weight"])
            q = self.rope((h @ w[p + "attn_q.weight"].T).reshape(T, NH, hs))
            k = self.rope((h @ w[p + "attn_k.weight"].T).reshape(T, NKV, hs))
            v = (h @ w[p + "attn_v.weight"].T).reshape(T, NKV, hs)
            out = np.empty((T, NH, hs), dtype=np.float32)
            for hh in range(NH):
                kv = hh // (NH // NKV)
                s = q[:, hh] @ k[:, kv].T / np.sqrt(hs) + mask
                s = np.exp(s - s.max(-1, keepdims=True))
                out[:, hh] = (s / s.sum(-1, keepdims=True)) @ v[:, kv]
            x = x + out.reshape(T, C) @ w[p + "attn_output.weight"].T
            h = self.rms(x, w[p + "ffn_norm.weight"])
            g = h @ w[p + "ffn_gate.weight"].T
            u = h @ w[p + "ffn_up.weight"].T
            x = x + ((g / (1 + np.exp(-g))) * u) @ w[p + "ffn_down.weight"].T
        x = self.rms(x, w["output_norm.weight"])
        head = w.get("output.weight", w["token_embd.weight"])
        return x @ head.T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=0)
    ap.add_argument("--fixture", help="write the first logits of the first 16 tokens here and exit")
    a = ap.parse_args()
    tok = from_gguf(a.model)
    ids = tok.encode(open(a.text, "rb").read().decode("utf-8"), add_special_tokens=False).ids
    if a.max_tokens:
        ids = ids[: a.max_tokens]
    m = Llama(a.model)
    if a.fixture:
        n = 16
        lg = m.logits(np.array(ids[:n]))
        with open(a.fixture, "w") as f:
            f.write(f"# first {n} tokens of {os.path.basename(a.text)} and logits[t, 0:8] at each t (NumPy reference)\n")
            f.write(" ".join(map(str, ids[:n])) + "\n")
            for t in range(n):
                f.write(" ".join(f"{v:.5f}" for v in lg[t, :8]) + "\n")
        return
    nll, count, t0 = 0.0, 0, time.time()
    for st in range(0, len(ids) - 1, a.ctx):
        w = np.array(ids[st: st + a.ctx + 1])
        if len(w) < 2:
            break
        lg = m.logits(w[:-1]).astype(np.float64)
        mx = lg.max(-1, keepdims=True)
        lse = (mx[:, 0] + np.log(np.exp(lg - mx).sum(-1)))
        nll += float((lse - lg[np.arange(len(w) - 1), w[1:]]).sum())
        count += len(w) - 1
        print(f"  {count} tokens, ppl so far {np.exp(nll / count):.4f}", file=sys.stderr)
    print(f"reference perplexity {np.exp(nll / count):.4f}  tokens {count}  ({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
