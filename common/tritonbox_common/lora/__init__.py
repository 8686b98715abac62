"""LoRA adapters: PEFT folders in, TensorRT-LLM 0.20's tensors out (numpy only, no torch)."""

from tritonbox_common.lora.peft import (
    LLAMA_MODULES,
    AdapterError,
    PeftAdapter,
    read_peft_adapter,
    task_id,
)
from tritonbox_common.lora.trtllm import (
    HF_TO_TRTLLM,
    MODULE_ID,
    from_lora_tensors,
    llama_module_dims,
    to_lora_tensors,
)

__all__ = [
    "HF_TO_TRTLLM",
    "LLAMA_MODULES",
    "MODULE_ID",
    "AdapterError",
    "PeftAdapter",
    "from_lora_tensors",
    "llama_module_dims",
    "read_peft_adapter",
    "task_id",
    "to_lora_tensors",
]
