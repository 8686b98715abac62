"""The engine's attention as one compiled pass (attention_kernel.c), where it is built.

PyTorch's fused CPU attention cost a decode step about a fifth of its time at 16 rows (~0.22
ms a layer) and a 16-prompt prefill ~0.9 ms a layer (docs/cpu-engine-history.md): it runs a small
matrix product per head and block of keys, and its rounding moves with the columns a batch is
padded to, so the engine had to pad every row's keys to whole blocks to keep a row's bits its
own (attention.py). The compiled pass computes each row from its own keys only, in float32,
rounding once: the bits of a row do not depend on its neighbours, on the padding or on the
thread count, by construction, and that is checked at start here with the accuracy (against
float64), on random rows. The engine's step and prefill and the model's forward (the reference
`generate()` and adapter batches) all call it: attention.py attaches it to the model it loads.
"""

from __future__ import annotations

import ctypes
import logging

import torch

from . import windowed
from .fused_ops import FusedOps

log = logging.getLogger(__name__)

_P, _L = ctypes.c_void_p, ctypes.c_long
_SEED = 20261126
# Each output within one bfloat16 step of float64's attention, and most of them its rounding.
_NEAREST_SHARE = 0.97
# The smallest magnitude a bfloat16 step is measured from: an output that cancels to near 0
# keeps float32's error of its terms (~1e-8 to 1e-7). With a head of 256 (Gemma 3) one causal
# output of 138,240 cancelled to 5.6e-7; with 8 kv heads of 128 (Mistral 7B, Llama 3 8B) one
# decode output of 16,384 to 8.1e-7, 1.7e-8 (2% of itself) from float64's.
_FLOOR = 2**-16


class DecodeRows:
    """A decode step's rows for the kernel: each one's count of keys, from column 0."""

    def __init__(self, lengths: torch.Tensor) -> None:
        self.lengths = lengths.to(torch.int64).contiguous()
        self.count = len(lengths)
        self.longest = int(lengths.max())
        if int(lengths.min()) < 1:
            raise ValueError("a decode row attends at least its own key")


class AttentionKernel:
    """Each row over its own keys: one query per head (`decode`) or a prompt's (`causal`)."""

    def __init__(self, ops: FusedOps) -> None:
        self._attend = ops.library.attention
        self._attend.argtypes = [_P, _L, _L, _P, _L, _L, _L, _P, _L, _L, _L, _P, _L, _P, _L, _L,
                                 _L, _L, ctypes.c_float, _L, ctypes.c_float, _P,
                                 ctypes.c_int]  # fmt: skip
        self._vector_exp = ops.vector_exp

    def _run(self, query: torch.Tensor, query_strides: tuple[int, int], keys: torch.Tensor,
             values: torch.Tensor, lengths: torch.Tensor, positions: int, groups: int,
             scaling: float, threads: int | None, window: int | None = None,
             softcap: float | None = None) -> torch.Tensor:  # fmt: skip
        """keys/values [rows, kv heads, columns, dim] (any strides, dim contiguous); query's
        heads of one row and position contiguous, `query_strides` (row, position). `window`:
        each query sees its last that many keys only; `softcap`: Gemma 2's cap on the scores
        (windowed.py)."""
        rows, kv_heads, _, dim = keys.shape
        if keys.stride(3) != 1 or values.stride(3) != 1 or query.stride(-1) != 1:
            raise ValueError("attention: the head dimension must be contiguous")
        out = torch.empty(rows, positions, kv_heads * groups * dim, dtype=query.dtype)
        status = self._attend(
            query.data_ptr(), *query_strides, keys.data_ptr(), keys.stride(0), keys.stride(1),
            keys.stride(2), values.data_ptr(), values.stride(0), values.stride(1),
            values.stride(2), lengths.data_ptr(), positions, out.data_ptr(), rows, kv_heads,
            groups, dim, scaling, window or 0, softcap or 0.0, self._vector_exp,
            torch.get_num_threads() if threads is None else threads,
        )  # fmt: skip
        if status:
            raise ValueError(f"attention: {groups} groups of {dim} not built here")
        return out

    def decode(
        self,
        query: torch.Tensor,  # [rows, kv heads, groups, dim], each row's heads contiguous
        keys: torch.Tensor,  # [rows, kv heads, columns, dim]
        values: torch.Tensor,
        rows: DecodeRows,
        scaling: float,
        threads: int | None = None,
        window: int | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor:
        """Each row's query over its first `rows.lengths` keys: [rows, heads × dim]. Called
        once per layer: the checks here are on shapes, `rows` checked its lengths once."""
        count, _, groups, dim = query.shape
        if query.stride()[1:] != (groups * dim, dim, 1):
            raise ValueError(f"queries laid out as {query.stride()}")
        if rows.longest > keys.shape[2] or rows.count != count:
            raise ValueError(f"{rows.count} rows up to {rows.longest} keys for {keys.shape}")
        out = self._run(query, (query.stride(0), 0), keys, values, rows.lengths, 1, groups,
                        scaling, threads, window, softcap)  # fmt: skip
        return out.view(count, -1)

    def causal(
        self,
        query: torch.Tensor,  # [rows, heads, length, dim]
        keys: torch.Tensor,  # [rows, kv heads, length, dim]
        values: torch.Tensor,
        scaling: float,
        threads: int | None = None,
        window: int | None = None,
        softcap: float | None = None,
        before: int = 0,
    ) -> torch.Tensor:
        """Each position's queries over the keys up to its own: [rows, length, heads × dim].
        `before`: keys of earlier positions ahead of the queries' (a prompt's next chunk)."""
        rows, heads, length, dim = query.shape
        if keys.shape[2] < before + length or values.shape[2] < before + length:
            raise ValueError(f"{before} + {length} positions over {keys.shape[2]} keys")
        if query.stride(1) != dim:  # a position's heads side by side
            query = query.transpose(1, 2).contiguous().transpose(1, 2)
        lengths = torch.full((rows,), before + length, dtype=torch.int64)
        return self._run(query, (query.stride(0), query.stride(2)), keys, values, lengths,
                         length, heads // keys.shape[1], scaling, threads, window,
                         softcap)  # fmt: skip

    def agrees(self, kv_heads: int, groups: int, dim: int) -> bool:
        """Whether on random rows each output is float64's attention within a bfloat16 step
        (and mostly its rounding), and each row's bits are its own: alone with no padding and
        in a batch padded wider; decoding and causally. On the caller's torch threads only: a
        parallel region with more would start a second OpenMP team on Triton's thread, and two
        teams on two cores stop spinning between regions, which doubled a served step
        (docs/cpu-engine-history.md, second round; seen again in the eighth). The thread
        count's part is tested (test_attention.py)."""
        generator = torch.Generator().manual_seed(_SEED)
        nearest = total = 0
        for trial in range(4):
            rows = 2 + 3 * trial
            lengths = torch.randint(1, 700, (rows,), generator=generator)
            width = int(lengths.max()) + 37 * trial
            shape = (rows, kv_heads, width, dim)
            keys, values = (torch.randn(shape, generator=generator).bfloat16() for _ in range(2))
            query = torch.randn(rows, kv_heads, groups, dim, generator=generator).bfloat16()
            batched = self.decode(query, keys, values, DecodeRows(lengths), dim**-0.5)
            exact = _float64_decode(query, keys, values, lengths, dim**-0.5)
            if not _close(batched, exact):
                return False
            nearest += int((batched == exact.to(torch.bfloat16)).sum())
            total += exact.numel()
            for row in range(rows):
                own = int(lengths[row])
                alone = self.decode(query[row : row + 1], keys[row : row + 1, :, :own],
                                    values[row : row + 1, :, :own],
                                    DecodeRows(lengths[row : row + 1]), dim**-0.5)  # fmt: skip
                if not torch.equal(alone[0], batched[row]):
                    return False
        return (
            nearest >= _NEAREST_SHARE * total
            and self._causal_agrees(kv_heads, groups, dim)
            and self._windowed_agrees(kv_heads, groups, dim)
        )

    def _causal_agrees(self, kv_heads: int, groups: int, dim: int) -> bool:
        generator = torch.Generator().manual_seed(_SEED + 1)
        rows, length = 3, 45
        query = torch.randn(rows, kv_heads * groups, length, dim, generator=generator).bfloat16()
        keys, values = (torch.randn(rows, kv_heads, length, dim, generator=generator).bfloat16()
                        for _ in range(2))  # fmt: skip
        batched = self.causal(query, keys, values, dim**-0.5)
        exact = torch.nn.functional.scaled_dot_product_attention(
            query.double(), keys.double(), values.double(), is_causal=True, enable_gqa=True
        ).transpose(1, 2)
        if not _close(batched, exact.flatten(2)):
            return False
        shorter = length - 7  # a shorter prompt alone gives its positions the same bits
        alone = self.causal(query[1:2, :, :shorter], keys[1:2, :, :shorter],
                            values[1:2, :, :shorter], dim**-0.5)  # fmt: skip
        return torch.equal(alone[0], batched[1, :shorter])

    def _windowed_agrees(self, kv_heads: int, groups: int, dim: int) -> bool:
        """A sliding window and a soft cap, decoding and causally, against float64's (within a
        bfloat16 step), as windowed.py orders them."""
        generator = torch.Generator().manual_seed(_SEED + 2)
        rows, length, window, cap = 3, 40, 9, 2.0
        heads, scaling = kv_heads * groups, dim**-0.5
        query = torch.randn(rows, heads, length, dim, generator=generator).bfloat16()
        keys, values = (torch.randn(rows, kv_heads, length, dim, generator=generator).bfloat16()
                        for _ in range(2))  # fmt: skip
        causal = self.causal(query, keys, values, scaling, window=window, softcap=cap)
        grouped = [t.double().repeat_interleave(groups, 1) for t in (keys, values)]
        scores = torch.matmul(query.double(), grouped[0].transpose(-1, -2)) * scaling
        scores = torch.tanh(scores / cap) * cap
        scores = scores.masked_fill(~windowed.causal_allowed(length, window), float("-inf"))
        exact = torch.matmul(scores.softmax(-1), grouped[1])
        if not _close(causal, exact.transpose(1, 2).flatten(2)):
            return False
        last = query[:, :, -1:].transpose(1, 2).reshape(rows, kv_heads, groups, dim)
        lengths = torch.full((rows,), length)
        decoded = self.decode(last.contiguous(), keys, values, DecodeRows(lengths), scaling,
                              window=window, softcap=cap)  # fmt: skip
        return torch.equal(decoded, causal[:, -1])


def _close(mine: torch.Tensor, exact: torch.Tensor) -> bool:
    """Within one bfloat16 step of `exact` everywhere (of `_FLOOR` at least)."""
    step = exact.abs().clamp(min=_FLOOR) * 2**-7
    return not bool(((mine.double() - exact).abs() > step).any())


def _float64_decode(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                    lengths: torch.Tensor, scaling: float) -> torch.Tensor:  # fmt: skip
    columns = torch.arange(keys.shape[2])[None, :] < lengths[:, None]
    scores = torch.matmul(query.double(), keys.double().transpose(-1, -2)) * scaling
    scores = scores.masked_fill(~columns[:, None, None, :], float("-inf"))
    return torch.matmul(scores.softmax(-1), values.double()).flatten(1)


def attention_kernel(ops: FusedOps | None, dtype: torch.dtype, kv_heads: int, groups: int,
                     dim: int) -> AttentionKernel | None:  # fmt: skip
    """The compiled attention for these heads, or None (PyTorch's, logged) where the library
    is missing, has no AVX-512, the dtype is not bfloat16 or the start-up check fails."""
    why = None
    if ops is None or ops.vector_exp is None:
        why = "no compiled library with AVX-512"
    elif dtype != torch.bfloat16:
        why = f"{dtype} (bfloat16 only)"
    else:
        kernel = AttentionKernel(ops)
        try:
            if kernel.agrees(kv_heads, groups, dim):
                return kernel
            why = "its start-up check failed"
        except ValueError as error:
            why = str(error)
    log.log(logging.WARNING if why.startswith("its") else logging.INFO,
            "attention: PyTorch's fused attention (%s)", why)  # fmt: skip
    return None
