#!/usr/bin/python3
"""An independent safetensors reader, written from the format's public description with
Python's standard library only (no numpy: it runs on any python3 >= 3.8, as the tests run
it with `python3 -S`). It checks what the reference reader checks (header length, JSON,
dtypes, extents that tile the data exactly) and prints one line per tensor: name, dtype,
shape, and the float64 sum of its values in storage order.
Usage: tools/read_safetensors.py FILE.safetensors
"""
import array
import json
import struct
import sys

# safetensors dtype -> (name printed, struct format of one element, bytes per element)
DTYPES = {"F64": ("float64", "d", 8), "F32": ("float32", "f", 4), "F16": ("float16", "e", 2),
          "BF16": ("float32", None, 2), "I64": ("int64", "q", 8), "I32": ("int32", "i", 4),
          "U16": ("uint16", "H", 2), "U8": ("uint8", "B", 1)}


def values(dtype, raw):
    """The elements of little-endian bytes `raw` as Python numbers."""
    if dtype == "BF16":  # the top 16 bits of an f32
        halves = struct.unpack(f"<{len(raw) // 2}H", raw)
        return struct.unpack(f"<{len(halves)}f", struct.pack(f"<{len(halves)}I", *(h << 16 for h in halves)))
    fmt = DTYPES[dtype][1]
    if fmt in ("d", "f") and sys.byteorder == "little":
        return array.array(fmt, raw)
    return struct.unpack(f"<{len(raw) // DTYPES[dtype][2]}{fmt}", raw)


def read(path):
    with open(path, "rb") as f:
        raw = f.read()
    assert len(raw) >= 8, "shorter than the 8-byte header length"
    (n,) = struct.unpack("<Q", raw[:8])
    assert 8 + n <= len(raw), "header runs past the file"
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    header.pop("__metadata__", None)
    spans, out = [], {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        assert e["dtype"] in DTYPES, f"{name}: unknown dtype {e['dtype']}"
        count = 1
        for d in e["shape"]:
            count *= d
        assert end - begin == count * DTYPES[e["dtype"]][2], f"{name}: shape and extent disagree"
        out[name] = (DTYPES[e["dtype"]][0], list(e["shape"]), values(e["dtype"], data[begin:end]))
        spans.append((begin, end))
    pos = 0
    for begin, end in sorted(spans):
        assert begin == pos, "extents overlap or leave a hole"
        pos = end
    assert pos == len(data), "bytes after the last tensor"
    return out


if __name__ == "__main__":
    for name, (dtype, shape, vals) in sorted(read(sys.argv[1]).items()):
        total = 0.0
        for v in vals:  # one addition at a time, in storage order, as the tests sum
            total += float(v)
        print(f"{name} {dtype} {shape} {total!r}")
