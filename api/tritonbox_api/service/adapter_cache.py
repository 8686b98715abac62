"""A worker's converted adapters: TensorRT-LLM's tensors by sha256, bounded in bytes.

For a 7-8B base one rank-64 adapter converts to hundreds of MB, so a count says nothing of the
memory held: ADAPTER_CACHE_BYTES bounds the sum, least recently used evicted first. The adapter
just loaded is kept even when it alone is larger (it is about to be sent; dropping it would
read and convert it again on every request). A load runs once however many requests wait for
the same adapter: a burst of them must not read and convert it once each, side by side.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from tritonbox_common.client import LoraInputs


def size_of(inputs: LoraInputs) -> int:
    return int(getattr(inputs.weights, "nbytes", 0)) + int(getattr(inputs.config, "nbytes", 0))


class ConvertedCache:
    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._kept: OrderedDict[str, LoraInputs] = OrderedDict()
        self._bytes = 0
        self._loading: dict[str, asyncio.Future[LoraInputs]] = {}

    @property
    def held_bytes(self) -> int:
        return self._bytes

    def __contains__(self, sha256: str) -> bool:
        return sha256 in self._kept

    def get(self, sha256: str) -> LoraInputs | None:
        inputs = self._kept.get(sha256)
        if inputs is not None:
            self._kept.move_to_end(sha256)
        return inputs

    def put(self, sha256: str, inputs: LoraInputs) -> LoraInputs:
        old = self._kept.pop(sha256, None)
        if old is not None:
            self._bytes -= size_of(old)
        self._kept[sha256] = inputs
        self._bytes += size_of(inputs)
        while self._bytes > self._max_bytes and len(self._kept) > 1:
            _, evicted = self._kept.popitem(last=False)
            self._bytes -= size_of(evicted)
        return inputs

    async def get_or_load(
        self, sha256: str, load: Callable[[], Awaitable[LoraInputs]]
    ) -> LoraInputs:
        """The kept tensors, or `load()`'s, shared by every caller that asks meanwhile."""
        kept = self.get(sha256)
        if kept is not None:
            return kept
        pending = self._loading.get(sha256)
        if pending is None:
            pending = asyncio.ensure_future(self._load_and_keep(sha256, load))
            self._loading[sha256] = pending
            pending.add_done_callback(lambda _: self._loading.pop(sha256, None))
        # Shielded: one waiter leaving (its client gone) must not cancel the others' load.
        return await asyncio.shield(pending)

    async def _load_and_keep(
        self, sha256: str, load: Callable[[], Awaitable[LoraInputs]]
    ) -> LoraInputs:
        # Kept before the load's future is done: a caller arriving between the future's end
        # and its waiters' turns finds the tensors, where it found neither them nor the load.
        return self.put(sha256, await load())
