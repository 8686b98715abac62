"""The KV buffers' memory: private anonymous mappings, whose pages cost nothing until written.

The kernel hands out such a mapping's pages on first touch, zero-filled, and takes them back on
`MADV_DONTNEED` (reading them again gives zeros). So the batch's buffers can be reserved for
the most rows the engine takes and for columns well past its longest row, and hold only what
is written: resident memory follows the rows' keys (each row's own, rounded up to a page, or
those of a longer row that was there before), not the reservation. PyTorch's tensors are
written in full when the buffers are remade (zeroed, then the old keys copied in): as a busy
engine's batch grew from 2 rows to 16 and its longest prompt with it, that took ~1 s of 14 on
mixed traffic (2 cores; page faults on ~0.6 GB at a time, on one thread). Linux and macOS both
have the calls, and `mmap` is in the standard library.
"""

from __future__ import annotations

import math
import mmap

import torch


class Buffers:
    """One zero-filled tensor of `shape` [layers, rows, kv heads, columns, head_dim] in an
    anonymous mapping of its own; each (layer, row, head)'s columns start on a page (the column
    capacity is a multiple of `column_unit`). Unmapped once no view of it is left."""

    def __init__(self, shape: tuple[int, int, int, int, int], dtype: torch.dtype) -> None:
        self.shape = shape
        self._column_bytes = shape[4] * dtype.itemsize
        self._unit = column_unit(shape[4], dtype)
        if shape[3] % self._unit:
            raise ValueError(f"{shape[3]} columns do not start each row's keys on a page")
        count = math.prod(shape)
        # MAP_PRIVATE: a shared mapping's pages survive MADV_DONTNEED.
        self._map = mmap.mmap(-1, max(count * dtype.itemsize, 1), flags=mmap.MAP_PRIVATE)
        self.tensor = torch.frombuffer(self._map, dtype=dtype, count=count).view(shape)

    def release_columns(self, start: int) -> None:
        """Give back every row's columns from `start` (rounded up to a page) on, in every layer
        and head: they read as zeros after."""
        layers, rows, heads, columns, _ = self.shape
        edge = -(-start // self._unit) * self._unit
        for slot in range(layers * rows * heads) if edge < columns else ():
            self._map.madvise(mmap.MADV_DONTNEED, (slot * columns + edge) * self._column_bytes,
                              (columns - edge) * self._column_bytes)  # fmt: skip


def column_unit(head_dim: int, dtype: torch.dtype) -> int:
    """The fewest columns that fill whole pages: a column capacity of a multiple of this starts
    every row's keys on a page, so that a row's columns past its length can be given back."""
    column_bytes = head_dim * dtype.itemsize
    return mmap.PAGESIZE // math.gcd(mmap.PAGESIZE, column_bytes)
