"""A left-padded KV cache for a batch whose sequences come and go between decode steps.

Each running sequence is one row of preallocated key/value buffers, one pair per layer. Rows are
left-padded to a common length, so every row's newest token sits in the last used column and one
forward pass decodes them all; the attention mask hides the padding and per-row position ids keep
RoPE exact. A decode step writes its new column in place: the cache is not copied per step, as
`DynamicCache`'s concatenation did (a fifth of a 16-row step's time). A new sequence is prefilled
alone and copied into a free row; a finished one is dropped by moving the rows after it up, and
columns that are padding in every remaining row are trimmed so the cache does not keep a dead
sequence's length. The buffers grow by doubling and are freed when the batch empties.

Keys and values are kept in float64, all layers in one tensor each: the attention computes in
float64 (attention.py), so a step converts nothing, and the written-out decode step
(decode_step.py) takes the two tensors as they are.

A lone sequence decodes as two identical rows (`shown_rows`): PyTorch multiplies a single row
by another kernel than two or more (oneDNN's), whose sums round differently in bfloat16, so a
request would answer differently alone than beside others. With at least two rows every request
goes through the same kernel, whatever its neighbours (tests/triton/engine).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

INITIAL_COLUMNS = 256


class _SlotLayer(DynamicLayer):
    """One layer's keys and values: views of the batch's buffers, written in place.

    `keys`/`values` are always the used part, `[rows, heads, columns, head_dim]`, so the
    attention code (which reads `get_seq_length()` and the returned tensors) sees what it would
    see with a `DynamicLayer`.
    """

    def __init__(self, batch: BatchedKVCache, index: int) -> None:
        super().__init__()
        self._batch = batch
        self._index = index

    @property
    def key_buffer(self) -> torch.Tensor:
        return self._batch.key_buffers[self._index]

    @property
    def value_buffer(self) -> torch.Tensor:
        return self._batch.value_buffers[self._index]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows, start = key_states.shape[0], self._batch.columns
        end = start + key_states.shape[-2]
        self.key_buffer[:rows, :, start:end] = key_states
        self.value_buffer[:rows, :, start:end] = value_states
        self.keys = self.key_buffer[:rows, :, :end]
        self.values = self.value_buffer[:rows, :, :end]
        return self.keys, self.values

    def show(self, rows: int, columns: int) -> None:
        self.keys = self.key_buffer[:rows, :, :columns]
        self.values = self.value_buffer[:rows, :, :columns]
        self.is_initialized = True


# Per layer: keys, values [rows, heads, length, head_dim].
Layers = list[tuple[torch.Tensor, torch.Tensor]]


def prefilled_layers(cache: DynamicCache) -> Layers:
    # Llama-style models only have full-attention DynamicLayers, which hold `keys`/`values`.
    return [(layer.keys, layer.values) for layer in cache.layers]  # type: ignore[union-attr,misc]


class BatchedKVCache:
    """The decode batch's cache, its padding mask and its rows' positions."""

    def __init__(self, max_rows: int = 1) -> None:
        self._max_rows = max_rows
        self.cache: DynamicCache | None = None
        self._layers: list[_SlotLayer] = []
        # [layers, row capacity, kv heads, column capacity, head_dim], float64
        self.key_buffers = torch.zeros(0)
        self.value_buffers = torch.zeros(0)
        self.mask = torch.zeros(0, 0, dtype=torch.long)  # [rows, columns]; 1 = a real token

    @property
    def rows(self) -> int:
        return int(self.mask.shape[0])

    @property
    def columns(self) -> int:
        return int(self.mask.shape[1])

    @property
    def shown_rows(self) -> int:
        """Rows of the next forward pass: a lone sequence runs twice (see the module's text)."""
        return 2 if self.rows == 1 else self.rows

    def _allocate(self, like: Layers, columns: int) -> None:
        keys = like[0][0]
        rows = max(self._max_rows, 2)
        self._layers = [_SlotLayer(self, index) for index in range(len(like))]
        # Zeros, not empty: padding columns are masked, but garbage there could be NaN, and
        # 0 × NaN is NaN.
        shape = (len(like), rows, keys.shape[1], columns, keys.shape[3])
        self.key_buffers = torch.zeros(shape, dtype=torch.float64)
        self.value_buffers = torch.zeros(shape, dtype=torch.float64)
        self.cache = DynamicCache()
        self.cache.layers = list(self._layers)

    def _grow(self, rows: int, columns: int) -> None:
        """Room for `rows` rows of `columns` columns, by doubling (a copy of the used part,
        rarely: the first decode steps of a long batch, or a batch over `max_rows`)."""
        have_rows, have_columns = int(self.key_buffers.shape[1]), int(self.key_buffers.shape[3])
        if rows <= have_rows and columns <= have_columns:
            return
        while have_rows < rows:
            have_rows *= 2
        while have_columns < columns:
            have_columns *= 2
        for name in ("key_buffers", "value_buffers"):
            old: torch.Tensor = getattr(self, name)
            new = old.new_zeros(old.shape[0], have_rows, old.shape[2], have_columns, old.shape[4])
            new[:, : self.rows, :, : self.columns] = old[:, : self.rows, :, : self.columns]
            setattr(self, name, new)

    def _show(self) -> None:
        if self.rows == 1:  # the lone sequence's twin: row 1 holds a copy of row 0
            for buffers in (self.key_buffers, self.value_buffers):
                buffers[:, 1, :, : self.columns] = buffers[:, 0, :, : self.columns]
        for layer in self._layers:
            layer.show(self.shown_rows, self.columns)

    def add_sequence(self, cache: DynamicCache) -> None:
        """Copy the prefilled cache of one sequence in as the last row."""
        self.add_prefilled(prefilled_layers(cache))

    def add_prefilled(self, prefilled: Layers) -> None:
        """Copy one sequence's keys and values (per layer, [1, heads, length, dim]) in as the
        last row."""
        length = int(prefilled[0][0].shape[2])
        if not self._layers:
            self._allocate(prefilled, max(INITIAL_COLUMNS, 2 * length))
        rows, width = self.rows, max(self.columns, length)
        self._grow(max(rows + 1, 2), width + 1)
        if width > self.columns and rows:
            # The new sequence is the longest: move the others right, keeping them aligned.
            shift, old = width - self.columns, self.columns
            for buffers in (self.key_buffers, self.value_buffers):
                buffers[:, :rows, :, shift:width] = buffers[:, :rows, :, :old].clone()
                buffers[:, :rows, :, :shift] = 0
        for buffers, states in ((self.key_buffers, 0), (self.value_buffers, 1)):
            buffers[:, rows, :, : width - length] = 0  # a row that left may have been here
            new = torch.stack([layer[states][0] for layer in prefilled])
            buffers[:, rows, :, width - length : width] = new
        new_row = F.pad(torch.ones(1, length, dtype=torch.long), (width - length, 0))
        self.mask = torch.cat([F.pad(self.mask, (width - self.columns, 0)), new_row])
        self._show()

    def keep_rows(self, rows: list[int]) -> None:
        """Keep only these rows, in this order. Only the rows that change place are copied
        when each comes from its own place or later (as when survivors fill the gaps finished
        rows left, the scheduler's order): copying every row took ~0.25 s at 16 rows of ~170
        columns, a stall each time a request ended. Columns that are padding in every kept row
        are trimmed once they are a quarter of the columns: a trim shifts every row."""
        if not rows:
            self.cache, self._layers = None, []  # the buffers go: an idle engine holds none
            self.key_buffers, self.value_buffers = torch.zeros(0), torch.zeros(0)
            self.mask = torch.zeros(0, 0, dtype=torch.long)
            return
        index = torch.tensor(rows, dtype=torch.long)
        mask = self.mask.index_select(0, index)
        used = mask.any(dim=0).nonzero()
        first = int(used[0]) if used.numel() else mask.shape[1]
        first = first if first * 4 >= self.columns else 0
        moves = [(to, row) for to, row in enumerate(rows) if row != to or first]
        if all(row >= to for to, row in moves):
            for to, row in moves:
                for buffers in (self.key_buffers, self.value_buffers):
                    moved = buffers[:, row, :, first : self.columns]
                    buffers[:, to, :, : self.columns - first] = moved.clone() if first else moved
        else:
            for buffers in (self.key_buffers, self.value_buffers):
                kept = buffers[:, :, :, first : self.columns].index_select(1, index)
                buffers[:, : len(rows), :, : self.columns - first] = kept
        self.mask = mask[:, first:]
        self._show()

    def decode_inputs(self) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Attention mask (None if nothing is padded) and position ids of one new token per shown
        row."""
        self._grow(self.shown_rows, self.columns + 1)
        rows = self.mask.expand(self.shown_rows, -1)
        positions = rows.sum(dim=1, keepdim=True)
        if bool(rows.all()):
            return None, positions
        mask = torch.cat([rows, torch.ones(self.shown_rows, 1, dtype=torch.long)], dim=1)
        return mask, positions

    def decode_bias(self, mask: torch.Tensor | None) -> torch.Tensor:
        """`decode_inputs`' mask as the written-out step takes it: float64, 0 where a row attends,
        -inf on its padding."""
        bias = torch.zeros(self.shown_rows, self.columns + 1, dtype=torch.float64)
        if mask is not None:
            bias.masked_fill_(mask == 0, float("-inf"))
        return bias

    def advance(self) -> None:
        """Record that the last forward pass appended one real token to every row."""
        self.mask = torch.cat([self.mask, torch.ones(self.rows, 1, dtype=torch.long)], dim=1)
        for layer in self._layers:
            layer.show(self.shown_rows, self.columns)
