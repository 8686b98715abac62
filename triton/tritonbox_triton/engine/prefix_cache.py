"""Prefix caching: the keys and values of prompts already prefilled, kept so that a prompt that
starts the same way (a system prompt, a conversation's earlier turns, the `n` choices of one
request, a batch job's common instructions) continues from them instead of prefilling its start
again (filling.py).

A prompt is kept in whole blocks of `BLOCK` tokens from its start, and found by the chained
hash of its blocks: a new prompt looks up its longest run of whole blocks that another prompt
began with, leaving at least its last token to compute (its logits are what the prefill is
for). The tokens are compared on a hit, so a collision cannot serve another prompt's keys.
Entries are evicted least recently used first, past `capacity` bytes (`prefix_cache_bytes`,
timings.py); each holds its own copy of the keys and values, so the memory counted is the
memory held.

The keys are the model's for those tokens at those positions whatever follows them (attention is
causal), so a prompt continued from a cached prefix gets the prefix's keys as its own prefill
would have made them, within the rounding of the products' row counts (filling.py).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from .kv_batch import Layers

BLOCK = 64  # tokens: a shorter shared start saves less than its lookup and copy cost


@dataclass(eq=False)
class _Entry:
    key: int  # the hash of all its blocks
    tokens: tuple[int, ...]
    layers: Layers  # [1, kv heads, len(tokens), dim] each
    bytes: int


def _chain(tokens: list[int] | tuple[int, ...], blocks: int) -> list[int]:
    """The hash of each run of whole blocks from the start: [h(1 block), h(2 blocks), ...]."""
    hashes, previous = [], 0
    for block in range(blocks):
        previous = hash((previous, tuple(tokens[block * BLOCK : (block + 1) * BLOCK])))
        hashes.append(previous)
    return hashes


class PrefixCache:
    """Prompts' keys and values by their whole blocks, within `capacity` bytes."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.hits = 0
        self.tokens_saved = 0
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # by its longest run's hash
        self._runs: dict[int, tuple[_Entry, int]] = {}  # a run's hash -> an entry, its length
        self._lock = threading.Lock()  # the engine's thread writes; /metrics may read

    def covers(self, prompt: list[int]) -> bool:
        """Whether `lookup` would find a prefix of this prompt (counting nothing)."""
        return self._find(prompt) is not None

    def lookup(self, prompt: list[int]) -> Layers | None:
        """The keys and values of the longest run of whole blocks this prompt shares with a
        kept one, short of its last token; None when none."""
        found = self._find(prompt)
        if found is None:
            return None
        entry, length = found
        with self._lock:
            if entry.key in self._entries:
                self._entries.move_to_end(entry.key)
            self.hits += 1
            self.tokens_saved += length
        return [(k[:, :, :length], v[:, :, :length]) for k, v in entry.layers]

    def _find(self, prompt: list[int]) -> tuple[_Entry, int] | None:
        if self.capacity <= 0 or len(prompt) <= BLOCK:
            return None
        hashes = _chain(prompt, (len(prompt) - 1) // BLOCK)
        with self._lock:
            for blocks in range(len(hashes), 0, -1):
                found = self._runs.get(hashes[blocks - 1])
                length = blocks * BLOCK
                if found is not None and found[0].tokens[:length] == tuple(prompt[:length]):
                    return found[0], length
        return None

    def add(self, prompt: list[int], layers: Layers) -> None:
        """Keep `prompt`'s whole blocks of `layers` (its keys and values from position 0; copied
        here), unless a kept prompt already covers them or they do not fit at all."""
        blocks = len(prompt) // BLOCK
        if self.capacity <= 0 or blocks == 0:
            return
        length = blocks * BLOCK
        per_token = sum(k.element_size() * k[0, :, 0].numel() * 2 for k, _ in layers)
        size = per_token * length
        if size > self.capacity:
            return
        hashes = _chain(prompt, blocks)
        with self._lock:
            if hashes[-1] in self._runs and self._runs[hashes[-1]][1] == length:
                return  # kept already (by this run or a longer prompt's)
            kept = [(k[:, :, :length].clone(), v[:, :, :length].clone()) for k, v in layers]
            entry = _Entry(hashes[-1], tuple(prompt[:length]), kept, size)
            while self._entries and self.used + size > self.capacity:
                self._evict()
            self._entries[hashes[-1]] = entry
            self.used += size
            for run_hash, run in zip(hashes, range(BLOCK, length + 1, BLOCK), strict=True):
                self._runs[run_hash] = (entry, run)

    def _evict(self) -> None:
        _, entry = self._entries.popitem(last=False)
        self.used -= entry.bytes
        blocks = len(entry.tokens) // BLOCK
        for run_hash in _chain(entry.tokens, blocks):
            if self._runs.get(run_hash, (None, 0))[0] is entry:
                del self._runs[run_hash]
