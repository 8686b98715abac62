"""A KV cache for a batch whose sequences come and go between decode steps.

Each running sequence is one row of preallocated key/value buffers, all layers in one tensor
each. A row's keys start at column 0 and it writes its next one after its own last: rows are
right-padded, and every row's keys stay where they were put however the batch changes. The
attention pads each row's keys to a multiple of a block of columns, alone or in a batch, so that
a row's sums are the same bits whatever its neighbours (attention.py): a decode step attends
over `decode_width` columns, and the columns past a row's length are masked. A decode step
writes one column per row in place (`DynamicCache`'s concatenation copied the whole cache per
step, a fifth of a 16-row step's time). A new sequence is prefilled alone and copied into the
next free row; when sequences finish, the last survivors move into the rows they left. The
buffers are reserved for the engine's most rows and for twice the longest row's columns, in
memory that is resident only where keys were written (kv_memory.py). A row that joins writes
over what a row that left had there: past its own length that is masked, never read by the
attention kernel and multiplied by an exact zero by PyTorch's, and finite (keys once written, or
a fresh page's zeros). Columns past twice the longest row's go back to the system once it
leaves; the buffers grow (one copy) only when the longest row passes its reservation, and are
freed when the batch empties. Keys and values are kept in the model's dtype.

A lone sequence decodes as two identical rows (`shown_rows`): PyTorch multiplies a single row
by another kernel than two or more (oneDNN's), whose sums round differently in bfloat16, so a
request would answer differently alone than beside others. With at least two rows every request
goes through the same kernel, whatever its neighbours (tests/triton/engine).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .attention import decode_width
from .kv_memory import Buffers, column_unit

# Columns the buffers reserve beyond the widest row at least (`BatchedKVCache._fit`).
COLUMN_HEADROOM = 64


class _SlotLayer(DynamicLayer):
    """One layer's keys and values as transformers' forward sees them: views of the batch's
    buffers, `[rows, heads, decode width, head_dim]`, each row's new key written after its own
    last (the forward is given the step's mask, `decode_inputs`)."""

    def __init__(self, batch: BatchedKVCache, index: int) -> None:
        super().__init__()
        self._batch = batch
        self._index = index

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if key_states.shape[-2] != 1:
            raise ValueError("the batch cache takes one new token per row")
        batch = self._batch
        rows = key_states.shape[0]
        positions = batch.shown_lengths
        keys = batch.key_buffers[self._index]
        values = batch.value_buffers[self._index]
        keys[torch.arange(rows), :, positions] = key_states[:, :, 0]
        values[torch.arange(rows), :, positions] = value_states[:, :, 0]
        self.keys = keys[:rows, :, : batch.width]
        self.values = values[:rows, :, : batch.width]
        return self.keys, self.values

    def show(self, rows: int, columns: int) -> None:
        self.keys = self._batch.key_buffers[self._index, :rows, :, :columns]
        self.values = self._batch.value_buffers[self._index, :rows, :, :columns]
        self.is_initialized = True


# Per layer: keys, values [rows, heads, length, head_dim].
Layers = list[tuple[torch.Tensor, torch.Tensor]]


def prefilled_layers(cache: DynamicCache) -> Layers:
    # Llama-style models only have full-attention DynamicLayers, which hold `keys`/`values`.
    return [(layer.keys, layer.values) for layer in cache.layers]  # type: ignore[union-attr,misc]


class BatchedKVCache:
    """The decode batch's cache and its rows' lengths."""

    def __init__(self, query_groups: int = 1, *, rows: int = 2) -> None:
        self._groups = query_groups  # query heads per kv head: the attention's shape
        self._reserved_rows = max(rows, 2)  # the most rows expected (a lone row has a twin)
        self.cache: DynamicCache | None = None
        self._layers: list[_SlotLayer] = []
        # [layers, row capacity, kv heads, column capacity, head_dim], the model's dtype
        self.key_buffers = torch.zeros(0)
        self.value_buffers = torch.zeros(0)
        self._memory: tuple[Buffers, Buffers] | None = None  # the buffers' mappings
        self._written = 0  # the most columns any row may have written since last given back
        self.lengths = torch.zeros(0, dtype=torch.long)  # per row: its keys, from column 0

    @property
    def rows(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def columns(self) -> int:
        """The longest row's keys."""
        return int(self.lengths.max()) if self.rows else 0

    @property
    def shown_rows(self) -> int:
        """Rows of the next forward pass: a lone sequence runs twice (see the module's text)."""
        return 2 if self.rows == 1 else self.rows

    @property
    def shown_lengths(self) -> torch.Tensor:
        """Each shown row's length: where its next key goes."""
        return self.lengths.expand(self.shown_rows) if self.rows == 1 else self.lengths

    @property
    def width(self) -> int:
        """Columns the next decode step attends over (its new keys included)."""
        return self._width_for(self.columns + 1)

    def _width_for(self, columns: int) -> int:
        _, _, kv_heads, _, dim = self.key_buffers.shape
        return decode_width(columns, self.key_buffers.dtype, kv_heads, self._groups, dim)

    def _allocate(self, like: Layers) -> None:
        """Empty buffers shaped like `like`'s layers; `_fit` gives them rows and columns."""
        keys = like[0][0]
        self._layers = [_SlotLayer(self, index) for index in range(len(like))]
        shape = (len(like), 0, keys.shape[1], 0, keys.shape[3])  # reserved by the first _fit
        self.key_buffers = torch.zeros(shape, dtype=keys.dtype)
        self.value_buffers = torch.zeros(shape, dtype=keys.dtype)
        self.cache = DynamicCache()
        self.cache.layers = list(self._layers)

    def _fit(self, rows: int, columns: int) -> None:
        """Room for `rows` rows and at least `columns` columns. Steps read views of the buffers
        (the attention kernel takes any strides), so a reservation has room to spare: the
        engine's most rows, and twice the columns asked for, which cost memory only once
        written (kv_memory.py). Past it the buffers are remade and the rows' keys copied once
        (a copy of 16 rows of 700 columns moves ~0.5 GB)."""
        layers, have_rows, heads, have_columns, dim = self.key_buffers.shape
        if rows <= have_rows and columns <= have_columns:
            self._give_back(columns)
            return
        have_rows = max(have_rows, self._reserved_rows)
        while have_rows < rows:
            have_rows *= 2
        unit = column_unit(dim, self.key_buffers.dtype)
        capacity = -(-max(2 * columns, columns + COLUMN_HEADROOM) // unit) * unit
        used_rows, used_columns = self.shown_rows, min(self.columns, columns)
        memory = []
        for name in ("key_buffers", "value_buffers"):
            old: torch.Tensor = getattr(self, name)
            new = Buffers((layers, have_rows, heads, capacity, dim), old.dtype)
            new.tensor[:, :used_rows, :, :used_columns] = old[:, :used_rows, :, :used_columns]
            setattr(self, name, new.tensor)
            memory.append(new)
        self._memory = (memory[0], memory[1])
        self._written = columns

    def _give_back(self, columns: int) -> None:
        """The columns past twice `columns` (and the headroom) go back to the system, once
        rows that left had written there: memory follows the batch, as a long row leaves."""
        roomy = 2 * columns + COLUMN_HEADROOM
        if self._written > roomy and self._memory is not None:
            for memory in self._memory:
                memory.release_columns(roomy)
            self._written = roomy
        self._written = max(self._written, columns)

    def _show(self) -> None:
        if self.rows == 1:  # the lone sequence's twin: row 1 holds a copy of row 0
            for buffers in (self.key_buffers, self.value_buffers):
                buffers[:, 1, :, : self.columns] = buffers[:, 0, :, : self.columns]
        for layer in self._layers:
            layer.show(self.shown_rows, self.columns)

    def add_sequence(self, cache: DynamicCache) -> None:
        """Copy the prefilled cache of one sequence in as the last row."""
        self.add_prefilled(prefilled_layers(cache))

    def add_prefilled(self, *sequences: Layers) -> None:
        """Copy sequences' keys and values (each per layer, [1, heads, length, dim]) in as the
        last rows, in order. The buffers are fitted once for all of them: one at a time, a wave
        of 16 grew them four times over and took ~1.3 ms a sequence."""
        if not sequences:
            return
        if not self._layers:
            self._allocate(sequences[0])
        lengths = [int(prefilled[0][0].shape[2]) for prefilled in sequences]
        first = self.rows
        self._fit(max(first + len(sequences), 2), self._width_for(max(self.columns, *lengths) + 1))
        for offset, (prefilled, length) in enumerate(zip(sequences, lengths, strict=True)):
            row = first + offset
            for buffers, states in ((self.key_buffers, 0), (self.value_buffers, 1)):
                buffers[:, row, :, :length] = torch.stack([layer[states][0] for layer in prefilled])
        self.lengths = torch.cat([self.lengths, torch.tensor(lengths)])
        self._show()

    def keep_rows(self, rows: list[int]) -> None:
        """Keep only these rows, in this order. Only the rows that change place are copied
        when each comes from its own place or later (as when survivors fill the gaps finished
        rows left, the scheduler's order): copying every row took ~0.25 s at 16 rows of ~170
        columns, a stall each time a request ended."""
        if not rows:
            self.cache, self._layers = None, []  # the buffers go: an idle engine holds none
            self.key_buffers, self.value_buffers = torch.zeros(0), torch.zeros(0)
            self._memory, self._written = None, 0
            self.lengths = torch.zeros(0, dtype=torch.long)
            return
        index = torch.tensor(rows, dtype=torch.long)
        columns = self.columns
        moves = [(to, row) for to, row in enumerate(rows) if row != to]
        if all(row > to for to, row in moves):
            for to, row in moves:
                for buffers in (self.key_buffers, self.value_buffers):
                    buffers[:, to, :, :columns] = buffers[:, row, :, :columns]
        else:
            for buffers in (self.key_buffers, self.value_buffers):
                kept = buffers[:, :, :, :columns].index_select(1, index)
                buffers[:, : len(rows), :, :columns] = kept
        self.lengths = self.lengths.index_select(0, index)
        self._show()

    def decode_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """For one new token per shown row: which of `width` columns each row attends (bool
        [rows, width]: its keys and the new one) and its position ([rows, 1])."""
        width = self.width
        self._fit(self.shown_rows, width)
        lengths = self.shown_lengths
        valid = torch.arange(width)[None, :] <= lengths[:, None]
        return valid, lengths[:, None].clone()

    def advance(self) -> None:
        """Record that the last forward pass appended one real token to every row."""
        self.lengths = self.lengths + 1
        for layer in self._layers:
            layer.show(self.shown_rows, self.columns)
