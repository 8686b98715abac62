"""The model's final projection, returning float32 logits whatever the model's dtype.

A bfloat16 model's own `lm_head` rounds its logits to bfloat16 before a token is chosen: 8 bits
of mantissa, so near 16 two logits 0.06 apart can become equal, and the tie goes to the lower
id. On SmolLM2's chat question that turned "The" (-1.883 in float32) and "L" (-1.965) into one
value and the answer into French. Every product of bfloat16 operands is exact in float32, so
summing them in float32 and keeping the sum gives the logits as float32 weights would, up to the
order of the sums: that is what the engine chooses tokens and reports log-probs from.

The weight stays in bfloat16, packed once into the C kernels' layout (logits_kernel.c; the same
bytes): AMX tile products where the CPU has AMX, at the cost of oneDNN's bfloat16 product, else
AVX512-BF16 dot products (slower from 8 rows on), else linear_kernel.py's AVX2 sums on the
weight as it is. Without any, a float32 copy of the weight is multiplied by MKL: correct, with
the copy's memory and a slower product, and the log says so. A float32 model's head is
`F.linear` on its own weight, as transformers runs it.
docs/cpu-engine.md has what each costs per step.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .linear_kernel import Products

log = logging.getLogger(__name__)

_P, _L = ctypes.c_void_p, ctypes.c_long
COLUMNS = 32  # the packed weight's columns are padded to whole AMX tiles (32 bfloat16)
# logits_kernel.c's functions, best first: (name, rows padded to a multiple of, what it is)
KERNELS = (
    ("amx_logits", 16, "bfloat16 weights, float32 sums (AMX)"),
    ("bf16_logits", 1, "bfloat16 weights, float32 sums (AVX512-BF16)"),
)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """[vocab, hidden] bfloat16 as the kernels read it: [blocks of 16 rows, column pairs, 16, 2],
    zero-padded to whole blocks and to `COLUMNS`."""
    vocab, hidden = weight.shape
    padded = F.pad(weight, (0, -hidden % COLUMNS, 0, -vocab % 16))
    blocks, pairs = padded.shape[0] // 16, padded.shape[1] // 2
    return padded.view(blocks, 16, pairs, 2).transpose(1, 2).contiguous()


class Float32Logits(nn.Module):
    """`x ↦ x @ weight.T (+ bias)` in float32, for x of the model's dtype, any leading shape."""

    def __init__(
        self,
        head: nn.Linear,
        library: ctypes.CDLL | None,
        kernels: tuple[tuple[str, int, str], ...] = KERNELS,  # the first that runs is taken
        products: Products | None = None,
    ) -> None:
        super().__init__()
        self.weight = head.weight  # the model's own (tied to the embeddings where it is)
        self.bias = head.bias
        self.how = "float32 weights"
        self._kernel: Any = None
        self._rows_multiple = 1
        self._packed: torch.Tensor | None = None
        self._weight32: torch.Tensor | None = None
        self._products: Products | None = None
        if self.weight.dtype == torch.float32:
            return
        if library is not None and self.weight.dtype == torch.bfloat16:
            packed = pack(self.weight.detach())
            for name, multiple, how in kernels:
                kernel = getattr(library, name)
                kernel.argtypes = [_P, _L, _P, _L, _L, _P, _L, ctypes.c_int]
                kernel.restype = ctypes.c_int
                self._kernel, self._rows_multiple, self._packed = kernel, multiple, packed
                probe = torch.zeros(1, self.weight.shape[1], dtype=torch.bfloat16)
                if self._run(probe) is not None:
                    self.how = how
                    return
            self._kernel = self._packed = None
        if products is not None and self.weight.dtype == torch.bfloat16:
            self._products, self.how = products, "bfloat16 weights, float32 sums (AVX2)"
            return
        self._weight32 = self.weight.detach().float()
        self.how = "a float32 copy of the bfloat16 weights (no AMX or AVX512-BF16 kernel here)"
        log.warning("logits: %s, %d MB more memory", self.how, self._weight32.nbytes >> 20)

    def _run(self, flat: torch.Tensor) -> torch.Tensor | None:
        """The kernel's logits for `flat` [rows, hidden], or None where it is not compiled in."""
        assert self._packed is not None
        rows, (blocks, pairs) = flat.shape[0], self._packed.shape[:2]
        x = F.pad(flat, (0, 2 * pairs - flat.shape[1], 0, -rows % self._rows_multiple))
        x = x.contiguous()
        out = torch.empty(x.shape[0], self.weight.shape[0])
        width = pairs if self._rows_multiple == 1 else pairs // 16  # pairs, or AMX tiles
        status = self._kernel(x.data_ptr(), x.shape[0], self._packed.data_ptr(), blocks, width,
                              out.data_ptr(), out.shape[1], torch.get_num_threads())  # fmt: skip
        return out[:rows] if status == 0 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        if self._kernel is not None:
            logits = self._run(flat)
            assert logits is not None  # it ran at start
        elif self._products is not None:
            logits = self._products.sums(flat, self.weight)
        else:
            weight = self.weight if self._weight32 is None else self._weight32
            logits = F.linear(flat.float(), weight)
        if self.bias is not None:
            logits = logits + self.bias.float()
        return logits.view(*x.shape[:-1], logits.shape[-1])
