"""A left-padded KV cache for a batch whose sequences come and go between decode steps.

Each running sequence is one row of a `transformers.DynamicCache`. Rows are left-padded to a
common length, so every row's newest token sits in the last column and one forward pass decodes
them all; the attention mask hides the padding and per-row position ids keep RoPE exact. A new
sequence is prefilled alone and joined in; a finished one is dropped, and columns that are
padding in every remaining row are trimmed so the cache does not keep a dead sequence's length.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache


def _layers(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    # Llama-style models only have full-attention DynamicLayers, which hold `keys`/`values`.
    return [(layer.keys, layer.values) for layer in cache.layers]  # type: ignore[union-attr,misc]


def _set_layers(cache: DynamicCache, tensors: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    for layer, (keys, values) in zip(cache.layers, tensors, strict=True):
        layer.keys, layer.values = keys, values  # type: ignore[union-attr]


def _pad_left(tensor: torch.Tensor, columns: int) -> torch.Tensor:
    # KV tensors are [batch, heads, seq, head_dim]: pad the sequence axis at its start.
    return F.pad(tensor, (0, 0, columns, 0)) if columns else tensor


class BatchedKVCache:
    """The decode batch's cache, its padding mask and its rows' positions."""

    def __init__(self) -> None:
        self.cache: DynamicCache | None = None
        self.mask = torch.zeros(0, 0, dtype=torch.long)  # [rows, columns]; 1 = a real token

    @property
    def rows(self) -> int:
        return int(self.mask.shape[0])

    @property
    def columns(self) -> int:
        return int(self.mask.shape[1])

    def add_sequence(self, cache: DynamicCache) -> None:
        """Append the prefilled cache of one sequence as the last row."""
        length = cache.get_seq_length()
        if self.cache is None or self.rows == 0:
            self.cache = cache
            self.mask = torch.ones(1, length, dtype=torch.long)
            return
        width = max(self.columns, length)
        merged = [
            (
                torch.cat([_pad_left(k, width - self.columns), _pad_left(nk, width - length)]),
                torch.cat([_pad_left(v, width - self.columns), _pad_left(nv, width - length)]),
            )
            for (k, v), (nk, nv) in zip(_layers(self.cache), _layers(cache), strict=True)
        ]
        _set_layers(self.cache, merged)
        new_row = F.pad(torch.ones(1, length, dtype=torch.long), (width - length, 0))
        self.mask = torch.cat([F.pad(self.mask, (width - self.columns, 0)), new_row])

    def keep_rows(self, rows: list[int]) -> None:
        """Keep only these rows, in this order, and trim all-padding columns."""
        if not rows:
            self.cache = None
            self.mask = torch.zeros(0, 0, dtype=torch.long)
            return
        assert self.cache is not None
        index = torch.tensor(rows, dtype=torch.long)
        mask = self.mask.index_select(0, index)
        used = mask.any(dim=0).nonzero()
        first = int(used[0]) if used.numel() else mask.shape[1]
        _set_layers(
            self.cache,
            [
                (k.index_select(0, index)[:, :, first:], v.index_select(0, index)[:, :, first:])
                for k, v in _layers(self.cache)
            ],
        )
        self.mask = mask[:, first:]

    def decode_inputs(self) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Attention mask (None if nothing is padded) and position ids of one new token per row."""
        positions = self.mask.sum(dim=1, keepdim=True)
        if bool(self.mask.all()):
            return None, positions
        mask = torch.cat([self.mask, torch.ones(self.rows, 1, dtype=torch.long)], dim=1)
        return mask, positions

    def advance(self) -> None:
        """Record that the last forward pass appended one real token to every row."""
        self.mask = torch.cat([self.mask, torch.ones(self.rows, 1, dtype=torch.long)], dim=1)
