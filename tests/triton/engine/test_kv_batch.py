"""Joining and dropping rows of the right-padded batch cache."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from tritonbox_triton.engine.kv_batch import COLUMN_HEADROOM, BatchedKVCache, prefilled_layers

LAYERS = 2


def sequence_cache(length: int, value: float) -> DynamicCache:
    cache = DynamicCache()
    for layer in range(LAYERS):
        kv = torch.full((1, 3, length, 4), value, dtype=torch.bfloat16)
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
    assert _row_values(batch, 1, 5) == [2.0, 2.0, 2.0, 0.0, 0.0]
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


def test_a_row_written_over_a_longer_one_that_left_has_no_stale_keys() -> None:
    batch = BatchedKVCache(query_groups=3)
    batch.add_sequence(sequence_cache(3, 1.0))
    batch.add_sequence(sequence_cache(9, 5.0))
    batch.keep_rows([0])
    batch.add_sequence(sequence_cache(2, 7.0))
    assert _row_values(batch, 1, 9) == [7.0, 7.0] + [0.0] * 7


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
    """Steps read views, so the buffers keep headroom: a row growing past a padding block, or
    the longest row leaving, moves no keys; a long row leaving frees its columns once they are
    more than twice what is used."""
    batch = BatchedKVCache(query_groups=3)
    batch.add_sequence(sequence_cache(40, 1.0))
    batch.add_sequence(sequence_cache(30, 2.0))
    buffers = batch.key_buffers.data_ptr()
    for _ in range(COLUMN_HEADROOM):  # past the first padding block of 16 columns
        batch.decode_inputs()
        batch.advance()
    assert batch.columns == 40 + COLUMN_HEADROOM
    assert batch.key_buffers.data_ptr() == buffers
    batch.keep_rows([1])  # the longest left
    batch.decode_inputs()
    assert batch.key_buffers.data_ptr() == buffers
    assert _row_values(batch, 0, 3) == [2.0, 2.0, 2.0]
    batch.add_sequence(sequence_cache(1000, 3.0))
    batch.keep_rows([0])  # the long one left: its columns go
    batch.decode_inputs()
    assert batch.key_buffers.shape[3] <= 2 * batch.width + COLUMN_HEADROOM
    assert _row_values(batch, 0, 3) == [2.0, 2.0, 2.0]
