"""Read a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors) into numpy.

The weights file is parsed by the `safetensors` library (its Rust reader checks the header:
shapes, offsets, sizes), not by hand; its tensors come back as bytes and are widened to float32
here, because `safetensors.numpy` cannot load bf16 (numpy has none). Every defect, whatever it
is, is an AdapterError naming the adapter, and the files are read only after their size is
checked against `max_bytes`.

Only what every engine can reproduce exactly is accepted: plain LoRA on the seven Llama
projections, one rank and one alpha for every module. Everything else (DoRA, modules_to_save,
trained biases, per-layer patterns, per-module ranks) is refused with a reason rather than
silently served as something the adapter was not trained to be.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import safetensors

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# The Llama projections a LoRA may target (HF module names), attention first.
LLAMA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# peft's key: base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight
_KEY = re.compile(
    r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$"
)

F32 = npt.NDArray[np.float32]
Weights = dict[tuple[int, str], tuple[F32, F32]]
# The weight dtypes an adapter may have; bf16 is read as uint16 and widened into float32's high
# half (bf16 is the upper half of a float32).
_DTYPES: dict[str, np.dtype[Any]] = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
}


class AdapterError(ValueError):
    """An adapter that cannot be served; the message names the adapter and the reason."""


@dataclass(frozen=True)
class PeftAdapter:
    base_model: str | None
    rank: int
    alpha: float
    use_rslora: bool
    target_modules: tuple[str, ...]
    # (layer, HF module) -> (A [rank, in], B [out, rank]) float32, unscaled as peft stores them.
    weights: Weights = field(repr=False)
    sha256: str

    @property
    def scaling(self) -> float:
        """peft's LoraLayer.update_layer: alpha/r, or alpha/sqrt(r) with rsLoRA."""
        return self.alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)

    @property
    def size_bytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())


def task_id(sha256: str) -> int:
    """TensorRT-LLM task id of an adapter: 60 bits of its content hash (fits UINT64 and int64)."""
    return int(sha256[:15], 16)


def read_peft_adapter(
    folder: Path, *, name: str | None = None, max_bytes: int | None = None
) -> PeftAdapter:
    """The adapter in `folder`, or AdapterError naming it (`name`, else the folder) and what is
    wrong. With `max_bytes`, two files larger together are refused before they are read."""
    shown = name or str(folder)

    def fail(reason: str) -> AdapterError:
        return AdapterError(f"adapter {shown}: {reason}")

    try:
        config_bytes, weight_bytes = _read_files(folder, max_bytes, fail)
    except FileNotFoundError as e:
        raise fail(f"missing file {Path(e.filename).name}") from None
    except OSError as e:  # the file's name only: the answer must not show the server's folders
        raise fail(f"cannot read {Path(e.filename or '').name}: {e.strerror}") from None
    try:
        config = json.loads(config_bytes)
    except (UnicodeDecodeError, ValueError):
        raise fail(f"{CONFIG_FILE} is not valid JSON") from None
    if not isinstance(config, dict):
        raise fail(f"{CONFIG_FILE} is not a JSON object")
    rank, alpha = _check_config(config, fail)
    tensors = _load_float32(weight_bytes, fail)
    weights = _pair_weights(tensors, rank, fail)
    modules = {module for _, module in weights}
    return PeftAdapter(
        base_model=config.get("base_model_name_or_path") or None,
        rank=rank,
        alpha=alpha,
        use_rslora=bool(config.get("use_rslora", False)),
        target_modules=tuple(m for m in LLAMA_MODULES if m in modules),
        weights=weights,
        sha256=hashlib.sha256(config_bytes + weight_bytes).hexdigest(),
    )


def _read_files(folder: Path, max_bytes: int | None, fail: Any) -> tuple[bytes, bytes]:
    """Both files' bytes, never more than `max_bytes` together: sized first (a file may also
    grow while it is read: the read stops one byte past what is left)."""
    files = (folder / CONFIG_FILE, folder / WEIGHTS_FILE)
    sizes = [path.stat().st_size for path in files]
    if max_bytes is not None and sum(sizes) > max_bytes:
        raise fail(f"its files are {sum(sizes)} bytes, over the limit of {max_bytes} "
                   "(ADAPTER_MAX_BYTES)")  # fmt: skip
    left = max_bytes if max_bytes is not None else -1
    contents = []
    for path in files:
        with path.open("rb") as file:
            data = file.read(left + 1 if left >= 0 else -1)
        left = left - len(data) if left >= 0 else -1
        if max_bytes is not None and left < 0:
            raise fail(f"its files grew over the limit of {max_bytes} bytes (ADAPTER_MAX_BYTES)")
        contents.append(data)
    return contents[0], contents[1]


def _load_float32(data: bytes, fail: Any) -> dict[str, F32]:
    """Every tensor of the safetensors bytes as float32 (fp32, fp16 and bf16 files)."""
    try:
        entries = safetensors.deserialize(data)
    except Exception as e:  # SafetensorError, and whatever else a hostile header provokes
        raise fail(f"{WEIGHTS_FILE} is corrupt: {e}") from None
    tensors: dict[str, F32] = {}
    for key, info in entries:
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise fail(f"{WEIGHTS_FILE} is corrupt: tensor {key!r} has dtype {info['dtype']} "
                       "(fp32/fp16/bf16 only)")  # fmt: skip
        raw = np.frombuffer(info["data"], dtype=dtype).reshape(info["shape"])
        if info["dtype"] == "BF16":
            tensors[key] = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            tensors[key] = raw.astype(np.float32)
    return tensors


def _check_config(config: dict[str, Any], fail: Any) -> tuple[int, float]:
    if config.get("peft_type", "LORA") != "LORA":
        raise fail(f"peft_type {config.get('peft_type')} is not supported (LORA only)")
    refused = {
        "use_dora": "DoRA (use_dora) is not supported",
        "modules_to_save": "modules_to_save (fully trained extra modules) is not supported",
        "layers_to_transform": "layers_to_transform is not supported",
        "layers_pattern": "layers_pattern is not supported",
        "rank_pattern": "a different rank per module (rank_pattern) is not supported",
        "alpha_pattern": "a different alpha per module (alpha_pattern) is not supported",
        "lora_bias": "trained LoRA biases (lora_bias) are not supported",
        "fan_in_fan_out": "fan_in_fan_out (Conv1D layers) is not supported",
    }
    for key, reason in refused.items():
        if config.get(key):
            raise fail(reason)
    if config.get("bias", "none") != "none":
        raise fail(f"bias={config.get('bias')} is not supported (only bias=none)")
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise fail(f"rank r={rank!r} is not a positive integer")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise fail(f"lora_alpha={alpha!r} is not a number")
    return rank, float(alpha)


def _pair_weights(tensors: dict[str, F32], rank: int, fail: Any) -> Weights:
    halves: dict[tuple[int, str], dict[str, F32]] = {}
    for key, value in tensors.items():
        match = _KEY.match(key)
        if match is None:
            raise fail(f"unexpected tensor {key} (only lora_A/lora_B of Llama layers)")
        layer, module, half = int(match[1]), match[3], match[4]
        if module not in LLAMA_MODULES:
            raise fail(f"target module {module} is not supported ({' '.join(LLAMA_MODULES)})")
        if value.ndim != 2:
            raise fail(f"tensor {key} has shape {value.shape}, expected 2 dimensions")
        halves.setdefault((layer, module), {})[half] = value
    if not halves:
        raise fail(f"{WEIGHTS_FILE} holds no LoRA weights")
    weights: Weights = {}
    for (layer, module), pair in sorted(halves.items()):
        if set(pair) != {"A", "B"}:
            raise fail(f"layer {layer} {module} has lora_A or lora_B but not both")
        a, b = pair["A"], pair["B"]
        if a.shape[0] != rank or b.shape[1] != rank:
            raise fail(
                f"layer {layer} {module} has rank {a.shape[0]}/{b.shape[1]}, the config says"
                f" r={rank} (a different rank per module is not supported)"
            )
        weights[(layer, module)] = (a, b)
    return weights
