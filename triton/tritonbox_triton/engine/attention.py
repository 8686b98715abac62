"""The engine's attention, called so that a row's result does not depend on its batch neighbours.

The attention is the compiled pass of attention_kernel.py where it is built and checks out, a
decode step's (one query per head and row) and a prompt's (causal), sliding windows and soft caps
included: each row over its own keys only, in float32, rounded once, so a row's bits are its own
by construction. `load_model` attaches it to the model's attention layers, so the engine's step
and prefill and the model's forward (adapter batches) all run it.

Elsewhere (no AVX-512, no compiler, float32) it is PyTorch's fused attention, whose sums over a
row's keys move with the columns it is given (the softmax's vector tail and the blocking of the
values product), so a batched row could drift from its answer alone. They do not move when the
padding comes after the row's keys in whole blocks of columns (bfloat16: multiples of 16,
measured 1,345 of 1,345; float32: of 512). So there a row's attention is *defined* over its keys
right-padded to a multiple of `padding_block` columns, alone or in a batch, checked once per
dtype and shape on random rows at start; where no block holds it runs in float64. A prompt's
prefill is causal, unpadded or right-padded; windows and caps there are windowed.py's.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel
from transformers import AutoModelForCausalLM as Auto
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from . import fused_ops, packed_layer, windowed
from .attention_kernel import AttentionKernel, DecodeRows, attention_kernel

log = logging.getLogger(__name__)

ATTENTION = "tritonbox_padded"
KERNEL = "tritonbox_attention_kernel"  # the attention layer's attribute holding the kernel
BLOCKS = (16, 512)  # tried in this order; 512 is the fused kernel's block of keys
_CHECK_SEED = 20261126


def _round_up(columns: int, block: int) -> int:
    return -(-columns // block) * block


def padding_bias(valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`valid` (bool [rows, columns], True on a row's keys) as the additive mask the attention
    takes: 0 there, -inf elsewhere. Made once per step: a boolean mask is converted inside
    every layer's call (a sixth of the attention's time at 16 rows)."""
    return torch.zeros(valid.shape, dtype=dtype).masked_fill_(~valid, float("-inf"))


def _fused(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
           bias: torch.Tensor, scaling: float) -> torch.Tensor:  # fmt: skip
    out: torch.Tensor = F.scaled_dot_product_attention(
        query, keys, values, attn_mask=bias[:, None, None, :], scale=scaling
    )
    return out


def _keeps_bits(dtype: torch.dtype, kv_heads: int, groups: int, dim: int, block: int) -> bool:
    """Whether rows right-padded by whole `block`s give each row the bits it has alone (as twin
    rows, as the reference runs), tried on random rows of lengths up to 1,100."""
    generator = torch.Generator().manual_seed(_CHECK_SEED + block)
    for trial in range(10):
        rows = 2 + trial % 6
        lengths = torch.randint(1, 1100, (rows,), generator=generator)
        width = _round_up(int(lengths.max()), block) + block * (trial % 2)
        keys = torch.randn(rows, kv_heads, width, dim, generator=generator).to(dtype)
        values = torch.randn(rows, kv_heads, width, dim, generator=generator).to(dtype)
        query = torch.randn(rows, kv_heads, groups, dim, generator=generator).to(dtype)
        bias = padding_bias(torch.arange(width)[None, :] < lengths[:, None], dtype)
        batched = _fused(query, keys, values, bias, dim**-0.5)
        for row in range(rows):
            own = _round_up(int(lengths[row]), block)
            twins = [t[row : row + 1].expand(2, *t.shape[1:]) for t in (query, keys, values)]
            alone = _fused(twins[0], twins[1][:, :, :own], twins[2][:, :, :own],
                           bias[row : row + 1, :own].expand(2, -1), dim**-0.5)  # fmt: skip
            if not torch.equal(alone[0], batched[row]):
                return False
    return True


@functools.cache
def padding_block(dtype: torch.dtype, kv_heads: int, groups: int, dim: int) -> int | None:
    """The columns a row's keys are right-padded to a multiple of for the fused attention to
    give it the same bits in any batch, or None: attention in float64 (the module's text)."""
    with torch.inference_mode():
        block = next((b for b in BLOCKS if _keeps_bits(dtype, kv_heads, groups, dim, b)), None)
    log.info(
        "attention: %s",
        f"fused, keys padded to {block} columns" if block else "float64 (no padding kept bits)",
    )
    return block


def decode_width(columns: int, query_dtype: torch.dtype, kv_heads: int, groups: int,
                 dim: int) -> int:  # fmt: skip
    """The columns a decode step attends over when its longest row has `columns` keys."""
    return _round_up(columns, padding_block(query_dtype, kv_heads, groups, dim) or 1)


def _padded_attention(
    query: torch.Tensor,  # [rows, kv heads, groups, dim]: a row's heads by the kv head they read
    keys: torch.Tensor,  # [rows, kv heads, columns, dim], each row's keys from column 0
    values: torch.Tensor,
    bias: torch.Tensor,  # [rows, columns], the query's dtype: `padding_bias`
    scaling: float,
) -> torch.Tensor:
    """PyTorch's attention over `decode_width` columns: [rows, kv heads, groups, dim]."""
    _, kv_heads, groups, dim = query.shape
    if padding_block(query.dtype, kv_heads, groups, dim) is not None:
        return _fused(query, keys, values, bias, scaling)
    scores = torch.matmul(query.double(), keys.double().transpose(-1, -2)) * scaling
    scores = scores + bias.double()[:, None, None, :]
    return torch.matmul(scores.softmax(-1), values.double()).to(query.dtype)


class DecodeAttention:
    """A decode step's attention, one query per head and row, for rows whose keys start at
    column 0: `valid` (bool [rows, columns]) marks each row's keys, a prefix of its columns."""

    def __init__(self, valid: torch.Tensor, dtype: torch.dtype, kernel: AttentionKernel | None):
        self._kernel = kernel
        if kernel is not None:
            lengths = valid.sum(1)
            if not torch.equal(valid, torch.arange(valid.shape[1]) < lengths[:, None]):
                raise ValueError("a decode row attends its keys from column 0, unpadded before")
            self._rows = DecodeRows(lengths)
        else:  # made once per step: a boolean mask is converted inside every layer's call
            self._bias = padding_bias(valid, dtype)

    def __call__(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                 scaling: float, window: int | None = None,
                 softcap: float | None = None) -> torch.Tensor:  # fmt: skip
        """`query` [rows, kv heads, groups, dim] (a row's heads by the kv head they read) over
        `keys`/`values` [rows, kv heads, columns, dim]: [rows, heads × dim]. A window or a cap
        with the compiled kernel only (else windowed.py attends)."""
        if self._kernel is not None:
            return self._kernel.decode(query, keys, values, self._rows, scaling,
                                       window=window, softcap=softcap)  # fmt: skip
        if window is not None or softcap is not None:
            raise ValueError("PyTorch's decode attention takes no window or cap: windowed.py")
        return _padded_attention(query, keys, values, self._bias, scaling).flatten(1)


def prefill_attention(
    query: torch.Tensor,  # [rows, heads, length, dim]
    key: torch.Tensor,  # [rows, kv heads, length, dim]
    value: torch.Tensor,
    scaling: float,
    kernel: AttentionKernel | None = None,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Causal attention over prompts, unpadded or right-padded: [rows, length, heads × dim].
    A window or a cap with the compiled `kernel` only (else windowed.py attends)."""
    rows, heads, length, dim = query.shape
    if kernel is not None:
        return kernel.causal(query, key, value, scaling, window=window, softcap=softcap)
    if window is not None or softcap is not None:
        raise ValueError("PyTorch's prefill attention takes no window or cap: windowed.py")
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    if padding_block(query.dtype, kv_heads, groups, dim) is not None:
        out = F.scaled_dot_product_attention(
            query, key, value, is_causal=True, scale=scaling, enable_gqa=True
        )
    else:  # float64: query rows ordered (group, position), each group over its kv head's keys
        grouped = query.reshape(rows, kv_heads, groups * length, dim).double()
        scores = torch.matmul(grouped, key.double().transpose(-1, -2)) * scaling
        causal = torch.ones(length, length, dtype=torch.bool).tril().repeat(groups, 1)
        scores = scores.masked_fill(~causal, float("-inf"))
        attended = torch.matmul(scores.softmax(-1), value.double())
        out = attended.reshape(rows, heads, length, dim).to(query.dtype)
    return out.transpose(1, 2).reshape(rows, length, heads * dim)


def engine_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [batch, heads, queries, head_dim]
    key: torch.Tensor,  # [batch, kv_heads, keys, head_dim]
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,  # bool [batch, 1, queries, keys]; True = attend
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface over the functions above: the model's forward (adapter
    batches, the tests' reference) computes what the engine's step does."""
    batch, heads, queries, dim = query.shape
    kv_heads, columns = key.shape[1], key.shape[2]
    scale = dim**-0.5 if scaling is None else scaling
    kernel = getattr(module, KERNEL, None)
    window, softcap = kwargs.get("sliding_window"), kwargs.get("softcap")
    if kernel is None and windowed.needs_explicit(window, columns, softcap):
        return windowed.forward(query, key, value, attention_mask, scale, window, softcap), None
    if kernel is None:  # PyTorch's attentions: within the window and uncapped, as checked
        window = softcap = None
    if queries > 1:  # a sliding layer's mask is its window's, which the kernel applies
        if attention_mask is not None and window is None:
            raise ValueError("a prompt is prefilled unpadded or right-padded, without a mask")
        output = prefill_attention(query, key, value, scale, kernel, window, softcap)
    else:
        valid = (
            torch.ones(batch, columns, dtype=torch.bool)
            if attention_mask is None
            else attention_mask[:, 0, 0, :]
        )
        width = decode_width(columns, query.dtype, kv_heads, heads // kv_heads, dim)
        if width != columns:  # the reference's own keys, padded as a batch pads them
            pad = (0, 0, 0, width - columns)
            key, value = F.pad(key, pad), F.pad(value, pad)
            valid = F.pad(valid, (0, width - columns), value=False)
        grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)
        attention = DecodeAttention(valid, query.dtype, kernel)
        output = attention(grouped, key, value, scale, window, softcap)
    return output.reshape(batch, queries, heads, dim), None


AttentionInterface.register(ATTENTION, engine_attention)
# No mask where attention is only causal (a prompt, or a decode step without padding).
AttentionMaskInterface.register(ATTENTION, functools.partial(sdpa_mask, allow_is_causal_skip=True))


def load_model(
    model_dir: Path | str, dtype: torch.dtype, kernel_dir: Path | None = None
) -> PreTrainedModel:
    """The checkpoint as the engine runs it: `dtype` weights, this attention (compiled into
    `kernel_dir` where it checks out), its products (packed_layer.attach_products), eval mode."""
    model = Auto.from_pretrained(model_dir, dtype=dtype, attn_implementation=ATTENTION).eval()
    heads, kv_heads = model.config.num_attention_heads, model.config.num_key_value_heads
    dim = getattr(model.config, "head_dim", None) or model.config.hidden_size // heads
    ops = fused_ops.load(kernel_dir)
    kernel = attention_kernel(ops, dtype, kv_heads, heads // kv_heads, dim)
    packed_layer.attach_products(model, None if ops is None else ops.library, kernel_dir)
    for module in model.modules():
        if type(module).__name__.endswith("Attention"):
            setattr(module, KERNEL, kernel)
    return model


def model_kernel(model: PreTrainedModel) -> AttentionKernel | None:
    """The compiled attention `load_model` gave this model's attention layers, if any."""
    layers = [module for module in model.modules() if hasattr(module, KERNEL)]
    return getattr(layers[0], KERNEL) if layers else None
