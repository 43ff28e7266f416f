#!/usr/bin/python3
"""Independent reader for a Hugging Face safetensors checkpoint (numpy only).

Usage: reference_checkpoint_reader.py CHECKPOINT_DIR OUT_PREFIX
Writes OUT_PREFIX.json (names, shapes, offsets) and OUT_PREFIX.bin: every tensor that is not
a *_scale_inv as BF16 bits (uint16), FP8 weights dequantized with their 2-D block scales and
rounded to BF16 (nearest even), F32 tensors rounded to BF16 the same way.
"""
import json
import os
import struct
import sys

import numpy as np


def e4m3_table():
    table = np.zeros(256, dtype=np.float64)
    for v in range(256):
        s, e, m = v >> 7, (v >> 3) & 15, v & 7
        if e == 15 and m == 7:
            x = np.nan
        elif e == 0:
            x = 2.0 ** -6 * (m / 8.0)
        else:
            x = 2.0 ** (e - 7) * (1 + m / 8.0)
        table[v] = -x if s else x
    return table


def to_bf16_bits(values_f32):
    bits = values_f32.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def read_shard(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n].decode("utf-8"))
    header.pop("__metadata__", None)
    data = raw[8 + n :]
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1]) for v in header.values())
    pos = 0
    for b, e in spans:
        assert b == pos, f"{path}: gap or overlap at {b}"
        pos = e
    assert pos == len(data), f"{path}: data section not covered"
    dtypes = {"F32": np.float32, "BF16": np.uint16, "F16": np.float16, "F8_E4M3": np.uint8}
    tensors = {}
    for name, v in header.items():
        b, e = v["data_offsets"]
        arr = np.frombuffer(data[b:e], dtype=dtypes[v["dtype"]]).reshape(v["shape"])
        tensors[name] = (v["dtype"], arr)
    return tensors


def main():
    ckpt, out = sys.argv[1], sys.argv[2]
    config = json.load(open(os.path.join(ckpt, "config.json")))
    block = config.get("quantization_config", {}).get("weight_block_size")
    index = json.load(open(os.path.join(ckpt, "model.safetensors.index.json")))
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        tensors.update(read_shard(os.path.join(ckpt, shard)))
    assert set(tensors) == set(index["weight_map"]), "index and shards disagree"
    table = e4m3_table()
    names = sorted(n for n in tensors if not n.endswith("_scale_inv"))
    listing, chunks, offset = [], [], 0
    for name in names:
        dtype, arr = tensors[name]
        if dtype == "BF16":
            bits = arr.reshape(-1)
        elif dtype == "F32":
            bits = to_bf16_bits(arr.reshape(-1))
        elif dtype == "F8_E4M3":
            scale = tensors[name + "_scale_inv"][1].astype(np.float64)
            rows, cols = arr.shape
            r_idx = np.arange(rows) // block[0]
            c_idx = np.arange(cols) // block[1]
            full_scale = scale[r_idx][:, c_idx]
            values = (table[arr] * full_scale).astype(np.float32)  # exact product, one rounding
            bits = to_bf16_bits(values.reshape(-1))
        else:
            raise SystemExit(f"unexpected dtype {dtype} for {name}")
        listing.append({"name": name, "shape": list(arr.shape), "offset": offset})
        offset += bits.size
        chunks.append(bits.astype("<u2").tobytes())
    with open(out + ".bin", "wb") as f:
        for c in chunks:
            f.write(c)
    with open(out + ".json", "w") as f:
        json.dump(listing, f)


if __name__ == "__main__":
    main()
