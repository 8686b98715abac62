"""Joining and dropping rows of the right-padded batch cache."""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from tritonbox_triton.engine.kv_batch import COLUMN_HEADROOM, BatchedKVCache, prefilled_layers

LAYERS = 2


def sequence_cache(length: int, value: float, dim: int = 4) -> DynamicCache:
    cache = DynamicCache()
    for layer in range(LAYERS):
        kv = torch.full((1, 3, length, dim), value, dtype=torch.bfloat16)
        cache.update(kv, kv.clone(), layer)
    return cache


def _row_values(batch: BatchedKVCache, row: int, columns: int) -> list[float]:
    """Layer 0's key value in each column of `row` (each test sequence is one constant)."""
    return batch.key_buffers[0, row, 0, :columns, 0].float().tolist()


def test_rows_keep_their_keys_from_column_zero() -> None:
    batch = BatchedKVCache(query_groups=3)
    batch.add_sequence(sequence_cache(5, 1.0))
    batch.add_sequence(sequence_cache(3, 2.0))
    assert (batch.rows, batch.columns) == (2, 5)
    assert batch.lengths.tolist() == [5, 3]
    assert _row_values(batch, 1, 3) == [2.0, 2.0, 2.0]  # past them: its twin's, masked
    valid, positions = batch.decode_inputs()
    assert positions.tolist() == [[5], [3]]  # where each row's next key goes
    assert valid.shape[1] == batch.width and batch.width % 16 == 0  # a whole padding block
    assert valid[:, :7].tolist() == [[True] * 6 + [False], [True] * 4 + [False] * 3]


def test_a_lone_row_decodes_with_its_twin() -> None:
    batch = BatchedKVCache(query_groups=3)
    batch.add_sequence(sequence_cache(6, 1.0))
    batch.add_sequence(sequence_cache(2, 2.0))
    batch.keep_rows([1])
    assert (batch.rows, batch.columns) == (1, 2)
    valid, positions = batch.decode_inputs()
    assert positions.tolist() == [[2], [2]]
    assert torch.equal(valid[0], valid[1]) and int(valid[0].sum()) == 3
    assert _row_values(batch, 1, 2) == [2.0, 2.0]  # the twin holds a copy
    batch.keep_rows([])
    assert batch.rows == 0


def test_advance_adds_a_column_to_every_row() -> None:
    batch = BatchedKVCache(query_groups=3)
    batch.add_sequence(sequence_cache(2, 1.0))
    batch.add_sequence(sequence_cache(4, 1.0))
    batch.advance()
    assert batch.lengths.tolist() == [3, 5]


def test_a_row_written_over_a_longer_one_that_left_sees_only_its_own_keys() -> None:
    """What the longer row wrote past the new row's length stays (finite), masked."""
    batch = BatchedKVCache(query_groups=3)
    batch.add_sequence(sequence_cache(3, 1.0))
    batch.add_sequence(sequence_cache(9, 5.0))
    batch.keep_rows([0])
    batch.add_sequence(sequence_cache(2, 7.0))
    assert _row_values(batch, 1, 2) == [7.0, 7.0]
    valid, _ = batch.decode_inputs()
    assert valid[1].tolist()[:9] == [True] * 3 + [False] * 6
    assert torch.isfinite(batch.key_buffers).all() and torch.isfinite(batch.value_buffers).all()


def test_survivors_fill_the_gaps_and_only_they_move() -> None:
    """The scheduler's order after rows end: a survivor keeps its row, the last ones fill the
    gaps, and no row's keys shift."""
    batch = BatchedKVCache(query_groups=3)
    for length, value in ((8, 1.0), (7, 2.0), (6, 3.0), (7, 4.0)):
        batch.add_sequence(sequence_cache(length, value))
    untouched = batch.key_buffers[:, 1:3].clone()
    batch.keep_rows([3, 1, 2])  # row 0 ended; row 3 takes its place
    assert (batch.rows, batch.columns) == (3, 7)
    assert batch.lengths.tolist() == [7, 7, 6]
    assert _row_values(batch, 0, 7) == [4.0] * 7
    assert torch.equal(batch.key_buffers[:, 1:3], untouched)


def test_any_other_order_is_kept_too() -> None:
    batch = BatchedKVCache(query_groups=3)
    for length, value in ((3, 1.0), (4, 2.0), (2, 3.0)):
        batch.add_sequence(sequence_cache(length, value))
    batch.keep_rows([2, 0])  # row 0 comes from a row before it: every row is copied at once
    assert batch.lengths.tolist() == [2, 3]
    assert _row_values(batch, 0, 2) == [3.0, 3.0]
    assert _row_values(batch, 1, 3) == [1.0, 1.0, 1.0]


def test_sequences_added_together_are_as_added_one_at_a_time() -> None:
    """A prefill's sequences join in one call (the buffers fitted once): the same rows, lengths
    and keys as joining one by one, behind a row that was there before."""
    lengths, values = (3, 9, 2, 5, 7), (2.0, 3.0, 4.0, 5.0, 6.0)
    together, apart = BatchedKVCache(query_groups=3), BatchedKVCache(query_groups=3)
    for batch in (together, apart):
        batch.add_sequence(sequence_cache(4, 1.0))
    together.add_prefilled(
        *(prefilled_layers(sequence_cache(n, v)) for n, v in zip(lengths, values, strict=True))
    )
    for n, v in zip(lengths, values, strict=True):
        apart.add_sequence(sequence_cache(n, v))
    assert together.lengths.tolist() == apart.lengths.tolist() == [4, *lengths]
    assert together.width == apart.width
    for name in ("key_buffers", "value_buffers"):
        mine, theirs = getattr(together, name), getattr(apart, name)
        rows, columns = together.rows, together.columns
        assert torch.equal(mine[:, :rows, :, :columns], theirs[:, :rows, :, :columns])
    assert _row_values(together, 2, 9) == [3.0] * 9


def test_the_cache_is_not_copied_each_time_the_longest_row_grows_or_leaves() -> None:
    """Steps read views, so the buffers are reserved with room to spare: a row growing past a
    padding block, or the longest row leaving, moves no keys."""
    batch = BatchedKVCache(query_groups=3, rows=16)
    batch.add_sequence(sequence_cache(40, 1.0))
    batch.add_sequence(sequence_cache(30, 2.0))
    buffers = batch.key_buffers.data_ptr()
    for _ in range(COLUMN_HEADROOM):  # past the first padding block of 16 columns
        batch.decode_inputs()
        batch.advance()
    assert batch.columns == 40 + COLUMN_HEADROOM
    for rows in ([1, 0], [0]):  # the rows swapped, then the longest left
        batch.keep_rows(rows)
        batch.decode_inputs()
        assert batch.key_buffers.data_ptr() == buffers
    assert _row_values(batch, 0, 3) == [2.0, 2.0, 2.0]


def _resident_kib(tensor: torch.Tensor) -> float:
    """How much of `tensor`'s memory is in memory: its pages the kernel marks present."""
    page = mmap.PAGESIZE
    first = tensor.data_ptr() // page
    count = -(-(tensor.data_ptr() + tensor.numel() * tensor.element_size()) // page) - first
    with open("/proc/self/pagemap", "rb") as pagemap:  # 8 bytes a page; bit 63: present
        pagemap.seek(first * 8)
        entries = struct.unpack(f"{count}Q", pagemap.read(count * 8))
    return sum(entry >> 63 for entry in entries) * page / 1024


@pytest.mark.skipif(not Path("/proc/self/pagemap").exists(), reason="the kernel's count: Linux")
def test_memory_follows_the_keys_written_not_the_reservation() -> None:
    """16 rows are reserved, two short ones written: only theirs is resident. A long row's
    columns go back to the system once it has left, at the next step."""
    batch = BatchedKVCache(query_groups=3, rows=16)
    batch.add_sequence(sequence_cache(40, 1.0, dim=64))
    batch.add_sequence(sequence_cache(30, 2.0, dim=64))
    column_kib = LAYERS * 3 * 64 * 2 / 1024  # a row's column in every layer and head
    assert batch.key_buffers.shape[1] == 16
    assert _resident_kib(batch.key_buffers) <= 2 * 64 * column_kib  # two rows, a page each
    batch.add_sequence(sequence_cache(1000, 3.0, dim=64))
    assert _resident_kib(batch.key_buffers) >= 1000 * column_kib
    batch.keep_rows([0, 1])  # the long one left
    batch.decode_inputs()
    assert _resident_kib(batch.key_buffers) <= 3 * (2 * 64 + COLUMN_HEADROOM) * column_kib
    assert batch.key_buffers[:, 2, :, 2 * 64 + 2 * COLUMN_HEADROOM :].abs().max() == 0
    assert _row_values(batch, 0, 3) == [1.0] * 3
