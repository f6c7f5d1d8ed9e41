#!/usr/bin/env python3
"""Write tests/fixtures/dequant_ref.txt: for each GGUF block type, random blocks (with sane
half-float scales) and their values as the `gguf` package dequantises them.
tests/test_gguf.c dequantises the same bytes with our code and compares.

    pip install gguf numpy
    python3 scripts/reference/make_dequant_fixture.py
"""
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

# type: (block elements, block bytes, byte offsets of f16 scales)
TYPES = {
    "Q4_0": (32, 18, [0]), "Q4_1": (32, 20, [0, 2]), "Q5_0": (32, 22, [0]), "Q5_1": (32, 24, [0, 2]),
    "Q8_0": (32, 34, [0]), "Q4_K": (256, 144, [0, 2]), "Q5_K": (256, 176, [0, 2]), "Q6_K": (256, 210, [208]),
    "F16": (1, 2, []), "BF16": (1, 2, []),
}

rng = np.random.default_rng(1)
lines = ["# type n_elements hex_bytes / then the n_elements reference values"]
for name, (blk, nbytes, scales) in TYPES.items():
    nblocks = 2 if blk > 1 else 64
    raw = bytearray(rng.integers(0, 256, nblocks * nbytes, dtype=np.uint8).tobytes())
    for b in range(nblocks):
        for off in scales:
            h = np.float16(rng.uniform(-0.05, 0.05)).tobytes()
            raw[b * nbytes + off: b * nbytes + off + 2] = h
    if name == "F16":
        raw = np.float16(rng.normal(size=nblocks)).tobytes()
    if name == "BF16":
        raw = (np.float32(rng.normal(size=nblocks)).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    vals = dequantize(np.frombuffer(bytes(raw), dtype=np.uint8), getattr(Q, name)).reshape(-1)
    lines.append(f"{name} {len(vals)} {bytes(raw).hex()}")
    lines.append(" ".join(f"{v:.9g}" for v in vals))
open("tests/fixtures/dequant_ref.txt", "w").write("\n".join(lines) + "\n")
