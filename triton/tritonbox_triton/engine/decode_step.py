"""The decode step (one new token per row) of a Llama-shaped model, written out over prepacked
weights: the eager model's logits bit for bit, in about half its time.

transformers' forward costs twice what its arithmetic does on a small model: each `F.linear` on a
bfloat16 weight reorders that weight for oneDNN on every call, and the forward wraps a few
thousand small operations in cache, mask and hook bookkeeping (docs/cpu-engine.md has the
profile). Here every projection's weight is reordered once, at start, into oneDNN's blocked
layout (`mkldnn._reorder_linear_weight`), and a step is the layer arithmetic and nothing else,
over the engine's KV buffers (kv_batch.py).

The engine promises the output of `generate()` on the eager model, so every operation is the
one transformers runs, in its order and dtype: the same RMSNorm, RoPE, SiLU·up and residual
additions, and the same attention (attention.py). A prepacked projection is oneDNN's same
kernel on the same weight (checked bit for bit in tests/triton/engine, at every batch size the
engine runs). Only bfloat16 weights are prepacked: float32 `F.linear` goes through MKL, whose
sums oneDNN would round differently, so a float32 engine keeps `F.linear`.

The elementwise stages between the products (a residual addition with the norm after it; RoPE
with the cache writes; SiLU(gate) · up) run as one compiled pass each where fused_ops.py's
kernels are built and check out bit for bit, else as PyTorch's operations.

Batches with LoRA adapters take the model's forward (lora_layers.py wraps its projections).

Longer than 250 lines because the decode step and the prefill are the same layer arithmetic
written twice (one row's token against a prompt's), each stage fused or as PyTorch's operations:
kept side by side, a change to one is seen beside the other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .attention import DecodeAttention, model_kernel, prefill_attention
from .fused_ops import FusedOps, rms_norm, rotary, swiglu
from .kv_batch import Layers
from .packed_layer import PackedLayer
from .prefill import own_layers, right_padded

log = logging.getLogger(__name__)
# (qkv, a layer's keys, its values) -> the rows' queries: DecodeStep._row_writer
RowWriter = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def unsupported(model: Any) -> str | None:
    """Why this model's decode step cannot be written out here, or None when it can."""
    config = model.config
    if config.model_type != "llama":
        return f"model_type {config.model_type!r} (only llama)"
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        return "biased projections"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r}"
    if getattr(config, "rope_scaling", None) and config.rope_scaling.get("rope_type") not in (
        None,
        "default",
    ):
        return f"rope_scaling {config.rope_scaling!r}"
    return None


class DecodeStep:
    """One decode step over the engine's KV buffers.

    `ids` [rows]; `positions` [rows], each row's length so far, where its new key is written;
    `valid` bool [rows, width], the columns each row attends (kv_batch.decode_inputs);
    `keys`/`values` [layers, row capacity, kv heads, column capacity, head_dim], each row's
    keys from column 0, in the model's dtype. Returns the logits [rows, vocab] in float32.
    """

    def __init__(self, model: Any, fused: FusedOps | None = None) -> None:
        config = model.config
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = float(config.rms_norm_eps)
        decoder = model.model
        self._layers = [PackedLayer(layer) for layer in decoder.layers]
        self._embed = decoder.embed_tokens.weight
        self._norm = decoder.norm.weight
        self._lm_head = model.lm_head  # float32 logits (float_logits.py)
        self._agrees: dict[tuple[int, int, int], bool] = {}  # (rows, copies, threads) -> exact
        self._rotary_emb = decoder.rotary_emb
        self._cos = self._sin = torch.zeros(0, self.head_dim)  # [positions, head_dim]
        self._rope_table(config.max_position_embeddings)
        self._fused = fused if fused is not None and self._fused_agrees(fused) else None
        self._fused_silu = self._fused is not None and self._silu_agrees(self._fused)
        self._attention_kernel = model_kernel(model)  # also the model forward's (attention.py)

    def _fused_agrees(self, fused: FusedOps) -> bool:
        if self._embed.dtype != torch.bfloat16:
            log.info("fused ops: bfloat16 only; the %s step runs PyTorch's operations",
                     self._embed.dtype)  # fmt: skip
            return False
        tables = self._cos[:256], self._sin[:256]
        if not fused.agrees(self._norm, self.eps, self.heads, self.kv_heads, *tables):
            log.warning("fused ops: not PyTorch's bits here; the step runs PyTorch's operations")
            return False
        return True

    def _silu_agrees(self, fused: FusedOps) -> bool:
        if not fused.silu_agrees(self._layers[0].intermediate):
            log.warning("fused ops: SiLU·up not PyTorch's bits here; it runs PyTorch's")
            return False
        return True

    def describe(self) -> str:
        """The start-up log line's words for how the step runs its attention and elementwise
        stages."""
        attention = "compiled" if self._attention_kernel else "PyTorch's"
        if self._fused is None:
            return f"{attention} decode attention, elementwise stages as PyTorch's operations"
        silu = "SiLU·up fused" if self._fused_silu else "SiLU·up as PyTorch's"
        return (f"{attention} decode attention, fused elementwise stages ({self._fused.built}; "
                f"ATen sums {self._fused.lanes} wide; {silu})")  # fmt: skip

    def _swiglu(self, layer: PackedLayer, x: torch.Tensor) -> torch.Tensor:
        """The MLP's SiLU(gate) · up, from one product of both (sliced: `chunk` costs more)."""
        gate_up = layer.gate_up(x)
        if self._fused_silu:
            assert self._fused is not None
            return self._fused.silu_mul(gate_up, layer.intermediate)
        return swiglu(gate_up, layer.intermediate)

    def exact_for(self, prompt_tokens: int) -> bool:
        """Whether `prefill` of a prompt's twin rows is the model forward's bit for bit: its
        products of 2 × `prompt_tokens` rows round as the plain ones do (checked once per row
        count; on the AMX machine up to about 64 tokens). The rest of the pass is the forward's
        own arithmetic, and the next-token product has 2 rows, where the kernels agree."""
        return self._agrees_with_twins(2 * prompt_tokens, copies=1)

    def lone_exact_for(self, prompt_tokens: int) -> bool:
        """Whether `prefill` of a lone prompt, once, is the model forward's over its twin rows
        bit for bit: the prepacked products of `prompt_tokens` rows round as the plain ones of
        twice as many rows (checked once per length). Everything else in a pass is the same
        arithmetic per row, and the next-token product runs on two copies of the last row.
        Half the work of the twin pass."""
        return self._agrees_with_twins(prompt_tokens, copies=2)

    def _agrees_with_twins(self, rows: int, copies: int) -> bool:
        key = (rows, copies, torch.get_num_threads())  # the kernels split their sums by threads
        if key not in self._agrees:
            self._agrees[key] = self._layers[0].agrees_with_plain(rows, copies)
        return self._agrees[key]

    def _rope_table(self, positions: int) -> None:
        """RoPE's cos and sin at every position below `positions` (at least), from the model's
        own rotary embedding: each value is one product and one cos or sin of it, the same
        whichever positions share the call, and a lookup costs a step less than the call (tested
        bit for bit with the step). Past the model's trained length the table doubles, as the
        call would have gone on."""
        if positions <= self._cos.shape[0]:
            return
        size = max(positions, 2 * self._cos.shape[0])
        cos, sin = self._rotary_emb(self._embed[:1], torch.arange(size)[None])
        self._cos, self._sin = cos[0].contiguous(), sin[0].contiguous()

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [rows, 1, head_dim] at each row's position, as the model's forward has them."""
        self._rope_table(int(positions.max()) + 1)
        return self._cos[positions, None, :], self._sin[positions, None, :]

    def _add_norm(
        self,
        hidden: torch.Tensor,
        delta: torch.Tensor | None,
        weight: torch.Tensor,
        out: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream plus `delta` (unless None), and its RMSNorm by `weight` (fused:
        into `out` when given, a buffer the step reuses once the norm's last reader is done)."""
        if self._fused is not None:  # `hidden` added to in place: the caller's own tensor
            return hidden, self._fused.add_rms_norm(hidden, delta, weight, self.eps, out)
        if delta is not None:
            hidden = hidden + delta
        return hidden, rms_norm(hidden, weight, self.eps)

    def _norms(self) -> list[torch.Tensor]:
        """Each layer's input norm after the first, then the final norm: the norm that follows
        each layer's residual stream."""
        return [layer.input_norm for layer in self._layers[1:]] + [self._norm]

    @torch.inference_mode()
    def __call__(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        valid: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
    ) -> torch.Tensor:
        rows, width = ids.shape[0], valid.shape[1]
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        last = int(positions.max())
        if rows > keys.shape[1] or last >= keys.shape[3]:  # the fused writes do not check
            raise ValueError(f"{rows} rows to column {last}: past the cache {tuple(keys.shape)}")
        self._rope_table(last + 1)
        attention = DecodeAttention(valid, self._embed.dtype, self._attention_kernel)
        write = self._row_writer(positions, keys)
        hidden = F.embedding(ids, self._embed)
        normed = torch.empty_like(hidden)  # each norm's output, read by the product after it
        hidden, x = self._add_norm(hidden, None, self._layers[0].input_norm, normed)
        for index, (layer, norm) in enumerate(zip(self._layers, self._norms(), strict=True)):
            layer_keys, layer_values = keys[index], values[index]
            query = write(layer.qkv(x), layer_keys, layer_values)
            attended = attention(
                query.reshape(rows, kv_heads, heads // kv_heads, dim),
                layer_keys[:rows, :, :width],
                layer_values[:rows, :, :width],
                layer.scaling,
            )
            hidden, x = self._add_norm(hidden, layer.o(attended), layer.post_norm, normed)
            hidden, x = self._add_norm(hidden, layer.down(self._swiglu(layer, x)), norm, normed)
        return self._lm_head(x)

    def _row_writer(self, positions: torch.Tensor, keys: torch.Tensor) -> RowWriter:
        """RoPE on a decode step's rows and their cache writes, per layer: (qkv, the layer's
        keys, its values) ↦ the rows' queries. One pass where fused, else PyTorch's operations."""
        rows, heads, kv_heads, dim = positions.shape[0], self.heads, self.kv_heads, self.head_dim
        fused = self._fused
        if fused is not None:
            positions = positions.contiguous()
            # One buffer for every layer's queries: each layer's attention has read its own
            # before the next layer's RoPE writes.
            roped = torch.empty(rows, heads + kv_heads, dim, dtype=self._embed.dtype)

            def write_fused(qkv: torch.Tensor, layer_keys: torch.Tensor,
                            layer_values: torch.Tensor) -> torch.Tensor:  # fmt: skip
                qk = fused.rope(qkv, heads + kv_heads, self._cos, self._sin, positions,
                                (layer_keys, layer_values), roped)  # fmt: skip
                return qk[:, :heads]

            return write_fused
        # Where each row's new key and value go in a layer's buffer, viewed as [cells, dim]:
        # one index_copy_ each, cheaper than indexing rows and columns at once.
        heads_index = torch.arange(kv_heads)[None, :]
        rows_index = torch.arange(rows)[:, None]
        cells = (rows_index * kv_heads + heads_index) * keys.shape[3] + positions[:, None]
        cells = cells.reshape(-1)
        cos, sin = self.rotary(positions)

        def write(qkv: torch.Tensor, layer_keys: torch.Tensor,
                  layer_values: torch.Tensor) -> torch.Tensor:  # fmt: skip
            width = (heads + kv_heads) * dim
            # RoPE on the queries and keys at once: the same elementwise products.
            qk = rotary(qkv[:, :width].view(rows, heads + kv_heads, dim), cos, sin)
            value = qkv[:, width:].reshape(-1, dim)
            layer_keys.view(-1, dim).index_copy_(0, cells, qk[:, heads:].reshape(-1, dim))
            layer_values.view(-1, dim).index_copy_(0, cells, value)
            return qk[:, :heads]

        return write

    def _prefill_rope(self, qkv: torch.Tensor, rows: int, length: int) -> torch.Tensor:
        """RoPE on a prefill's queries and keys: [rows, length, heads + kv heads, dim]."""
        qk_heads, dim = self.heads + self.kv_heads, self.head_dim
        if self._fused is not None:
            positions = torch.arange(length).repeat(rows)
            flat = qkv.view(rows * length, -1)
            qk = self._fused.rope(flat, qk_heads, self._cos, self._sin, positions)
            return qk.view(rows, length, qk_heads, dim)
        cos, sin = self._cos[None, :length, None, :], self._sin[None, :length, None, :]
        return rotary(qkv[..., : qk_heads * dim].view(rows, length, qk_heads, dim), cos, sin)

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
        self._rope_table(length)
        hidden, x = self._add_norm(F.embedding(ids, self._embed), None, self._layers[0].input_norm)
        cached: Layers = []
        for layer, norm in zip(self._layers, self._norms(), strict=True):
            qkv = layer.qkv(x)
            qk = self._prefill_rope(qkv, rows, length)
            query = qk[:, :, :heads].transpose(1, 2)  # [rows, heads, length, dim]
            key = qk[:, :, heads:].transpose(1, 2)
            value = qkv[..., layer.qk_width :].view(rows, length, kv_heads, dim).transpose(1, 2)
            cached.append((key, value))
            # A lone prompt's attention runs on twins, as the reference's, where it is
            # PyTorch's: its fused kernel picks its path by batch size and threads (packed
            # products from 64 tokens on). The compiled one gives a row its own bits alone.
            q, k, v = (query, key, value)
            if rows == 1 and self._attention_kernel is None:
                q, k, v = (t.expand(2, -1, -1, -1) for t in (query, key, value))
            attended = prefill_attention(q, k, v, layer.scaling, self._attention_kernel)[:rows]
            hidden, x = self._add_norm(hidden, layer.o(attended), layer.post_norm)
            hidden, x = self._add_norm(hidden, layer.down(self._swiglu(layer, x)), norm)
        last = x[torch.arange(rows), ends]  # the final norm is per position
        return self._lm_head(last), own_layers(cached, prompts)
