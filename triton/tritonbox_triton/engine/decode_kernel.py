"""The decode step's attention as one compiled pass (decode_attention.c), where it is built.

PyTorch's fused CPU attention costs a decode step about a fifth of its time at 16 rows (~0.22
ms a layer, docs/cpu-engine.md): it runs a small matrix product per head and block of keys, and
its rounding moves with the columns a batch is padded to, so the engine had to pad every row's
keys to whole blocks to keep a row's bits its own (attention.py). The compiled pass computes
each row from its own keys only, in float32, rounding once: the bits of a row do not depend on
its neighbours, on the padding or on the thread count, by construction, and that is checked at
start here with the accuracy (against float64), on random rows. The engine's step and the
model's forward (the reference `generate()` and adapter batches) both call it: attention.py
attaches it to the model it loads.
"""

from __future__ import annotations

import ctypes
import logging

import torch

from .fused_ops import FusedOps

log = logging.getLogger(__name__)

_P, _L = ctypes.c_void_p, ctypes.c_long
_SEED = 20261126
# Each output within one bfloat16 step of float64's attention, and most of them its rounding.
_NEAREST_SHARE = 0.97


class DecodeRows:
    """A step's rows for the kernel: each one's count of keys, from column 0."""

    def __init__(self, lengths: torch.Tensor) -> None:
        self.lengths = lengths.to(torch.int64).contiguous()
        self.count = len(lengths)
        self.longest = int(lengths.max())
        if int(lengths.min()) < 1:
            raise ValueError("a decode row attends at least its own key")


class DecodeKernel:
    """One query per head and row, each row over its first `lengths[row]` keys."""

    def __init__(self, ops: FusedOps) -> None:
        self._attend = ops.library.decode_attention
        self._attend.argtypes = [_P, _L, _P, _P, _L, _L, _P, _P, _L, _L, _L, _L,
                                 ctypes.c_float, _P, ctypes.c_int]  # fmt: skip
        self._vector_exp = ops.vector_exp

    def __call__(
        self,
        query: torch.Tensor,  # [rows, kv heads, groups, dim], each row's heads contiguous
        keys: torch.Tensor,  # [rows, kv heads, columns, dim], each head's keys contiguous
        values: torch.Tensor,
        rows: DecodeRows,
        scaling: float,
        threads: int | None = None,
    ) -> torch.Tensor:
        """[rows, kv heads × groups × dim], bfloat16. Called once per layer: the checks here
        are on shapes, `rows` checked its lengths once."""
        count, kv_heads, groups, dim = query.shape
        if keys.stride()[2:] != (dim, 1) or values.stride() != keys.stride():
            raise ValueError(f"keys and values laid out as {keys.stride()}, {values.stride()}")
        if query.stride()[1:] != (groups * dim, dim, 1):
            raise ValueError(f"queries laid out as {query.stride()}")
        if rows.longest > keys.shape[2] or rows.count != count:
            raise ValueError(f"{rows.count} rows up to {rows.longest} keys for {keys.shape}")
        out = torch.empty(count, kv_heads * groups * dim, dtype=query.dtype)
        status = self._attend(
            query.data_ptr(), query.stride(0), keys.data_ptr(), values.data_ptr(),
            keys.stride(0), keys.stride(1), rows.lengths.data_ptr(), out.data_ptr(),
            count, kv_heads, groups, dim, scaling, self._vector_exp,
            torch.get_num_threads() if threads is None else threads,
        )  # fmt: skip
        if status:
            raise ValueError(f"decode attention: {groups} groups of {dim} not built here")
        return out

    def agrees(self, kv_heads: int, groups: int, dim: int) -> bool:
        """Whether on random rows each output is float64's attention within a bfloat16 step
        (and mostly its rounding), and each row's bits are its own: alone with no padding and
        in a batch padded wider. On the caller's torch threads only: a parallel region with
        more would start a second OpenMP team on Triton's thread, and two teams on two cores
        stop spinning between regions, which doubled a served step (cpu-engine.md, second
        round; seen again here). The thread count's part is tested (test_attention.py)."""
        generator = torch.Generator().manual_seed(_SEED)
        nearest = total = 0
        for trial in range(4):
            rows = 2 + 3 * trial
            lengths = torch.randint(1, 700, (rows,), generator=generator)
            width = int(lengths.max()) + 37 * trial
            shape = (rows, kv_heads, width, dim)
            keys, values = (torch.randn(shape, generator=generator).bfloat16() for _ in range(2))
            query = torch.randn(rows, kv_heads, groups, dim, generator=generator).bfloat16()
            batched = self(query, keys, values, DecodeRows(lengths), dim**-0.5)
            exact = _float64_attention(query, keys, values, lengths, dim**-0.5)
            step = exact.abs().clamp(min=2**-126) * 2**-7  # one bfloat16 step, or more
            if ((batched.double() - exact).abs() > step).any():
                return False
            nearest += int((batched == exact.to(torch.bfloat16)).sum())
            total += exact.numel()
            for row in range(rows):
                own = int(lengths[row])
                alone = self(query[row : row + 1], keys[row : row + 1, :, :own].contiguous(),
                             values[row : row + 1, :, :own].contiguous(),
                             DecodeRows(lengths[row : row + 1]), dim**-0.5)  # fmt: skip
                if not torch.equal(alone[0], batched[row]):
                    return False
        return nearest >= _NEAREST_SHARE * total


def _float64_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                       lengths: torch.Tensor, scaling: float) -> torch.Tensor:  # fmt: skip
    columns = torch.arange(keys.shape[2])[None, :] < lengths[:, None]
    scores = torch.matmul(query.double(), keys.double().transpose(-1, -2)) * scaling
    scores = scores.masked_fill(~columns[:, None, None, :], float("-inf"))
    return torch.matmul(scores.softmax(-1), values.double()).flatten(1)


def decode_kernel(ops: FusedOps | None, dtype: torch.dtype, kv_heads: int, groups: int,
                  dim: int) -> DecodeKernel | None:  # fmt: skip
    """The compiled attention for these heads, or None (PyTorch's, logged) where the library
    is missing, has no AVX-512, the dtype is not bfloat16 or the start-up check fails."""
    why = None
    if ops is None or ops.vector_exp is None:
        why = "no compiled library with AVX-512"
    elif dtype != torch.bfloat16:
        why = f"{dtype} (bfloat16 only)"
    else:
        kernel = DecodeKernel(ops)
        try:
            if kernel.agrees(kv_heads, groups, dim):
                return kernel
            why = "its start-up check failed"
        except ValueError as error:
            why = str(error)
    log.log(logging.WARNING if why.startswith("its") else logging.INFO,
            "decode attention: PyTorch's fused attention (%s)", why)  # fmt: skip
    return None
