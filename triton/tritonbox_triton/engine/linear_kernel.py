"""bfloat16 products on CPUs with AVX2 and no native bfloat16, with PyTorch's own bits where
PyTorch sums in their order.

On an AVX2 CPU PyTorch computes a bfloat16 `F.linear` one output at a time (each a dot product
in float32, the same whatever the row count), at ~16 GFLOP/s on 2 cores: slower than MKL's
float32 product from 2 rows on. linear_kernel.c computes every output with the same sums in the
same order, sharing each weight load among a tile of rows and outputs: the model's forward's
bits at about 3× the speed of float32 at 2 rows and 2× at 8 (docs/cpu-engine.md). That makes
bfloat16 the faster number format on such CPUs (dtype.py): half the bytes per step.

On a CPU with AVX-512 and no native bfloat16 PyTorch's bfloat16 products are oneDNN's
emulation, in another order: there the products keep their own order (`Products.own_order`)
and `load_model` gives them to the model's projections too (packed_layer.attach_products), as
amx_linear.py's are on AMX, so the step is still the forward bit for bit and bfloat16 still
reads half float32's bytes. Each output's sum is its own, so a row's bits do not depend on the
rows or outputs beside it.

`load` gives the products only where they are needed: no native bfloat16, AVX2 with FMA, the
library built; checked against `F.linear` on random inputs of several shapes and row counts
(with magnitudes spread over 2^±8, where another order shows most), and where they differ,
against float64 within bfloat16's rounding (AVX-512 only). The head's float32 sums
(float_logits.py) come from the same kernel, unrounded.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .dtype import NATIVE_BF16_FLAGS, cpu_flags
from .fused_build import open_library
from .probe import near_exact, probe_input

log = logging.getLogger(__name__)

Linear = Callable[[torch.Tensor], torch.Tensor]
_P, _L = ctypes.c_void_p, ctypes.c_long
NEEDS = frozenset({"avx2", "fma"})
CHUNK = 64  # the inner size's multiple whose sums match ATen's (linear_kernel.c)
# (outputs, inner size) of the start-up check, and the row counts tried for each
CHECKS = ((40, 64), (36, 576), (12, 1536))
CHECK_ROWS = (1, 2, 3, 4, 5, 8, 17)
ATTRIBUTE = "tb_products"  # where `attach` marks a projection that takes the products


class Products:
    """The compiled products (`library`'s `tb_linear` and `tb_sums`)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self.own_order = False  # True: PyTorch sums otherwise here; the model must take these
        self._linear = library.tb_linear
        self._linear.argtypes = [_P, _L, _P, _L, _L, _P, _P, _P, ctypes.c_int, ctypes.c_bool]
        self._sums = library.tb_sums
        self._sums.argtypes = [_P, _L, _P, _L, _L, _P, ctypes.c_int]
        for function in (self._linear, self._sums):
            function.restype = ctypes.c_int

    def linear(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Linear:
        """`x ↦ F.linear(x, weight, bias)` for bfloat16 `x` of any leading shape, bit for bit;
        `F.linear` itself where the inner size is not a multiple of `CHUNK` (their order there
        is not ATen's), unless the products keep their own order."""
        weight = weight.detach().contiguous()
        outputs, inner = weight.shape
        if inner % CHUNK and not self.own_order:
            return lambda x: F.linear(x, weight, bias)
        bias = None if bias is None else bias.detach().contiguous()  # kept by the closure

        def linear(x: torch.Tensor) -> torch.Tensor:
            flat = x.reshape(-1, inner).float()  # widening is exact: the sums' own operands
            rows = flat.shape[0]
            sums = torch.empty(rows, outputs)
            out = torch.empty(rows, outputs, dtype=torch.bfloat16)
            status = self._linear(flat.data_ptr(), rows, weight.data_ptr(), outputs, inner,
                                  None if bias is None else bias.data_ptr(), sums.data_ptr(),
                                  out.data_ptr(), torch.get_num_threads(),
                                  self.own_order)  # fmt: skip
            assert status == 0, f"tb_linear: {status}"
            return out.view(*x.shape[:-1], outputs)

        return linear

    def sums(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x [rows, inner] · weight [outputs, inner] (bfloat16) in float32, unrounded."""
        flat = x.float().contiguous()
        out = torch.empty(flat.shape[0], weight.shape[0])
        status = self._sums(flat.data_ptr(), flat.shape[0], weight.data_ptr(), weight.shape[0],
                            weight.shape[1], out.data_ptr(), torch.get_num_threads())  # fmt: skip
        assert status == 0, f"tb_sums: {status}"
        return out

    def agree(self) -> bool:
        """Whether `linear` gives `F.linear`'s bits here (`CHECKS`, with and without a bias)."""
        generator = torch.Generator().manual_seed(64)
        for outputs, inner in CHECKS:
            weight = torch.randn(outputs, inner, generator=generator).bfloat16()
            bias = torch.randn(outputs, generator=generator).bfloat16()
            for rows in CHECK_ROWS:
                x = probe_input((rows, inner), generator)
                for b in (None, bias):
                    if not torch.equal(self.linear(weight, b)(x), F.linear(x, weight, b)):
                        return False
        return True

    def close_to_exact(self) -> bool:
        """Whether `linear` is within bfloat16's rounding of float64 products (`CHECKS`)."""
        generator = torch.Generator().manual_seed(65)
        for outputs, inner in CHECKS:
            weight = torch.randn(outputs, inner, generator=generator).bfloat16()
            x = probe_input((17, inner), generator)
            if not near_exact(self.linear(weight)(x), x, weight):
                return False
        return True


def current() -> Products | None:
    """What `load` settled first in this process (the library is the same in every folder, so
    products refused in one are refused in all), else the default folder's."""
    return _settled[0] if _settled else load()


_settled: list[Products | None] = []  # each built library's verdict, in order


@functools.cache
def load(directory: Path | None = None) -> Products | None:
    """The products where this CPU needs them and they give PyTorch's bits, built into
    `directory` (default: the user's cache), else None (logged where they were needed)."""
    flags = cpu_flags()
    if NATIVE_BF16_FLAGS & flags or not flags >= NEEDS:
        return None
    try:
        library, _ = open_library(directory)
    except OSError as error:
        log.warning("bfloat16 products unavailable (%s)", error)
        return None
    products = Products(library)
    if products._sums(None, 0, None, 0, 0, None, 1) != 0:
        log.warning("bfloat16 products: not compiled for this CPU")
        _settled.append(None)
    elif products.agree():
        _settled.append(products)
    elif "avx512f" in flags and products.close_to_exact():
        products.own_order = True  # oneDNN's emulated bfloat16: the model takes these instead
        log.info("bfloat16 products: PyTorch sums in another order here (oneDNN's emulation);"
                 " the model's projections take these")  # fmt: skip
        _settled.append(products)
    else:
        log.warning("bfloat16 products: neither PyTorch's bits nor an AVX-512 CPU here")
        _settled.append(None)
    return _settled[-1]


def attach(layers: Sequence[Sequence[Sequence[Any]]], products: Products) -> None:
    """Give each projection (`layers`: per layer, groups of linear layers: packed_layer.groups)
    the products, where PyTorch's own sum otherwise (`Products.own_order`)."""
    for groups in layers:
        for group in groups:
            for linear in group:
                setattr(linear, ATTRIBUTE, products)
                linear.forward = products.linear(linear.weight, linear.bias)


def attached(linears: Sequence[Any]) -> bool:
    """Whether `attach` gave each of `linears` the products."""
    return all(getattr(linear, ATTRIBUTE, None) is not None for linear in linears)
