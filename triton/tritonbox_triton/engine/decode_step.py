"""The decode step (one new token per row) of a model of a known family (family.py: Llama,
Mistral, Qwen2/3, Gemma 2/3), written out over prepacked weights: the eager model's logits, bit
for bit where fused_ops.py's checks hold, in about half its time.

transformers' forward costs twice what its arithmetic does on a small model: each `F.linear` on a
bfloat16 weight reorders that weight for oneDNN on every call, and the forward wraps a few
thousand small operations in cache, mask and hook bookkeeping (docs/cpu-engine-history.md has the
profile). Here every projection's weight is reordered once, at start, into oneDNN's blocked
layout (`mkldnn._reorder_linear_weight`), and a step is the layer arithmetic and nothing else,
over the engine's KV buffers (kv_batch.py).

The engine promises the output of `generate()` on the eager model, so every operation is the
one transformers runs, in its order and dtype: the same RMSNorm, RoPE, SiLU·up and residual
additions, and the same attention (attention.py). A prepacked projection is oneDNN's same
kernel on the same weight (checked bit for bit in tests/triton/engine, at every batch size the
engine runs). Only bfloat16 weights are prepacked: float32 `F.linear` goes through MKL, whose
sums oneDNN would round differently, so a float32 engine keeps `F.linear`.

The elementwise stages between the products (step_stages.py: norms, the MLP's activation, RoPE
with the q/k norms and cache writes) run as one compiled pass each where fused_ops.py's kernels
apply (bfloat16; Gemma's norms: fused_gemma.py; q/k norms with RoPE: fused_qk_norm.py) and
check out bit for bit, else as PyTorch's operations.
Sliding windows and soft-capped scores go through the compiled attention where it is built,
else as windowed.py computes them. The logits are float32 (float_logits.py).

Batches with LoRA adapters take the model's forward (lora_layers.py wraps its projections).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from . import windowed
from .attention import DecodeAttention, model_kernel, prefill_attention
from .chunk_stages import ChunkStages, last_rows
from .family import unsupported
from .filling import KVLayout, PromptChunk
from .fused_ops import FusedOps
from .kv_batch import Layers
from .packed_layer import PackedLayer
from .prefill import own_layers, right_padded

__all__ = ["DecodeStep", "unsupported"]


class DecodeStep(ChunkStages):
    """One decode step over the engine's KV buffers.

    `ids` [rows]; `positions` [rows], each row's length so far, where its new key is written;
    `valid` bool [rows, width], the columns each row attends (kv_batch.decode_inputs);
    `keys`/`values` [layers, row capacity, kv heads, column capacity, head_dim], each row's
    keys from column 0, in the model's dtype. Returns the logits [rows, vocab] in float32.
    """

    def __init__(self, model: Any, fused: FusedOps | None = None) -> None:
        super().__init__(model, fused)
        self._lm_head = model.lm_head  # float32 logits (float_logits.py)
        self._agrees: dict[tuple[int, int, int], bool] = {}  # (rows, copies, threads) -> exact
        self._attention_kernel = model_kernel(model)  # also the model forward's (attention.py)

    def describe(self) -> str:
        """The start-up log line's words for how the step runs its attention and elementwise
        stages."""
        attention = "compiled" if self._attention_kernel else "PyTorch's"
        own = ", own products in their order" if self.layers[0].own_products else ""
        products = ", AMX products" if self.layers[0].amx else own
        head = f"{self.family.name} layers{products}, {attention} decode attention"
        stages = self.fused_stages()
        if self._ops is None or not stages:
            return f"{head}, elementwise stages as PyTorch's operations"
        return (f"{head}, fused elementwise stages: {', '.join(stages)} ({self._ops.built}; "
                f"ATen sums {self._ops.lanes} wide)")  # fmt: skip

    def kv_layout(self) -> KVLayout:
        """Layers, kv heads, head dim and dtype of the model's keys and values (filling.py)."""
        return len(self.layers), self.kv_heads, self.head_dim, self._embed.dtype

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self._lm_head(x)
        cap = self.family.logits_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    @property
    def fills_exact(self) -> bool:
        """Whether a prompt prefilled in chunks (beside running streams, or after a cached
        prefix: filling.py) gets its one pass's bits. A chunk attends through the compiled
        attention, alike, or else through windowed.py in float32, whose result a float32
        engine keeps within 1e-4 of PyTorch's attention but a bfloat16 one rounds otherwise
        (seen on an AVX2 CPU: logits up to 0.1 apart). There prompts are prefilled whole."""
        return self._attention_kernel is not None or self._embed.dtype == torch.float32

    def exact_for(self, prompt_tokens: int) -> bool:
        """Whether `prefill` of a prompt's twin rows is the model forward's bit for bit: its
        products of 2 × `prompt_tokens` rows round as the plain ones do (checked once per row
        count; always with AMX products). The rest of the pass is the forward's
        own arithmetic, and the next-token product has 2 rows, where the kernels agree."""
        return self._agrees_with_twins(2 * prompt_tokens, copies=1)

    def lone_exact_for(self, prompt_tokens: int) -> bool:
        """Whether `prefill` of a lone prompt, once, is the model forward's over its twin rows
        bit for bit: the prepacked products of `prompt_tokens` rows round as the plain ones of
        twice as many rows (checked once per length; always with AMX products). Everything
        else in a pass is the same
        arithmetic per row, and the next-token product runs on two copies of the last row.
        Half the work of the twin pass."""
        return self._agrees_with_twins(prompt_tokens, copies=2)

    def _agrees_with_twins(self, rows: int, copies: int) -> bool:
        if self.layers[0].own_products:
            return True  # the model's products are the step's, a row's bits its own
        if copies > 1 and self._embed.dtype != torch.bfloat16:
            # A lone float32 pass: its products' check said yes on an AVX2 CPU at every length
            # from 16 tokens, where the pass's bits differed from the twins' (the twin pass kept
            # them at every length tried). So float32 prefills a lone prompt as twins.
            return False
        key = (rows, copies, torch.get_num_threads())  # the kernels split their sums by threads
        if key not in self._agrees:
            self._agrees[key] = self.layers[0].agrees_with_plain(rows, copies)
        return self._agrees[key]

    @torch.inference_mode()
    def __call__(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        valid: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        chunks: Sequence[PromptChunk] = (),
    ) -> torch.Tensor:
        """With `chunks`, pieces of prompts ride along (chunked prefill, filling.py): their
        tokens go through the same products after the rows' (the weights are read once for
        all), each chunk's keys and values into its prompt's buffers; for each chunk that ends
        its prompt, in their order, the result has one more row: the logits of the prompt's
        last position."""
        rows, width = ids.shape[0], valid.shape[1]
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        last = int(positions.max())
        if rows > keys.shape[1] or last >= keys.shape[3]:  # the fused writes do not check
            raise ValueError(f"{rows} rows to column {last}: past the cache {tuple(keys.shape)}")
        self._rope_table(last + 1)
        attention = DecodeAttention(valid, self._embed.dtype, self._attention_kernel)
        longest, softcap = last + 1, self.family.attention_softcap
        masks: dict[int | None, torch.Tensor] = {}  # per window, where windowed.py attends
        write = self.row_writer(positions, keys)

        def attend(index: int, layer: PackedLayer, qkv: torch.Tensor) -> torch.Tensor:
            layer_keys = keys[index, :rows, :, :width]
            layer_values = values[index, :rows, :, :width]
            query = write(qkv[:rows], keys[index], values[index], index)
            window = self.family.windows[index]
            if self._attention_kernel is not None:
                grouped = query.reshape(rows, kv_heads, heads // kv_heads, dim)
                attended = attention(grouped, layer_keys, layer_values, layer.scaling,
                                     window, softcap)  # fmt: skip
            elif windowed.needs_explicit(window, longest, softcap):
                if window not in masks:
                    masks[window] = windowed.decode_allowed(valid, window)
                attended = windowed.attend(
                    query.reshape(rows, heads, 1, dim),
                    layer_keys,
                    layer_values,
                    masks[window],
                    layer.scaling,
                    softcap,
                )
                attended = attended.reshape(rows, heads * dim)  # fmt: skip
            else:
                grouped = query.reshape(rows, kv_heads, heads // kv_heads, dim)
                attended = attention(grouped, layer_keys, layer_values, layer.scaling)
            if not chunks:
                return attended
            return torch.cat([attended, *self.chunks_attention(qkv[rows:], chunks, index)])

        if not chunks:
            return self._logits(self._layers(ids, attend))
        self._rope_table(max(chunk.end for chunk in chunks))
        x = self._layers(torch.cat([ids, *(chunk.ids for chunk in chunks)]), attend)
        return self._logits(torch.cat([x[:rows], x[[rows + row for row in last_rows(chunks)]]]))

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]]) -> tuple[torch.Tensor, list[Layers]]:
        """One pass over these prompts (right-padded to the longest, prefill.py says why that
        is safe): each one's next-token logits [rows, vocab] and its own keys and values per
        layer ([1, kv heads, length, head_dim]). The model forward's arithmetic over the
        prepacked weights, as `__call__` is for a decode step. generate()'s reference runs a
        lone prompt as twin rows and must be met bit for bit, while prepacked and plain
        products of more than 32 rows round differently at some row counts: so a lone prompt
        comes here once where `lone_exact_for` its length, as twins where `exact_for`, and
        else goes through the model's forward (scheduler.py)."""
        ids, ends = right_padded(prompts)
        rows, length = ids.shape
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        softcap = self.family.attention_softcap
        self._rope_table(length)
        hidden, x = self.add_norm(self.embedding(ids), None, self.layers[0].input_norm)
        cached: Layers = []
        for index, (layer, norm) in enumerate(zip(self.layers, self.next_norms(), strict=True)):
            qkv = layer.qkv(x)
            qk = self.prefill_rope(qkv, rows, length, index)
            query = qk[:, :, :heads].transpose(1, 2)  # [rows, heads, length, dim]
            key = qk[:, :, heads:].transpose(1, 2)
            value = qkv[..., layer.qk_width :].view(rows, length, kv_heads, dim).transpose(1, 2)
            cached.append((key, value))
            window = self.family.windows[index]
            kernel = self._attention_kernel
            if kernel is not None:
                attended = prefill_attention(query, key, value, layer.scaling, kernel, window,
                                             softcap)  # fmt: skip
            elif windowed.needs_explicit(window, length, softcap):
                allowed = windowed.causal_allowed(length, window)
                attended = windowed.attend(query, key, value, allowed, layer.scaling, softcap)
                attended = attended.transpose(1, 2).reshape(rows, length, heads * dim)
            else:
                attended = _own_attention(query, key, value, layer.scaling, ends + 1)
            hidden, x = self.after_attention(layer, hidden, attended, norm)
        last = x[torch.arange(rows), ends]  # the final norm is per position
        return self._logits(last), own_layers(cached, prompts)


def _own_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float,
                   lengths: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """PyTorch's causal attention for each right-padded prompt over its own length, as twins
    (the reference generate()'s lone prompt): its fused kernel picks its path by batch size,
    length and threads, so a prompt attended beside longer ones would round otherwise (seen in
    bfloat16 on an AVX2 CPU: a burst's shared pass answered one token differently). The
    compiled attention gives a row its own bits in any batch. Padded positions are left zero:
    nothing reads them. [rows, longest, heads × dim]."""
    rows, heads, longest, dim = query.shape

    def twins(row: int, length: int) -> torch.Tensor:
        q, k, v = (t[row : row + 1, :, :length].expand(2, -1, -1, -1) for t in (query, key, value))
        return prefill_attention(q, k, v, scaling)[0]

    if rows == 1:
        return twins(0, longest)[None]
    out = query.new_zeros(rows, longest, heads * dim)
    for row, length in enumerate(lengths.tolist()):
        out[row, :length] = twins(row, length)
    return out
