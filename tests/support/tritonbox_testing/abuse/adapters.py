"""Hostile adapter folders, written by hand (no peft): a size bomb, malformed safetensors
headers, and sources outside the allowed root by every road (traversal, links, absolute paths).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

CONFIG = {
    "peft_type": "LORA",
    "r": 8,
    "lora_alpha": 16,
    "target_modules": ["q_proj"],
    "bias": "none",
    "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct",
}
Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"


def _safetensors(header: object, body: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + body


@dataclass(frozen=True)
class HostileAdapters:
    root: Path  # the api's ADAPTER_DIRS
    outside: Path  # a readable adapter folder out of it
    oversize_bytes: int  # the size bomb's weights file (sparse: no disk taken)


def make(folder: Path, max_bytes: int) -> HostileAdapters:
    """The folders under `folder`: `root/` (the allowed root) and `outside/`. `max_bytes`: the
    api's ADAPTER_MAX_BYTES, which the size bomb exceeds twice over."""
    root, outside = folder / "root", folder / "outside" / "secret"

    def adapter(path: Path, weights: bytes) -> Path:
        path.mkdir(parents=True)
        (path / "adapter_config.json").write_text(json.dumps(CONFIG))
        (path / "adapter_model.safetensors").write_bytes(weights)
        return path

    adapter(outside, _safetensors({}, b""))
    oversize = adapter(root / "oversize", b"")
    with (oversize / "adapter_model.safetensors").open("wb") as file:
        file.truncate(2 * max_bytes)  # a hole: the size is real, the disk untouched
    # A negative dimension (once a 500), a header longer than any file, one that is not a map.
    entry = {"dtype": "F32", "shape": [-1, 4], "data_offsets": [0, 16]}
    adapter(root / "negative-shape", _safetensors({Q_A: entry}, b"\0" * 16))
    adapter(root / "header-bomb", struct.pack("<Q", 2**62) + b"{}")
    adapter(root / "not-a-map", _safetensors([1, 2], b""))
    (root / "escape").symlink_to(outside)  # a link in the root to a folder out of it
    half = root / "half"  # a real folder in the root whose weights link out of it
    half.mkdir()
    (half / "adapter_config.json").write_text(json.dumps(CONFIG))
    (half / "adapter_model.safetensors").symlink_to(outside / "adapter_model.safetensors")
    return HostileAdapters(root=root, outside=outside, oversize_bytes=2 * max_bytes)
