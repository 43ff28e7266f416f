"""The safetensors format, read and written with the standard library, numpy and torch.

A file is: an 8-byte little-endian unsigned header length N, then N bytes of JSON
{"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
"__metadata__": {str: str}} (padded with spaces to a multiple of 8), then the tensor bytes,
little-endian and row-major, each tensor's [begin, end) counted from the end of the header.
"""

import json
import struct

import numpy as np
import torch

_DTYPES = {
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.float32: "F32",
    torch.int32: "I32",
    torch.int64: "I64",
}
_TORCH = {v: k for k, v in _DTYPES.items()}
_NUMPY = {"F16": np.float16, "F32": np.float32, "I32": np.int32, "I64": np.int64}


def _raw_bytes(t):
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().astype("<i2").tobytes()
    return t.numpy().astype(t.numpy().dtype.newbyteorder("<")).tobytes()


def write(path, tensors, metadata=None):
    """Writes {name: tensor} (in the given order) to path."""
    header = {}
    blobs = []
    offset = 0
    for name, t in tensors.items():
        if t.dtype not in _DTYPES:
            raise ValueError(f"{name}: dtype {t.dtype} has no safetensors name here")
        data = _raw_bytes(t)
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    head = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)


def read(path):
    """Returns ({name: tensor}, metadata) from a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        raw = data[base + begin:base + end]
        dtype = info["dtype"]
        if dtype == "BF16":
            arr = np.frombuffer(raw, dtype="<i2").copy()
            t = torch.from_numpy(arr).view(torch.bfloat16)
        else:
            arr = np.frombuffer(raw, dtype=np.dtype(_NUMPY[dtype]).newbyteorder("<")).copy()
            t = torch.from_numpy(arr.astype(_NUMPY[dtype]))
        tensors[name] = t.reshape(info["shape"])
    return tensors, metadata
