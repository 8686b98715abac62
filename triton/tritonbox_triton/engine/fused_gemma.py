"""Gemma's elementwise stages as fused_ops.c passes: its norm, `x · (1 + w)` in float32, with the
residual addition before it in one pass (`add_gemma_norm`; the norm of the attention's or the
MLP's output before the addition too), and its MLP's GELU (tanh) · up from a table of PyTorch's
own GELU (fused_ops.py's `silu_mul` with another table).

Gemma's layer runs five norms (four around attention and the MLP, one on q and k in Gemma 3)
where Llama's runs two, each about eight PyTorch operations on a decode step's few rows: on a
small model their dispatch alone cost Gemma a fifth of its step. Each value is PyTorch's, as
fused_ops.py promises for Llama's stages, and checked as it checks them at start; where a check
fails the step keeps PyTorch's operations for that stage, and says so in the log.
"""

from __future__ import annotations

import ctypes
import logging

import torch
import torch.nn.functional as F

from .fused_ops import CHECK_ROWS, TRIES, FusedOps, _random

log = logging.getLogger(__name__)
_P, _L = ctypes.c_void_p, ctypes.c_long
_SEED = 20261127


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """Gemma's MLP activation (`gelu_pytorch_tanh`); one object, so its table is made once."""
    return F.gelu(x, approximate="tanh")


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Gemma RMSNorm, operation for operation: `x · (1 + w)` in float32."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * (1.0 + weight.float())).type_as(x)


class GemmaNorm:
    """Gemma's norm by one weight, fused (`__call__`), with `1 + w` made once."""

    def __init__(self, ops: FusedOps, weight: torch.Tensor, eps: float) -> None:
        self._norm = ops.library.add_gemma_norm
        self._norm.argtypes = [_P, _P, _P, _P, _P, _L, _L, ctypes.c_float, ctypes.c_int,
                               ctypes.c_int]  # fmt: skip
        self._lanes = ops.lanes
        self.weight = weight
        self.shifted = (1.0 + weight.float()).contiguous()
        self.eps = eps

    def __call__(self, hidden: torch.Tensor, delta: torch.Tensor | None = None,
                 out: torch.Tensor | None = None,
                 before: GemmaNorm | None = None) -> torch.Tensor:  # fmt: skip
        """`hidden += delta` in place (unless None, when `hidden` is only read; `delta` normed by
        `before` first, when given: Gemma's norm after attention and after the MLP); returns
        `gemma_rms_norm(hidden, weight, eps)`, into `out` when given. Rows contiguous."""
        columns = hidden.shape[-1]
        if delta is None:  # only read: a copy will do (q and k's heads are slices of q/k/v)
            hidden = hidden.contiguous()
        elif not (hidden.is_contiguous() and delta.is_contiguous()):
            raise ValueError("fused norm: the residual and its addition must be contiguous")
        out = torch.empty_like(hidden) if out is None else out
        pointer = None if delta is None else delta.data_ptr()
        first = None if before is None else before.shifted.data_ptr()
        status = self._norm(hidden.data_ptr(), pointer, first, self.shifted.data_ptr(),
                            out.data_ptr(), hidden.numel() // columns, columns, self.eps,
                            self._lanes, torch.get_num_threads())  # fmt: skip
        if status:
            raise ValueError(f"fused norm: {columns} columns is more than fused_ops.c allows")
        return out

    def agrees(self, before: GemmaNorm | None = None) -> bool:
        """Whether it gives PyTorch's bits, with and without the addition (and with the
        addition's own norm by `before`, when given), on `TRIES` random inputs per row count,
        half with magnitudes spread over 2^±8."""
        generator = torch.Generator().manual_seed(_SEED)
        width = self.weight.shape[0]
        for rows in CHECK_ROWS:
            for attempt in range(TRIES):
                hidden, delta = (_random((rows, width), attempt, generator) for _ in range(2))
                expected_alone = gemma_rms_norm(hidden, self.weight, self.eps)
                if not torch.equal(self(hidden), expected_alone):
                    return False
                summed = hidden + delta
                normed = self(hidden, delta)
                expected = gemma_rms_norm(summed, self.weight, self.eps)
                if not (torch.equal(hidden, summed) and torch.equal(normed, expected)):
                    return False
                if before is None:
                    continue
                summed = hidden + gemma_rms_norm(delta, before.weight, before.eps)
                normed = self(hidden, delta, None, before)
                expected = gemma_rms_norm(summed, self.weight, self.eps)
                if not (torch.equal(hidden, summed) and torch.equal(normed, expected)):
                    return False
        return True


def gemma_norms(ops: FusedOps, first: torch.Tensor, final: torch.Tensor,
                eps: float) -> dict[int, GemmaNorm] | None:  # fmt: skip
    """An empty cache of fused norms (one per weight, by its id) where they give PyTorch's bits
    for a model with the first norm after attention `first` and the final norm `final`; else
    None (logged: its norms run as PyTorch's operations)."""
    if GemmaNorm(ops, final, eps).agrees(GemmaNorm(ops, first, eps)):
        return {}
    log.warning("fused ops: not PyTorch's Gemma norm here; PyTorch's operations")
    return None
