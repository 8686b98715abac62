"""A small real GGUF written here: a random-weight Llama with the default model's tokenizer and
no chat template, as a GGUF from a hub often is (the Gemma 3 270M package's file has none)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tritonbox_triton.prepare_model import gguf_path

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 64, 2, 4, 2, 128


def _permute(weights: npt.NDArray[np.float32], heads: int) -> npt.NDArray[np.float32]:
    # llama.cpp stores q/k rows interleaved for its rope; transformers undoes this on load.
    rows = weights.shape[0]
    return weights.reshape(heads, 2, rows // heads // 2, -1).swapaxes(1, 2).reshape(weights.shape)


def tiny_llama(vocab_size: int) -> Any:
    """A random Llama (tied embeddings) small enough to write and prepare in seconds."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).eval()


def write_tiny_gguf(path: Path) -> Any:
    """Write the GGUF of `tiny_llama` to `path` (tokenizer from the default model's GGUF, its
    chat template left out); return the model it holds."""
    import gguf

    reader = gguf.GGUFReader(gguf_path())
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    model = tiny_llama(len(tokens))
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("tiny-random-llama")
    for name, field in reader.fields.items():
        if name.startswith("tokenizer.") and name != "tokenizer.chat_template":
            sub_type = field.types[1] if len(field.types) > 1 else None
            writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub_type)
    writer.add_context_length(512)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_layer_norm_rms_eps(model.config.rms_norm_eps)
    writer.add_rope_freq_base(10000.0)  # LlamaConfig's default rope_theta
    writer.add_vocab_size(len(tokens))

    weights = {name: value.numpy() for name, value in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", weights["model.norm.weight"])
    names = {
        "attn_norm": "input_layernorm",
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_norm": "post_attention_layernorm",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    for layer in range(LAYERS):
        for gguf_name, hf_name in names.items():
            value = weights[f"model.layers.{layer}.{hf_name}.weight"]
            if gguf_name in ("attn_q", "attn_k"):
                value = _permute(value, HEADS if gguf_name == "attn_q" else KV_HEADS)
            writer.add_tensor(f"blk.{layer}.{gguf_name}.weight", np.ascontiguousarray(value))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model
