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
