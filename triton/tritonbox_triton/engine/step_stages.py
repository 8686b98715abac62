"""The stages of a layer between its products, for the written-out step (decode_step.py): the
norms, the MLP's activation, RoPE (from tables made once) with the q/k norms before it, and the
cache writes, each as the model's family computes it (family.py), and as one compiled pass
where fused_ops.py's kernels apply (fused_gemma.py's Gemma norms, fused_qk_norm.py's q/k norms
with RoPE) and check out bit for bit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from . import family as families
from .fused_gemma import GemmaNorm, gelu_tanh, gemma_norms, gemma_rms_norm
from .fused_ops import Activation, FusedOps, rms_norm, rotary
from .fused_qk_norm import Cache, normed_heads, qk_norm_rope
from .packed_layer import PackedLayer

log = logging.getLogger(__name__)
# (qkv, a layer's keys, its values, the layer's index) -> the rows' queries [rows, heads, dim]
RowWriter = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]


class Stages:
    """A model's layer stages over its prepacked layers (`layers`)."""

    def __init__(self, model: Any, fused: FusedOps | None) -> None:
        config = model.config
        self.family = families.of(model)
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = float(config.rms_norm_eps)
        decoder = model.model
        self.layers = [PackedLayer(layer) for layer in decoder.layers]
        self.embedding = decoder.embed_tokens  # Gemma's scales what it looks up
        self._embed = decoder.embed_tokens.weight
        self.final_norm = decoder.norm.weight
        self._rotary_emb = decoder.rotary_emb
        self._tables: dict[str | None, tuple[torch.Tensor, torch.Tensor]] = {}
        self._rope_table(config.max_position_embeddings)
        self.activation: Activation = F.silu if self.family.activation == "silu" else gelu_tanh
        if fused is not None and self._embed.dtype != torch.bfloat16:
            log.info("fused ops: bfloat16 only; the %s step runs PyTorch's operations",
                     self._embed.dtype)  # fmt: skip
            fused = None
        self._ops = fused
        # Llama's norms, and RoPE with the cache writes where no q/k norms come before it ...
        gemma, qk_norm = self.family.gemma_norms, self.family.qk_norm
        agrees = fused is not None and not (gemma and qk_norm) and self._fused_agrees(fused)
        self.norm_ops = fused if agrees and not gemma else None
        self.fused = fused if agrees and not qk_norm else None
        # ... Gemma's norms (fused_gemma.py) ...
        self._gemma = None if fused is None or not gemma else gemma_norms(
            fused, self.layers[0].post_norm, self.final_norm, self.eps)  # fmt: skip
        # ... and the MLP's act(gate) · up.
        self.act_ops = fused if fused is not None and self._act_agrees(fused) else None
        self.fused_silu = self.act_ops is not None  # (the log's and tests' name)
        # ... and the q/k norms with RoPE and the cache writes (Qwen 3, Gemma 3).
        cos, sin = self._tables[self.family.rope_types[0]]
        self.qk_fused = None if fused is None or not self.family.qk_norm else qk_norm_rope(
            fused, self.layers, self.heads, self.kv_heads, self.eps, gemma, cos, sin)  # fmt: skip

    def _fused_agrees(self, fused: FusedOps) -> bool:
        cos, sin = self._tables[self.family.rope_types[0]]
        norm = None if self.family.gemma_norms else self.final_norm
        if fused.agrees(norm, self.eps, self.heads, self.kv_heads, cos[:256], sin[:256]):
            return True
        log.warning("fused ops: not PyTorch's bits here; the step runs PyTorch's operations")
        return False

    def _act_agrees(self, fused: FusedOps) -> bool:
        intermediate = self.layers[0].intermediate
        # ATen's scalar GELU rounds a few values unlike its vector one: only where the MLP's
        # width leaves ATen no scalar tail (vectors of up to 64 bfloat16 values).
        gelu = self.activation is gelu_tanh
        if gelu and intermediate % 64:
            log.info("fused ops: GELU·up as PyTorch's at width %d", intermediate)
            return False
        if not fused.silu_agrees(intermediate, self.activation, vector_only=gelu):
            log.warning("fused ops: act·up not PyTorch's bits here; it runs PyTorch's")
            return False
        return True

    def _gemma_norm(self, weight: torch.Tensor) -> GemmaNorm:
        assert self._gemma is not None and self._ops is not None
        norm = self._gemma.get(id(weight))
        if norm is None:  # one per weight tensor: each keeps its 1 + w
            norm = self._gemma[id(weight)] = GemmaNorm(self._ops, weight, self.eps)
        return norm

    def fused_stages(self) -> list[str]:
        """The stages that run fused (for the start-up log)."""
        named = {"norms": self.norm_ops is not None or self._gemma is not None,
                 "RoPE and cache writes": self.fused is not None,
                 "q/k norms, RoPE and cache writes": self.qk_fused is not None,
                 "act·up": self.act_ops is not None}  # fmt: skip
        return [name for name, fused in named.items() if fused]

    def _rope_table(self, positions: int) -> None:
        """RoPE's cos and sin at every position below `positions` (at least), for each of the
        model's RoPE tables (Gemma 3 has one per layer type), from its own rotary embedding:
        each value is one product and one cos or sin of it, the same whichever positions share
        the call, and a lookup costs a step less than the call (tested bit for bit with the
        step). Past the model's trained length a table doubles, as the call would have gone on."""
        have = min((cos.shape[0] for cos, _ in self._tables.values()), default=0)
        if positions <= have:
            return
        size = max(positions, 2 * have)
        at = torch.arange(size)[None]
        for kind in set(self.family.rope_types):
            args = () if kind is None else (kind,)
            cos, sin = self._rotary_emb(self._embed[:1], at, *args)
            self._tables[kind] = cos[0].contiguous(), sin[0].contiguous()

    def rotary(self, positions: torch.Tensor, kind: str | None = None) -> tuple[torch.Tensor, ...]:
        """cos, sin [rows, 1, head_dim] at each row's position, as the model's forward has them."""
        self._rope_table(int(positions.max()) + 1)
        cos, sin = self._tables[kind]
        return cos[positions, None, :], sin[positions, None, :]

    def norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.family.gemma_norms:
            if self._gemma is not None:
                return self._gemma_norm(weight)(x)
            return gemma_rms_norm(x, weight, self.eps)
        if self.norm_ops is not None:
            return self.norm_ops.add_rms_norm(x.contiguous(), None, weight, self.eps)
        return rms_norm(x, weight, self.eps)

    def add_norm(self, hidden: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                 out: torch.Tensor | None = None, delta_norm: torch.Tensor | None = None,
                 ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """The residual stream plus `delta` (unless None; normed by `delta_norm` first, when
        given: Gemma's), and its norm by `weight` (fused: into `out` when given, a buffer the
        step reuses once the norm's last reader is done)."""
        # Fused, `hidden` is added to in place: the caller's own tensor.
        if self._gemma is not None:
            before = None if delta_norm is None else self._gemma_norm(delta_norm)
            return hidden, self._gemma_norm(weight)(hidden, delta, out, before)
        if delta is not None and delta_norm is not None:
            delta = self.norm(delta, delta_norm)
        if self.norm_ops is not None:
            return hidden, self.norm_ops.add_rms_norm(hidden, delta, weight, self.eps, out)
        if delta is not None:
            hidden = hidden + delta
        return hidden, self.norm(hidden, weight)

    def after_attention(self, layer: PackedLayer, hidden: torch.Tensor, attended: torch.Tensor,
                        next_norm: torch.Tensor, out: torch.Tensor | None = None,
                        ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """The residual stream after a layer's attention output and MLP, and its norm for what
        comes next (`next_norm`). Gemma norms the attention's and the MLP's outputs before
        adding them, and the stream before its MLP with a norm of its own."""
        if not self.family.gemma_norms:
            hidden, x = self.add_norm(hidden, layer.o(attended), layer.post_norm, out)
            return self.add_norm(hidden, layer.down(self.mlp(layer, x)), next_norm, out)
        assert layer.pre_mlp_norm is not None and layer.post_mlp_norm is not None
        hidden, x = self.add_norm(hidden, layer.o(attended), layer.pre_mlp_norm, out,
                                  layer.post_norm)  # fmt: skip
        delta = layer.down(self.mlp(layer, x))
        return self.add_norm(hidden, delta, next_norm, out, layer.post_mlp_norm)

    def next_norms(self) -> list[torch.Tensor]:
        """Each layer's input norm after the first, then the final norm: the norm that follows
        each layer's residual stream."""
        return [layer.input_norm for layer in self.layers[1:]] + [self.final_norm]

    def mlp(self, layer: PackedLayer, x: torch.Tensor) -> torch.Tensor:
        """The MLP's act(gate) · up, from one product of both (sliced: `chunk` costs more)."""
        gate_up = layer.gate_up(x)
        if self.act_ops is not None:
            return self.act_ops.silu_mul(gate_up, layer.intermediate, self.activation)
        gate, up = gate_up[..., : layer.intermediate], gate_up[..., layer.intermediate :]
        return self.activation(gate) * up

    def qk_heads(self, qkv: torch.Tensor, layer: PackedLayer) -> torch.Tensor:
        """q's and k's heads [..., heads + kv heads, dim] out of `qkv` [..., width], each normed
        over its head where the family does (Qwen3, Gemma 3), by PyTorch's operations."""
        if layer.q_norm is None or layer.k_norm is None:
            qk_heads, dim = self.heads + self.kv_heads, self.head_dim
            return qkv[..., : qk_heads * dim].unflatten(-1, (qk_heads, dim))
        norms, gemma = (layer.q_norm, layer.k_norm), self.family.gemma_norms
        return normed_heads(qkv, self.heads, self.kv_heads, norms, self.eps, gemma)

    def row_writer(self, positions: torch.Tensor, keys: torch.Tensor) -> RowWriter:
        """RoPE on a decode step's rows and their cache writes, per layer: (qkv, the layer's
        keys, its values, its index) ↦ the rows' queries. One pass where fused, else PyTorch's
        operations."""
        rows, heads, kv_heads, dim = positions.shape[0], self.heads, self.kv_heads, self.head_dim
        if self.fused is not None or self.qk_fused is not None:
            positions = positions.contiguous()
            # One buffer for every layer's queries: each layer's attention has read its own
            # before the next layer's RoPE writes.
            roped = torch.empty(rows, heads + kv_heads, dim, dtype=self._embed.dtype)

            def write_fused(qkv: torch.Tensor, layer_keys: torch.Tensor,
                            layer_values: torch.Tensor, index: int) -> torch.Tensor:  # fmt: skip
                cache = (layer_keys, layer_values)
                return self._fused_rope(qkv, index, positions, cache, roped)[:, :heads]

            return write_fused
        # Where each row's new key and value go in a layer's buffer, viewed as [cells, dim]:
        # one index_copy_ each, cheaper than indexing rows and columns at once.
        heads_index = torch.arange(kv_heads)[None, :]
        rows_index = torch.arange(rows)[:, None]
        cells = (rows_index * kv_heads + heads_index) * keys.shape[3] + positions[:, None]
        cells = cells.reshape(-1)
        tables = {kind: self.rotary(positions, kind) for kind in set(self.family.rope_types)}

        def write(qkv: torch.Tensor, layer_keys: torch.Tensor, layer_values: torch.Tensor,
                  index: int) -> torch.Tensor:  # fmt: skip
            layer = self.layers[index]
            # RoPE on the queries and keys at once: the same elementwise products.
            qk = rotary(self.qk_heads(qkv, layer), *tables[self.family.rope_types[index]])
            value = qkv[:, (heads + kv_heads) * dim :].reshape(-1, dim)
            layer_keys.view(-1, dim).index_copy_(0, cells, qk[:, heads:].reshape(-1, dim))
            layer_values.view(-1, dim).index_copy_(0, cells, value)
            return qk[:, :heads]

        return write

    def _fused_rope(self, qkv: torch.Tensor, index: int, positions: torch.Tensor,
                    cache: Cache | None = None, out: torch.Tensor | None = None,
                    ) -> torch.Tensor:  # fmt: skip
        """Layer `index`'s q/k norms (where the family has them), RoPE and, with `cache`, its
        cache writes in one pass (fused_ops.py's `rope`, fused_qk_norm.py's)."""
        cos, sin = self._tables[self.family.rope_types[index]]
        if self.qk_fused is not None:
            return self.qk_fused(qkv, index, cos, sin, positions, cache, out)
        assert self.fused is not None
        return self.fused.rope(qkv, self.heads + self.kv_heads, cos, sin, positions, cache, out)

    def prefill_rope(self, qkv: torch.Tensor, rows: int, length: int, index: int,
                     start: int = 0) -> torch.Tensor:  # fmt: skip
        """RoPE on a prefill's queries and keys: [rows, length, heads + kv heads, dim], at
        positions from `start` (a prompt's later chunk)."""
        qk_heads, dim = self.heads + self.kv_heads, self.head_dim
        if self.fused is not None or self.qk_fused is not None:
            positions = torch.arange(start, start + length).repeat(rows)
            qk = self._fused_rope(qkv.view(rows * length, -1), index, positions)
            return qk.view(rows, length, qk_heads, dim)
        cos, sin = self._tables[self.family.rope_types[index]]
        qk = self.qk_heads(qkv.view(rows, length, -1), self.layers[index])
        at = slice(start, start + length)
        return rotary(qk, cos[None, at, None, :], sin[None, at, None, :])
