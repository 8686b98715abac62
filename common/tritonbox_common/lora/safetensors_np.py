"""Read a .safetensors file into numpy without torch or the safetensors package.

The api service installs neither, and `safetensors.numpy` cannot load bf16 (numpy has no bf16).
The format is small and documented (huggingface/safetensors README "Format"): an 8-byte
little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}}, then the raw
little-endian tensor bytes, offsets relative to the end of the header.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import numpy.typing as npt

# bf16 is the upper half of a float32: widen by shifting the 16 bits into the high half.
_DTYPES: dict[str, np.dtype[Any]] = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
}
F32 = npt.NDArray[np.float32]
_MAX_HEADER = 100 * 1024 * 1024  # the reference implementation's own limit


class SafetensorsError(ValueError):
    """The bytes are not a safetensors file we can read (reason in the message)."""


def load_float32(data: bytes) -> dict[str, F32]:
    """Every tensor in `data` as a float32 array (fp32, fp16 and bf16 files)."""
    if len(data) < 8:
        raise SafetensorsError("file is shorter than its 8-byte header length")
    (size,) = struct.unpack("<Q", data[:8])
    if size > _MAX_HEADER or 8 + size > len(data):
        raise SafetensorsError("header length points past the end of the file")
    try:
        header = json.loads(data[8 : 8 + size])
    except (UnicodeDecodeError, ValueError) as e:
        raise SafetensorsError(f"header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise SafetensorsError("header is not a JSON object")
    body = memoryview(data)[8 + size :]
    tensors: dict[str, F32] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        tensors[name] = _tensor(name, info, body)
    return tensors


def _tensor(name: str, info: Any, body: memoryview) -> F32:
    try:
        dtype_name, shape = info["dtype"], [int(d) for d in info["shape"]]
        start, end = (int(o) for o in info["data_offsets"])
    except (TypeError, KeyError, ValueError):
        raise SafetensorsError(f"tensor {name!r} has a malformed header entry") from None
    dtype = _DTYPES.get(dtype_name)
    if dtype is None:
        raise SafetensorsError(f"tensor {name!r} has dtype {dtype_name} (fp32/fp16/bf16 only)")
    count = int(np.prod(shape)) if shape else 1
    if not 0 <= start <= end <= len(body) or end - start != count * dtype.itemsize:
        raise SafetensorsError(f"tensor {name!r} has data offsets that do not match its shape")
    raw = np.frombuffer(body[start:end], dtype=dtype).reshape(shape)
    if dtype_name == "BF16":
        widened: F32 = (raw.astype(np.uint32) << 16).view(np.float32)
        return widened
    return raw.astype(np.float32)
