"""What a TensorRT-LLM engine's build allows for LoRA adapters, from its `config.json`.

`trtllm-build --lora_plugin <dtype> --max_lora_rank N --lora_target_modules ...` (0.20) writes
`build_config.plugin_config.lora_plugin` (the dtype; null without the plugin) and
`build_config.lora_config` (`LoraConfig` of tensorrt_llm/lora_helper.py: `max_lora_rank`,
`lora_target_modules` in TensorRT-LLM's names, `trtllm_modules_to_hf_modules`). The api needs
the Hugging Face names (what PEFT's adapter_config.json lists) and the dtype of `lora_weights`:
the C++ runtime refuses weights of another dtype than the model's (loraUtils.cpp, "Expected lora
weights to be the same data type as base model").
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritonbox_triton.settings import TritonSettings

log = logging.getLogger(__name__)

# NVIDIA's default TensorRT-LLM -> HF module names (get_default_trtllm_modules_to_hf_modules in
# tensorrt_llm/lora_helper.py): used when the engine's lora_config carries no mapping. Note the
# Llama MLP: HF gate_proj is TensorRT-LLM's mlp_h_to_4h and HF up_proj is its mlp_gate.
DEFAULT_TRTLLM_TO_HF = {
    "attn_q": "q_proj",
    "attn_k": "k_proj",
    "attn_v": "v_proj",
    "attn_qkv": "qkv_proj",
    "attn_dense": "o_proj",
    "mlp_h_to_4h": "gate_proj",
    "mlp_4h_to_h": "down_proj",
    "mlp_gate": "up_proj",
    "mlp_gate_up": "gate_up_proj",
}
# Triton data types of `lora_weights` by the engine's pretrained_config.dtype. NVIDIA's template
# hard-codes TYPE_FP16 (right for float16 engines only); unknown = that default.
WEIGHTS_DATA_TYPE = {"float16": "TYPE_FP16", "bfloat16": "TYPE_BF16", "float32": "TYPE_FP32"}


@dataclass(frozen=True)
class EngineLora:
    """The engine's LoRA build: rank 0 = built without the LoRA plugin (no adapters)."""

    max_lora_rank: int
    hf_modules: tuple[str, ...]  # the HF names of the engine's lora_target_modules
    weights_data_type: str  # the Triton type `lora_weights` must have


def _section(config: dict[str, Any], key: str) -> dict[str, Any]:
    value = config.get(key)
    return value if isinstance(value, dict) else {}


def read_engine_lora(engine_dir: Path) -> EngineLora:
    """Parse `engine_dir/config.json` (the caller has checked it exists and is JSON)."""
    config = json.loads((engine_dir / "config.json").read_text())
    build = _section(config, "build_config")
    dtype = _section(config, "pretrained_config").get("dtype")
    data_type = WEIGHTS_DATA_TYPE.get(dtype if isinstance(dtype, str) else "", "TYPE_FP16")
    lora = _section(build, "lora_config")
    rank = lora.get("max_lora_rank")
    if _section(build, "plugin_config").get("lora_plugin") in (None, False, "disable"):
        return EngineLora(0, (), data_type)
    mapping = DEFAULT_TRTLLM_TO_HF | {
        str(key): str(value)
        for key, value in _section(lora, "trtllm_modules_to_hf_modules").items()
        if isinstance(value, str)
    }
    modules = lora.get("lora_target_modules") or []
    hf = tuple(mapping.get(str(name), str(name)) for name in modules)
    # Absent = trtllm-build's default (LoraConfig.max_lora_rank in lora_helper.py).
    return EngineLora(rank if isinstance(rank, int) else 64, hf, data_type)


def lora_values(settings: TritonSettings, engine_dir: Path) -> dict[str, str]:
    """The LoRA placeholders of the trtllm `tensorrt_llm` template."""
    engine = read_engine_lora(engine_dir)
    rank = min(settings.max_lora_rank, engine.max_lora_rank)
    if settings.max_lora_rank and not engine.max_lora_rank:
        # Not an error: MAX_LORA_RANK defaults to 64 and engines built before adapters existed
        # must keep serving; the api reads rank 0 as "no adapters".
        log.warning(
            "MAX_LORA_RANK=%d but the engine in %s was built without the LoRA plugin: adapters "
            "are off (rebuild with scripts/build_engine.py --max-lora-rank)",
            settings.max_lora_rank,
            engine_dir,
        )
    elif rank < settings.max_lora_rank:
        log.warning(
            "MAX_LORA_RANK=%d is above the engine's max_lora_rank %d: adapters up to rank %d",
            settings.max_lora_rank,
            engine.max_lora_rank,
            rank,
        )
    return {
        "lora_weights_data_type": engine.weights_data_type,
        "max_lora_rank": str(rank),
        "lora_target_modules": " ".join(engine.hf_modules) if rank else "",
        # The page size of NVIDIA's cache; above the largest adapter rank it only wastes memory.
        "lora_cache_max_adapter_size": str(max(rank, 1)),
        "lora_cache_optimal_adapter_size": str(
            max(min(settings.lora_cache_optimal_adapter_size, rank), 1)
        ),
        "lora_cache_gpu_memory_fraction": str(settings.lora_cache_gpu_memory_fraction),
        "lora_cache_host_memory_bytes": str(settings.lora_cache_host_memory_bytes),
    }
