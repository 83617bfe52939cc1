#!/usr/bin/python3
"""An independent safetensors reader, written from the format's public description with
numpy only (Debian 12 packages no Python `safetensors`). It checks what the reference
reader checks (header length, JSON, dtypes, extents that tile the data exactly) and prints
one line per tensor: name, dtype, shape, and the float64 sum of its values.
Usage: tools/read_safetensors.py FILE.safetensors
"""
import json
import struct
import sys

import numpy as np

DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
          "I32": np.int32, "U16": np.uint16, "U8": np.uint8}


def read(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert 8 + n <= len(raw), "header runs past the file"
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    header.pop("__metadata__", None)
    spans, out = [], {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        if e["dtype"] == "BF16":
            bits = np.frombuffer(data[begin:end], dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        else:
            arr = np.frombuffer(data[begin:end], dtype=np.dtype(DTYPES[e["dtype"]]).newbyteorder("<"))
        assert arr.size == int(np.prod(e["shape"], dtype=np.int64)), f"{name}: shape and extent disagree"
        out[name] = arr.reshape(e["shape"])
        spans.append((begin, end))
    pos = 0
    for begin, end in sorted(spans):
        assert begin == pos, "extents overlap or leave a hole"
        pos = end
    assert pos == len(data), "bytes after the last tensor"
    return out


if __name__ == "__main__":
    for name, arr in sorted(read(sys.argv[1]).items()):
        print(f"{name} {arr.dtype} {list(arr.shape)} {float(arr.astype(np.float64).sum())!r}")
