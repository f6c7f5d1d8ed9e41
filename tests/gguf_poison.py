#!/usr/bin/env python3
"""gguf_poison.py IN OUT NAME VALUE: copy GGUF file IN to OUT with the integer metadata key NAME
(llama.attention.head_count) set to VALUE, or else with the first element of tensor NAME set to
VALUE (nan, inf or a number). For F32 and F16 tensors the element itself; for
block formats (Q4_0, Q4_1, Q8_0, ...) the first block's fp16 scale. The tests use it to check
that a corrupt weight stops every command with one line instead of garbage. Standard library
only; reads the GGUF header as the format specification describes it (version 2 and 3)."""
import struct
import sys

# value type -> struct code of a scalar (8: string, 9: array handled apart)
SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def read(fmt, data, pos):
    size = struct.calcsize("<" + fmt)
    return struct.unpack_from("<" + fmt, data, pos)[0], pos + size


def skip_value(data, pos, vtype):
    if vtype == 8:
        n, pos = read("Q", data, pos)
        return pos + n
    if vtype == 9:
        etype, pos = read("I", data, pos)
        n, pos = read("Q", data, pos)
        for _ in range(n):
            pos = skip_value(data, pos, etype)
        return pos
    return pos + struct.calcsize("<" + SCALAR[vtype])


def main():
    src, dst, name, value = sys.argv[1:5]
    data = bytearray(open(src, "rb").read())
    if data[:4] != b"GGUF":
        sys.exit(f"{src}: not a GGUF file")
    pos = 4
    _, pos = read("I", data, pos)
    ntensors, pos = read("Q", data, pos)
    nkv, pos = read("Q", data, pos)
    alignment = 32
    for _ in range(nkv):
        klen, pos = read("Q", data, pos)
        key = bytes(data[pos:pos + klen]).decode()
        pos += klen
        vtype, pos = read("I", data, pos)
        if key == "general.alignment" and vtype == 4:
            alignment = struct.unpack_from("<I", data, pos)[0]
        if key == name and vtype in (4, 5, 10, 11):
            struct.pack_into("<" + SCALAR[vtype], data, pos, int(value))
            open(dst, "wb").write(bytes(data))
            return
        pos = skip_value(data, pos, vtype)
    found = None
    for _ in range(ntensors):
        nlen, pos = read("Q", data, pos)
        tname = bytes(data[pos:pos + nlen]).decode()
        pos += nlen
        ndims, pos = read("I", data, pos)
        pos += 8 * ndims
        ttype, pos = read("I", data, pos)
        offset, pos = read("Q", data, pos)
        if tname == name:
            found = (ttype, offset)
    if found is None:
        sys.exit(f"{src}: no tensor {name}")
    base = (pos + alignment - 1) // alignment * alignment
    ttype, offset = found
    at = base + offset
    v = float(value)
    if ttype == 0:  # F32
        struct.pack_into("<f", data, at, v)
    else:  # F16, and the leading fp16 scale of the block formats
        struct.pack_into("<e", data, at, v)
    open(dst, "wb").write(bytes(data))


if __name__ == "__main__":
    main()
