"""PEFT LoRA <-> TensorRT-LLM 0.20's `lora_weights` / `lora_config` tensors.

Every rule follows NVIDIA's source (NVIDIA/TensorRT-LLM, v0.20):
- Module ids: `LoraModule::ModuleType` in cpp/include/tensorrt_llm/runtime/loraModule.h
  (kATTN_Q=1, kATTN_K=2, kATTN_V=3, kATTN_DENSE=4, kMLP_H_TO_4H=5, kMLP_4H_TO_H=6, kMLP_GATE=7),
  the same numbers as `LoraManager.LORA_MODULE_IDS` in tensorrt_llm/lora_manager.py.
- HF -> TRT-LLM names: `hf_modules_to_trtllm_modules` in examples/hf_lora_convert.py and
  tensorrt_llm/lora_manager.py: gate_proj -> mlp_h_to_4h, up_proj -> mlp_gate (NOT the other
  way round), down_proj -> mlp_4h_to_h, o_proj -> attn_dense.
- One row per (layer, module), `lora_config` row = [module_id, layer_idx, adapter_size]
  (examples/hf_lora_convert.py `convert_hf_model`, `converted_config.append(...)`).
- A row = A flattened then B flattened, row-major, A as peft's [r, in] and B as peft's [out, r]
  (the converter transposes only when the shapes say otherwise); the scaling alpha/r (or
  alpha/sqrt(r) with rsLoRA) is multiplied into B ("if inout == 'out': w = w * scale").
  Size r*(in+out) = `LoraModule::flattenedInOutSize` (loraModule.h) without DoRA.
- Rows are zero-padded at the end to the longest row (`torch.nn.functional.pad` in the
  converter); the converter adds a leading batch dim of 1, which Triton's client adds for us.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from tritonbox_common.lora.peft import AdapterError, PeftAdapter, Weights

Array = npt.NDArray[Any]

HF_TO_TRTLLM = {
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_dense",
    "gate_proj": "mlp_h_to_4h",
    "up_proj": "mlp_gate",
    "down_proj": "mlp_4h_to_h",
}
TRTLLM_MODULE_IDS = {
    "attn_q": 1,
    "attn_k": 2,
    "attn_v": 3,
    "attn_dense": 4,
    "mlp_h_to_4h": 5,
    "mlp_4h_to_h": 6,
    "mlp_gate": 7,
}
MODULE_ID = {hf: TRTLLM_MODULE_IDS[trt] for hf, trt in HF_TO_TRTLLM.items()}
HF_MODULE = {module_id: hf for hf, module_id in MODULE_ID.items()}


def llama_module_dims(
    hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int
) -> dict[str, tuple[int, int]]:
    """(in, out) features of each Llama projection, the `dims` from_lora_tensors needs."""
    q, kv = heads * head_dim, kv_heads * head_dim
    return {
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
        "gate_proj": (hidden, intermediate),
        "up_proj": (hidden, intermediate),
        "down_proj": (intermediate, hidden),
    }


def to_lora_tensors(adapter: PeftAdapter, dtype: npt.DTypeLike) -> tuple[Array, Array]:
    """(`lora_weights` [rows, longest] in `dtype`, `lora_config` [rows, 3] int32), no batch dim."""
    rows, config = [], []
    for (layer, module), (a, b) in sorted(adapter.weights.items()):
        scaled_b = b.astype(np.float32) * np.float32(adapter.scaling)
        rows.append(np.concatenate([a.reshape(-1), scaled_b.reshape(-1)]))
        config.append([MODULE_ID[module], layer, adapter.rank])
    width = max(row.size for row in rows)
    weights = np.zeros((len(rows), width), dtype=dtype)
    for i, row in enumerate(rows):
        weights[i, : row.size] = row
    return weights, np.asarray(config, dtype=np.int32).reshape(-1, 3)


def from_lora_tensors(
    weights: Array,
    config: Array,
    dims: Mapping[str, tuple[int, int]],
    *,
    num_layers: int | None = None,
) -> Weights:
    """(layer, HF module) -> (A [r, in], B [out, r]) float32, the scaling already inside B.

    `dims` holds the (in, out) features of the modules the engine supports; a row for any other
    module, a layer outside `num_layers` or a row too short for its rank is an AdapterError.
    A leading batch dim of 1 (the converter's .npy files) is accepted.
    """
    weights, config = _drop_batch_dim(weights), _drop_batch_dim(config)
    if weights.ndim != 2 or config.ndim != 2 or config.shape[1:] != (3,):
        raise AdapterError(
            f"LoRA tensors: lora_weights {weights.shape} / lora_config {config.shape} are not"
            " [rows, size] / [rows, 3]"
        )
    if weights.shape[0] != config.shape[0]:
        raise AdapterError(
            f"LoRA tensors: {weights.shape[0]} weight rows for {config.shape[0]} config rows"
        )
    out: Weights = {}
    for i, (module_id, layer, rank) in enumerate(config.tolist()):
        module = HF_MODULE.get(module_id)
        if module is None or module not in dims:
            supported = " ".join(str(MODULE_ID[m]) for m in dims if m in MODULE_ID)
            raise AdapterError(
                f"LoRA tensors: row {i} targets module id {module_id}, not supported here"
                f" (supported ids: {supported})"
            )
        if layer < 0 or (num_layers is not None and layer >= num_layers):
            raise AdapterError(f"LoRA tensors: row {i} targets layer {layer}, out of range")
        fan_in, fan_out = dims[module]
        size = rank * (fan_in + fan_out)
        if rank < 1 or size > weights.shape[1]:
            raise AdapterError(
                f"LoRA tensors: row {i} ({module}, rank {rank}) needs {size} values,"
                f" the row has {weights.shape[1]}"
            )
        row = np.asarray(weights[i, :size], dtype=np.float32)
        a = row[: rank * fan_in].reshape(rank, fan_in)
        b = row[rank * fan_in :].reshape(fan_out, rank)
        out[(layer, module)] = (a, b)
    return out


def _drop_batch_dim(array: Array) -> Array:
    array = np.asarray(array)
    return array[0] if array.ndim == 3 and array.shape[0] == 1 else array
