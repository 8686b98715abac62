"""Joining and dropping rows of the left-padded batch cache."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from tritonbox_triton.engine.kv_batch import BatchedKVCache

LAYERS = 2


def sequence_cache(length: int, value: float) -> DynamicCache:
    cache = DynamicCache()
    for layer in range(LAYERS):
        kv = torch.full((1, 3, length, 4), value)
        cache.update(kv, kv.clone(), layer)
    return cache


def test_rows_are_left_padded_to_a_common_length() -> None:
    batch = BatchedKVCache()
    batch.add_sequence(sequence_cache(5, 1.0))
    batch.add_sequence(sequence_cache(3, 2.0))
    assert (batch.rows, batch.columns) == (2, 5)
    assert batch.mask.tolist() == [[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]
    assert batch.cache is not None
    keys = batch.cache.layers[0].keys  # type: ignore[union-attr]
    assert keys is not None
    assert keys.shape == (2, 3, 5, 4)
    assert torch.all(keys[1, :, :2] == 0) and torch.all(keys[1, :, 2:] == 2.0)
    mask, positions = batch.decode_inputs()
    assert positions.tolist() == [[5], [3]]
    assert mask is not None and mask.shape == (2, 6)


def test_dropping_the_longest_row_trims_padding() -> None:
    batch = BatchedKVCache()
    batch.add_sequence(sequence_cache(6, 1.0))
    batch.add_sequence(sequence_cache(2, 2.0))
    batch.keep_rows([1])
    assert (batch.rows, batch.columns) == (1, 2)
    assert batch.mask.tolist() == [[1, 1]]
    mask, positions = batch.decode_inputs()
    assert mask is None  # nothing padded
    assert positions.tolist() == [[2], [2]]  # a lone row decodes with its twin (kv_batch.py)
    assert batch.cache is not None
    keys = batch.cache.layers[0].keys  # type: ignore[union-attr]
    assert keys is not None and keys.shape[0] == 2 and torch.equal(keys[0], keys[1])
    batch.keep_rows([])
    assert batch.rows == 0


def test_advance_adds_a_real_column() -> None:
    batch = BatchedKVCache()
    batch.add_sequence(sequence_cache(2, 1.0))
    batch.advance()
    assert batch.mask.tolist() == [[1, 1, 1]]


def _row_values(batch: BatchedKVCache, row: int) -> list[float]:
    """Layer 0's key value in each column of `row` (each test sequence is one constant)."""
    return batch.key_buffers[0, row, 0, : batch.columns, 0].tolist()


def test_survivors_fill_the_gaps_and_only_they_move() -> None:
    """The scheduler's order after rows end: a survivor keeps its row, the last ones fill the
    gaps. A few columns of padding left in every row stay (trimming shifts every row)."""
    batch = BatchedKVCache(max_rows=4)
    for length, value in ((8, 1.0), (7, 2.0), (6, 3.0), (7, 4.0)):
        batch.add_sequence(sequence_cache(length, value))
    untouched = batch.key_buffers[:, 0].clone()
    batch.keep_rows([3, 1, 2])  # row 0 ended; row 3 takes its place
    assert (batch.rows, batch.columns) == (3, 8)
    assert batch.mask.tolist() == [[0, 1, 1, 1, 1, 1, 1, 1], [0] + [1] * 7, [0, 0] + [1] * 6]
    assert _row_values(batch, 0) == [0.0] + [4.0] * 7
    assert _row_values(batch, 1) == [0.0] + [2.0] * 7
    assert _row_values(batch, 2) == [0.0, 0.0] + [3.0] * 6
    assert not torch.equal(batch.key_buffers[:, 0], untouched)


def test_any_other_order_is_kept_too() -> None:
    batch = BatchedKVCache(max_rows=4)
    for length, value in ((3, 1.0), (4, 2.0), (2, 3.0)):
        batch.add_sequence(sequence_cache(length, value))
    batch.keep_rows([2, 0])  # row 0 comes from a row before it: every row is copied at once
    assert (batch.rows, batch.columns) == (2, 3)  # one column of four was padding: trimmed
    assert _row_values(batch, 0) == [0.0, 3.0, 3.0]
    assert _row_values(batch, 1) == [1.0, 1.0, 1.0]
