"""bfloat16 products by AMX tiles, at any row count, for the decode step and the model's forward
alike.

On a CPU with AMX PyTorch's bfloat16 products are oneDNN's. At a decode step's few rows a product
is bound by reading its weight, and oneDNN's prepacked products read SmolLM2-135M's layers at ~16
GB/s on 2 Xeon cores where memory gives ~26; a step's products are most of its time
(docs/cpu-engine.md). amx_linear.c reads them at ~21 GB/s. SmolLM2-135M's 30 layers on 2 Xeon
cores: 10.2 against oneDNN's 12.3–12.8 ms at 2 and 16 rows, 20.4 against 27.4 at 128, 33.9
against 41.5 at 256, 58.3 against 53.1 at 512 (a prefill chunk), 121 against 107 at 1024.

It sums in its own order (each output's float32 sum over the inner size in ascending tiles,
whatever the row count), so it must be the model's forward's product too, or the engine's step
would no longer be the forward bit for bit (cpu-engine.md, "Exactness"): `attach` (load_model)
gives each decoder layer's projections the kernel, and `PackedLayer` takes the same packed
weights. A row's bits then depend on nothing beside it: a request's tokens are the same alone
or in any batch, a prompt the same in one pass or beside others. oneDNN's are not (its rows at
512 inner columns or more round otherwise at a few hundred rows than at a thousand). The packed
weights are a second copy of the layers' weights (SmolLM2-135M: 212 MB).
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .dtype import cpu_flags
from .float_logits import COLUMNS, pack
from .fused_build import open_library
from .linear_kernel import Linear
from .probe import near_exact, probe_input

log = logging.getLogger(__name__)

ROWS = 4096  # the most rows the kernel takes (as fast as oneDNN's or faster up to here)
ATTRIBUTE = "tb_amx"  # where `attach` leaves a projection's `Packed`
_P, _L = ctypes.c_void_p, ctypes.c_long
# (outputs, inner size) of the start-up check, and the row counts whose bits must agree
CHECKS = ((40, 64), (36, 576), (20, 1536))
CHECK_ROWS = (1, 2, 15, 16, 17, 33, 64, 129, 200)
CHECK_SIZE = 256  # rows of the start-up check's input


@dataclass(frozen=True)
class Packed:
    """Projections' weights packed as one (amx_linear.c's layout); each member's outputs
    start at `first` (a whole block of 16)."""

    products: AmxProducts
    weight: torch.Tensor  # [blocks, inner / 2, 16, 2]
    first: int
    outputs: int

    def linear(self, bias: torch.Tensor | None) -> Linear:
        return self.products.linear(self, bias)


class AmxProducts:
    """The compiled kernel (`library`'s `amx_linear`)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._kernel = library.amx_linear
        self._kernel.argtypes = [_P, _L, _P, _L, _L, _P, _P, _L, ctypes.c_int]
        self._kernel.restype = ctypes.c_int

    def pack(self, weights: Sequence[torch.Tensor]) -> list[Packed]:
        """Weights that read the same input packed as one where each but the last has whole
        blocks of outputs, else one by one."""
        if any(weight.shape[0] % 16 for weight in weights[:-1]):
            return [packed for weight in weights for packed in self.pack([weight])]
        joined = pack(torch.cat([weight.detach() for weight in weights]))
        members, start = [], 0
        for weight in weights:
            members.append(Packed(self, joined, start, weight.shape[0]))
            start += weight.shape[0]
        return members

    def joined(self, weights: Sequence[torch.Tensor]) -> Packed:
        """`weights` packed as one product, whatever their blocks: an output's sums are the
        same in whichever block and column of a tile it lies."""
        weight = torch.cat([weight.detach() for weight in weights])
        return Packed(self, pack(weight), 0, weight.shape[0])

    def linear(self, packed: Packed, bias: torch.Tensor | None) -> Linear:
        """`x ↦ x · weightᵀ + bias` for bfloat16 `x` of any leading shape."""
        inner = packed.weight.shape[1] * 2
        chunks, blocks = inner // COLUMNS, -(-packed.outputs // 16)
        weight = packed.weight[packed.first // 16 :]
        bias32 = None if bias is None else bias.detach().float().contiguous()

        def linear(x: torch.Tensor) -> torch.Tensor:
            rows = x.numel() // x.shape[-1]
            if rows == 0:
                return x.new_empty(*x.shape[:-1], packed.outputs)
            flat = x.reshape(rows, -1)
            if flat.shape[1] != inner:  # the kernel reads whole tiles of 32 columns
                flat = F.pad(flat, (0, inner - flat.shape[1]))
            flat = flat.contiguous()
            out = torch.empty(rows, packed.outputs, dtype=torch.bfloat16)
            status = self._kernel(
                flat.data_ptr(), rows, weight.data_ptr(), blocks, chunks,
                None if bias32 is None else bias32.data_ptr(), out.data_ptr(), packed.outputs,
                torch.get_num_threads(),
            )  # fmt: skip
            assert status == 0, f"amx_linear: {status}"
            return out.view(*x.shape[:-1], packed.outputs)

        return linear

    def agree(self) -> bool:
        """Whether the kernel's products are within a rounding of float64's and a row's bits
        the same at every row count in `CHECK_ROWS` (`CHECKS`, with and without a bias)."""
        generator = torch.Generator().manual_seed(65)
        for outputs, inner in CHECKS:
            weight = torch.randn(outputs, inner, generator=generator).bfloat16()
            bias = torch.randn(outputs, generator=generator).bfloat16()
            for b in (None, bias):
                linear = self.pack([weight])[0].linear(b)
                x = probe_input((CHECK_SIZE, inner), generator)
                full = linear(x)
                if not near_exact(full, x, weight, b):
                    return False
                if not all(torch.equal(linear(x[:rows]), full[:rows]) for rows in CHECK_ROWS):
                    return False
        return True


@functools.cache
def load(directory: Path | None = None) -> AmxProducts | None:
    """The kernel where the CPU has AMX and it checks out, built into `directory` (default:
    the user's cache), else None (logged where the CPU has AMX)."""
    if "amx_bf16" not in cpu_flags():
        return None
    try:
        library, _ = open_library(directory)
    except OSError as error:
        log.warning("AMX products unavailable (%s)", error)
        return None
    products = AmxProducts(library)
    probe = torch.zeros(16, 32, dtype=torch.bfloat16)
    if products._kernel(probe.data_ptr(), 16, probe.data_ptr(), 0, 1, None, None, 0, 1) != 0:
        log.warning("AMX products: not compiled in, or AMX not granted to this process")
        return None
    if not products.agree():
        log.warning("AMX products: their check against float64 failed; oneDNN's kept")
        return None
    return products


def attach(layers: Sequence[Sequence[Sequence[Any]]], products: AmxProducts) -> None:
    """Give each projection (`layers`: per layer, groups of linear layers that read the same
    input: packed_layer.groups) the kernel, leaving its `Packed` on it."""
    for groups in layers:
        for group in groups:
            for linear, packed in zip(group, products.pack([m.weight for m in group]), strict=True):
                setattr(linear, ATTRIBUTE, packed)
                linear.forward = packed.linear(linear.bias)


def packed_of(linears: Sequence[Any]) -> Packed | None:
    """`linears`' product as one, where `attach` gave them the kernel: the weight it packed
    them into, or a joined copy where it packed them apart; else None."""
    members = [getattr(linear, ATTRIBUTE, None) for linear in linears]
    packed = [member for member in members if isinstance(member, Packed)]
    if len(packed) < len(members):
        return None
    first, at = packed[0], packed[0].first
    for member in packed:
        if member.weight is not first.weight or member.first != at:
            return first.products.joined([linear.weight for linear in linears])
        at += member.outputs
    return Packed(first.products, first.weight, first.first, at - first.first)
