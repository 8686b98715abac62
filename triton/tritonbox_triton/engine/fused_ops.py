"""The decode step's elementwise stages as one C pass each, rounded as PyTorch's operations are.

Between its products a layer of the step runs ~30 small PyTorch operations (norms, residual
additions, RoPE, cache writes), each a pass with a dispatch of its own: a third of a 16-row
step, and more of a prefill (docs/cpu-engine-history.md). Here a residual addition
and the norm after it are one pass (`add_rms_norm`), RoPE with the cache writes another
(`rope`), and the MLP's act(gate) · up a third (`silu_mul`; Gemma's stages: fused_gemma.py).
A prefill's rows are shared among torch's own OpenMP workers (the library links the libgomp
torch has loaded; `load` checks that no second one came with it).

Each value is computed as PyTorch computes it: bfloat16 operands widened to float32, each
result rounded back to bfloat16 where PyTorch's is, no fused multiply-adds, the norm's mean
summed in the order of ATen's CPU sum (whose vector width is this machine's), and the
activation read from a table of PyTorch's own of every bfloat16 value. That order and every
stage are checked against PyTorch's operations at start (`load`, `FusedOps.agrees`) on random
inputs; where anything differs, where no C compiler is found or the dtype is not bfloat16, the
step keeps PyTorch's operations, and says so in the log.

Building and caching the library: fused_build.py.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import rotate_half

from .fused_build import open_library
from .fused_build import vector_exp as fused_vector_exp
from .probe import probe_input

log = logging.getLogger(__name__)

LANES = (8, 16)  # float vectors of AVX2 and AVX-512: the widths ATen's sums may run at
TRIES = 6  # random inputs per shape in each check
CHECK_ROWS = (1, 2, 3, 16, 33, 200)  # the row counts each check tries
_SEED = 20261126
_P, _L = ctypes.c_void_p, ctypes.c_long
Activation = Callable[[torch.Tensor], torch.Tensor]  # F.silu, or Gemma's GELU (tanh)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm, operation for operation."""
    x32 = x.to(torch.float32)
    variance = x32.pow(2).mean(-1, keepdim=True)
    return weight * (x32 * torch.rsqrt(variance + eps)).to(x.dtype)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb on one tensor of heads."""
    return x * cos + rotate_half(x) * sin


def swiglu(gate_up: torch.Tensor, intermediate: int) -> torch.Tensor:
    """transformers' LlamaMLP between its products: SiLU(gate) · up, from both in one tensor."""
    return F.silu(gate_up[..., :intermediate]) * gate_up[..., intermediate:]


class FusedOps:
    """The compiled stages, over contiguous bfloat16 tensors."""

    def __init__(
        self, library: ctypes.CDLL, lanes: int, built: str = "", vector_exp: int | None = None
    ) -> None:
        self.library = library
        self.built = built  # how the library came to be: compiled now (and in how long), or cached
        self._norm = library.add_rms_norm
        self._norm.argtypes = [_P, _P, _P, _P, _L, _L, ctypes.c_float, ctypes.c_int, ctypes.c_int]
        self._rope = library.rope
        self._rope.argtypes = [_P, _L, _L, _L, _L, _P, _P, _P, _P, _L, _P, _P, _L, ctypes.c_int]
        self._silu_mul = library.silu_mul
        self._silu_mul.argtypes = [_P, _L, _P, _L, _L, _P, ctypes.c_int]
        self._tables: dict[Activation, torch.Tensor] = {}
        self.vector_exp = vector_exp  # Sleef's exp in libtorch_cpu (the compiled attention's)
        self._row_sums = library.row_sums
        self._row_sums.argtypes = [_P, _P, _L, _L, ctypes.c_int]
        self.lanes = lanes

    def add_rms_norm(self, hidden: torch.Tensor, delta: torch.Tensor | None,
                     weight: torch.Tensor, eps: float,
                     out: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """`hidden += delta` in place (unless None); returns `rms_norm(hidden, weight, eps)`,
        written into `out` when given (hidden's shape)."""
        columns = hidden.shape[-1]
        out = torch.empty_like(hidden) if out is None else out
        pointer = None if delta is None else delta.data_ptr()
        status = self._norm(hidden.data_ptr(), pointer, weight.data_ptr(), out.data_ptr(),
                            hidden.numel() // columns, columns, eps, self.lanes,
                            torch.get_num_threads())  # fmt: skip
        if status:
            raise ValueError(f"fused norm: {columns} columns is more than fused_ops.c allows")
        return out

    def rope(self, qkv: torch.Tensor, qk_heads: int, cos: torch.Tensor, sin: torch.Tensor,
             positions: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None = None,
             out: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """`rotary` over each token's first `qk_heads` heads of `qkv` [tokens, width], at its
        position (int64) in the `cos`/`sin` tables [positions, dim]: [tokens, qk_heads, dim].
        With `cache` (a layer's keys and values [rows, kv heads, columns, dim]), token t is row
        t, and its key heads (the last of the qk heads) and value heads (after them in `qkv`)
        are written at its position. `out`: where to write the result, when given."""
        tokens, dim = qkv.shape[0], cos.shape[1]
        out = torch.empty(tokens, qk_heads, dim, dtype=qkv.dtype) if out is None else out
        keys, values = cache if cache is not None else (None, None)
        self._rope(qkv.data_ptr(), qkv.stride(0), tokens, qk_heads, dim, cos.data_ptr(),
                   sin.data_ptr(), positions.data_ptr(), out.data_ptr(),
                   0 if keys is None else keys.shape[1],
                   None if keys is None else keys.data_ptr(),
                   None if values is None else values.data_ptr(),
                   0 if keys is None else keys.shape[2], torch.get_num_threads())  # fmt: skip
        return out

    def silu_mul(self, gate_up: torch.Tensor, intermediate: int,
                 activation: Activation = F.silu) -> torch.Tensor:  # fmt: skip
        """act(gate) · up [rows, intermediate] from the MLP's one product of gate and up [rows,
        2 × intermediate] (rows contiguous): `swiglu`, or with `activation` for SiLU."""
        rows = gate_up.numel() // gate_up.shape[-1]
        out = torch.empty(*gate_up.shape[:-1], intermediate, dtype=gate_up.dtype)
        self._silu_mul(gate_up.data_ptr(), gate_up.stride(-2), out.data_ptr(), rows,
                       intermediate, self.table(activation).data_ptr(),
                       torch.get_num_threads())  # fmt: skip
        return out

    def agrees(self, weight: torch.Tensor | None, eps: float, heads: int, kv_heads: int,
               cos: torch.Tensor, sin: torch.Tensor) -> bool:  # fmt: skip
        """Whether both stages (RoPE alone where `weight` is None: Gemma's norms) give PyTorch's
        bits for a model of these shapes, on `TRIES` random inputs per row count, half ±2^8."""
        generator = torch.Generator().manual_seed(_SEED)
        return (weight is None or self.sums_agree(weight.shape[0])) and all(
            (weight is None or self._norm_agrees(weight, eps, rows, attempt, generator))
            and self._rope_agrees(heads, kv_heads, cos, sin, rows, attempt, generator)
            for rows in CHECK_ROWS
            for attempt in range(TRIES)
        )

    def table(self, activation: Activation) -> torch.Tensor:
        """`activation` of every bfloat16 value, by its bits (made once)."""
        if activation not in self._tables:
            self._tables[activation] = _table(activation)
        return self._tables[activation]

    def silu_agrees(self, intermediate: int, activation: Activation = F.silu,
                    vector_only: bool = False) -> bool:  # fmt: skip
        """Whether `silu_mul` (with `activation`) gives PyTorch's bits: for every finite
        bfloat16 gate on each of its paths against each of ATen's (rows of 16: its vector path
        against ATen's scalar one; 64: both vector; 15: both scalar), then at this width with
        tails on `TRIES` random inputs per row count. `vector_only`: ATen's vector path alone
        (rows of 64, no tails), for GELU, whose scalar path rounds a few values otherwise."""
        generator = torch.Generator().manual_seed(_SEED)
        every = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
        gates = every[every.float().isfinite()]  # 65,280 values: a multiple of 15, 16 and 64
        exhaustive = (
            torch.cat(
                [gates.view(-1, width), _random((gates.numel() // width, width), 1, generator)], 1
            )
            for width in ((64,) if vector_only else (16, 64, 15))
        )
        random = (
            _random((rows, 2 * width), attempt, generator)
            for width in ((intermediate,) if vector_only else (intermediate, intermediate + 7))
            for rows in CHECK_ROWS
            for attempt in range(TRIES)
        )
        return all(
            torch.equal(
                self.silu_mul(gate_up, half, activation),
                activation(gate_up[:, :half]) * gate_up[:, half:],
            )
            for gate_up in (*exhaustive, *random)
            for half in [gate_up.shape[1] // 2]
        )

    def sums_agree(self, *widths: int) -> bool:
        """Whether the norm's sums are ATen's `sum` bit for bit, on rows of these and other
        widths. Checked apart from the norm: a sum off in its last bit rarely moves a norm's
        bfloat16 result, but it does now and then (19 of 300 random batches)."""
        generator = torch.Generator().manual_seed(_SEED)
        for columns in (*widths, 61, 576, 4096):
            x = torch.randn(512, columns, generator=generator) ** 2
            out = torch.empty(x.shape[0])
            self._row_sums(x.data_ptr(), out.data_ptr(), x.shape[0], columns, self.lanes)
            if not torch.equal(out, x.sum(-1)):
                return False
        return True

    def _norm_agrees(self, weight: torch.Tensor, eps: float, rows: int, attempt: int,
                     generator: torch.Generator) -> bool:  # fmt: skip
        hidden, delta = (_random((rows, weight.shape[0]), attempt, generator) for _ in range(2))
        summed = hidden + delta
        normed = self.add_rms_norm(hidden, delta, weight, eps)
        return torch.equal(hidden, summed) and torch.equal(normed, rms_norm(summed, weight, eps))

    def _rope_agrees(self, heads: int, kv_heads: int, cos: torch.Tensor, sin: torch.Tensor,
                     rows: int, attempt: int, generator: torch.Generator) -> bool:  # fmt: skip
        (positions, dim), qk_heads = cos.shape, heads + kv_heads
        qkv = _random((rows, (qk_heads + kv_heads) * dim), attempt, generator)
        at = torch.randint(0, positions, (rows,), generator=generator)
        keys, values = (torch.zeros(rows, kv_heads, positions, dim, dtype=qkv.dtype) for _ in "kv")
        roped = self.rope(qkv, qk_heads, cos, sin, at, (keys, values))
        expected = rotary(qkv[:, : qk_heads * dim].view(rows, qk_heads, dim),
                          cos[at, None, :], sin[at, None, :])  # fmt: skip
        written = torch.arange(rows), slice(None), at
        return (
            torch.equal(roped, expected)
            and torch.equal(keys[written], expected[:, heads:])
            and torch.equal(values[written], qkv[:, qk_heads * dim :].view(rows, kv_heads, dim))
        )


def _table(activation: Activation) -> torch.Tensor:
    """`activation` of every bfloat16 value, indexed by its bits, and one entry of padding."""
    every = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    return torch.cat([activation(every), every[:1]])


def _random(shape: tuple[int, int], attempt: int, generator: torch.Generator) -> torch.Tensor:
    return probe_input(shape, generator, spread=bool(attempt % 2))


@functools.cache
def load(directory: Path | None = None) -> FusedOps | None:
    """The fused stages, built into `directory` (default: the user's cache), or None where
    they cannot be built or do not sum as ATen does (logged)."""
    try:
        library, built = open_library(directory)
    except OSError as error:
        log.warning("fused ops unavailable (%s): the step runs PyTorch's operations", error)
        return None
    # The width of ATen's sums: this machine's kernels' (AVX-512 ones were seen summing 8 wide).
    candidates = (FusedOps(library, lanes, built, fused_vector_exp()) for lanes in LANES)
    ops = next((candidate for candidate in candidates if candidate.sums_agree()), None)
    if ops is None:
        log.warning("fused ops: ATen sums in another order here: PyTorch's operations instead")
    return ops
