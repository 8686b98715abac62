"""The engine's attention: softmax(q·kᵀ)·v computed in float64, so a row's result does not depend
on its batch neighbours.

A decode batch left-pads its rows to one length and masks the padding. PyTorch's fused CPU
attention then sums a row's scores in another order than it would for that row alone (the padding
shifts which vector lane each key falls in), and in bfloat16 those last-bit differences survive
the rounding of every layer's output: a batched request drifted from its answer alone within 20
tokens. In float64 the order's effect is ~1e-16, far below the rounding to bfloat16 or float32
that follows, so a row's output is the same alone or in any batch (tests/triton/engine). It costs
about 0.4 ms per layer for 16 rows of 200 tokens on 2 cores, against 0.2 ms fused.

The model is loaded with this attention by `load_model`; tests compare the engine with
`generate()` of a model loaded the same way.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch
from transformers import AttentionInterface, AutoModelForCausalLM, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTENTION = "tritonbox_float64"


def float64_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [batch, heads, queries, head_dim]
    key: torch.Tensor,  # [batch, kv_heads, keys, head_dim]
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,  # bool [batch, 1, queries, keys]; True = attend
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    batch, heads, queries, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads  # grouped-query attention: head i reads kv head i // groups
    scale = dim**-0.5 if scaling is None else scaling
    grouped = query.reshape(batch, kv_heads, groups * queries, dim).double()
    scores = torch.matmul(grouped, key.double().transpose(-1, -2)) * scale
    if attention_mask is None and queries > 1:
        # transformers leaves out a mask that would only be causal: query i of the last
        # `queries` positions sees the keys up to its own.
        keys = key.shape[2]
        attention_mask = torch.ones(queries, keys, dtype=torch.bool).tril(keys - queries)
    if attention_mask is not None:
        mask = attention_mask.reshape(-1, 1, 1, queries, attention_mask.shape[-1])
        mask = mask.expand(-1, -1, groups, -1, -1).reshape(mask.shape[0], 1, groups * queries, -1)
        scores = scores.masked_fill(~mask, float("-inf"))
    output = torch.matmul(scores.softmax(dim=-1), value.double())
    output = output.reshape(batch, heads, queries, dim).transpose(1, 2).contiguous()
    return output.to(query.dtype), None


AttentionInterface.register(ATTENTION, float64_attention)
# A boolean mask, as the fused path gets (True = attend).
AttentionMaskInterface.register(ATTENTION, functools.partial(sdpa_mask, allow_is_causal_skip=False))


def load_model(model_dir: Path | str, dtype: torch.dtype) -> PreTrainedModel:
    """The checkpoint as the engine runs it: `dtype` weights, float64 attention, eval mode."""
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=dtype, attn_implementation=ATTENTION
    )
    model.eval()
    return model
