"""The q/k norms, RoPE and the cache writes of Qwen 3 and Gemma 3 as one fused_ops.c pass
(`qk_norm_rope`), rounded as PyTorch's operations are.

Those families norm each head of q and k between the q/k/v product and RoPE, so fused_ops.py's
RoPE pass (Llama's layer) does not apply, and PyTorch's operations ran there: slices, copies, a
concatenation, RoPE's products and two `index_copy_` per layer, about a tenth of a small
model's decode step. Here each head is normed (Qwen 3: Llama's RMSNorm, the bfloat16 product by
the weight; Gemma 3: `x · (1 + w)` in float32), then rotated, and a decode row's keys and values
go into its cache, in one pass per layer. Each value is PyTorch's, as fused_ops.py promises for
Llama's stages: the norm's sum in ATen's order at ATen's width, each result rounded where
PyTorch's is, checked against PyTorch's operations at start (`agrees`); where the check fails
the step keeps PyTorch's operations, and says so in the log.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

import torch

from .fused_gemma import gemma_rms_norm
from .fused_ops import CHECK_ROWS, TRIES, FusedOps, _random, rms_norm, rotary

log = logging.getLogger(__name__)
_P, _L, _I, _F = ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_float
_SEED = 20261128
Cache = tuple[torch.Tensor, torch.Tensor]  # a layer's keys and values [rows, kv heads, cols, dim]


def normed_heads(qkv: torch.Tensor, heads: int, kv_heads: int, norms: tuple[torch.Tensor, ...],
              eps: float, gemma: bool) -> torch.Tensor:  # fmt: skip
    """PyTorch's q/k norms over `qkv` [..., width]: q's and k's heads [..., heads + kv heads,
    dim], each normed over its head as the model's attention norms it (dim: the norms')."""
    dim, norm = norms[0].shape[0], gemma_rms_norm if gemma else rms_norm
    qk = qkv[..., : (heads + kv_heads) * dim].unflatten(-1, (heads + kv_heads, dim))
    queries, keys = qk[..., :heads, :], qk[..., heads:, :]
    return torch.cat([norm(queries, norms[0], eps), norm(keys, norms[1], eps)], -2)


class QKNormRope:
    """The pass for one model's shapes: `heads` query and `kv_heads` key heads of `dim`, normed
    by each layer's q/k norm weights (`norms`, one pair per layer), Gemma's norm if `gemma`."""

    def __init__(self, ops: FusedOps, heads: int, kv_heads: int, eps: float, gemma: bool,
                 norms: list[tuple[torch.Tensor, torch.Tensor]]) -> None:  # fmt: skip
        self._pass = ops.library.qk_norm_rope
        self._pass.argtypes = [_P, _L, _L, _L, _L, _L, _P, _P, _I, _F, _I,
                               _P, _P, _P, _P, _P, _P, _L, _I]  # fmt: skip
        self._ops, self.heads, self.kv_heads, self.eps = ops, heads, kv_heads, eps
        self.gemma, self.norms = gemma, norms
        # What the C pass reads: Gemma's 1 + w in float32 (made once), else the weights.
        self._weights = [tuple(self._prepared(w) for w in pair) for pair in norms]

    def _prepared(self, weight: torch.Tensor) -> torch.Tensor:
        return (1.0 + weight.float()).contiguous() if self.gemma else weight.contiguous()

    def __call__(self, qkv: torch.Tensor, layer: int, cos: torch.Tensor, sin: torch.Tensor,
                 positions: torch.Tensor, cache: Cache | None = None,
                 out: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """`rotary(normed_heads(...))` over each token of `qkv` [tokens, width] (rows contiguous)
        by layer `layer`'s norms, at its position (int64) in the `cos`/`sin` tables [positions,
        dim]: [tokens, heads + kv heads, dim], into `out` when given. With `cache`, token t is
        row t, and its keys and values (after the keys in `qkv`) are written at its position."""
        tokens, dim, qk_heads = qkv.shape[0], cos.shape[1], self.heads + self.kv_heads
        out = torch.empty(tokens, qk_heads, dim, dtype=qkv.dtype) if out is None else out
        keys, values = cache if cache is not None else (None, None)
        q_norm, k_norm = self._weights[layer]
        status = self._pass(qkv.data_ptr(), qkv.stride(0), tokens, self.heads, self.kv_heads, dim,
                            q_norm.data_ptr(), k_norm.data_ptr(), int(self.gemma), self.eps,
                            self._ops.lanes, cos.data_ptr(), sin.data_ptr(), positions.data_ptr(),
                            out.data_ptr(), None if keys is None else keys.data_ptr(),
                            None if values is None else values.data_ptr(),
                            0 if keys is None else keys.shape[2],
                            torch.get_num_threads())  # fmt: skip
        if status:
            raise ValueError(f"fused q/k norms: heads of {dim} are more than fused_ops.c allows")
        return out

    def expected(self, qkv: torch.Tensor, layer: int, cos: torch.Tensor, sin: torch.Tensor,
                 positions: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """What `__call__` returns, by PyTorch's operations (the step's without the pass)."""
        heads, norms = (self.heads, self.kv_heads), self.norms[layer]
        normed = normed_heads(qkv, *heads, norms, self.eps, self.gemma)
        return rotary(normed, cos[positions, None, :], sin[positions, None, :])

    def agrees(self, cos: torch.Tensor, sin: torch.Tensor) -> bool:
        """Whether the pass gives PyTorch's bits, its cache writes included, with the first
        layer's norms and these RoPE tables: the norm's sums at the head's width, then `TRIES`
        random inputs per row count, half with magnitudes spread over 2^±8."""
        (positions, dim), kv_heads = cos.shape, self.kv_heads
        if not self._ops.sums_agree(dim):
            return False
        generator = torch.Generator().manual_seed(_SEED)
        for rows in CHECK_ROWS:
            for attempt in range(TRIES):
                qkv = _random((rows, (self.heads + 2 * kv_heads) * dim), attempt, generator)
                at = torch.randint(0, positions, (rows,), generator=generator)
                keys, values = (torch.zeros(rows, kv_heads, positions, dim, dtype=qkv.dtype)
                                for _ in "kv")  # fmt: skip
                roped = self(qkv, 0, cos, sin, at, (keys, values))
                expected = self.expected(qkv, 0, cos, sin, at)
                written = torch.arange(rows), slice(None), at
                value = qkv[:, (self.heads + kv_heads) * dim :].view(rows, kv_heads, dim)
                if not (torch.equal(roped, expected)
                        and torch.equal(keys[written], expected[:, self.heads :])
                        and torch.equal(values[written], value)):  # fmt: skip
                    return False
        return True


def qk_norm_rope(ops: FusedOps, layers: list[Any], heads: int, kv_heads: int, eps: float,
                 gemma: bool, cos: torch.Tensor, sin: torch.Tensor,
                 ) -> QKNormRope | None:  # fmt: skip
    """The pass over these layers' q/k norms (step_stages.py's PackedLayer), where each layer
    has both and it gives PyTorch's bits with the first layer's RoPE table `cos`/`sin`; else
    None (logged: the step runs PyTorch's operations there)."""
    pairs = ((layer.q_norm, layer.k_norm) for layer in layers)
    norms = [(q, k) for q, k in pairs if q is not None and k is not None]
    if len(norms) != len(layers):
        return None
    qk = QKNormRope(ops, heads, kv_heads, eps, gemma, norms)
    if not qk.agrees(cos[:256], sin[:256]):
        log.warning("fused ops: q/k norms not PyTorch's bits here; PyTorch's operations")
        return None
    return qk
