"""Small models of each family the engine writes out (engine/family.py), built here from the
family's transformers config with random weights: no hub. Windows are short (8 keys) so that a
test's prompts run past them, and the weights larger than the default init so that a random
model's logits have clear winners (its greedy choice is then a fair check of the arithmetic)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM

WINDOW = 8
SHAPE = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "initializer_range": 0.2,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "tie_word_embeddings": True,
}
LAYERS = ["sliding_attention", "full_attention"] * 2
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {"sliding_window": WINDOW},
    "qwen2": {"use_sliding_window": True, "sliding_window": WINDOW, "layer_types": LAYERS,
              "max_window_layers": 0},
    "qwen3": {},
    "gemma2": {"sliding_window": WINDOW, "layer_types": LAYERS, "query_pre_attn_scalar": 16,
               "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
               "hidden_activation": "gelu_pytorch_tanh"},
    "gemma3_text": {"sliding_window": WINDOW, "layer_types": LAYERS, "query_pre_attn_scalar": 16,
                    "hidden_activation": "gelu_pytorch_tanh"},
}  # fmt: skip


def build(family: str, directory: Path, seed: int = 0) -> Path:
    """A checkpoint of `family` in `directory` (float32 safetensors and config)."""
    config = AutoConfig.for_model(family, **SHAPE, **FAMILIES[family])
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # Gemma's norms are 1 + w: centred on 0 by its init, moved a little
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.normal_(0.0 if family.startswith("gemma") else 1.0, 0.1)
    model.save_pretrained(directory)
    return directory
