"""The prefix cache's bookkeeping (engine/prefix_cache.py): whole blocks, the longest shared run,
bytes bounded with the least recently used evicted, and a hash collision never served."""

from __future__ import annotations

import torch

from tritonbox_triton.engine import prefix_cache
from tritonbox_triton.engine.prefix_cache import BLOCK, PrefixCache

LAYERS, HEADS, DIM = 2, 2, 4


def _layers(prompt: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys that say which token made them: each position's values are its token."""
    column = torch.tensor(prompt, dtype=torch.float32)[None, None, :, None]
    keys = column.expand(1, HEADS, len(prompt), DIM).contiguous()
    return [(keys, -keys) for _ in range(LAYERS)]


def _bytes(tokens: int) -> int:
    return tokens * LAYERS * HEADS * DIM * 4 * 2


def test_the_longest_run_of_whole_blocks_short_of_the_last_token() -> None:
    cache = PrefixCache(1 << 20)
    first = list(range(1, 3 * BLOCK + 5))
    cache.add(first, _layers(first))
    assert cache.used == _bytes(3 * BLOCK)  # whole blocks only
    same_start = first[: 2 * BLOCK + 3] + [9999] * 50
    found = cache.lookup(same_start)
    assert found is not None and found[0][0].shape[2] == 2 * BLOCK
    assert torch.equal(
        found[1][0][0, 0, :, 0], torch.tensor(first[: 2 * BLOCK], dtype=torch.float32)
    )
    # The very same prompt: its last token is left to compute.
    exact = first[: 3 * BLOCK]
    found = cache.lookup(exact)
    assert found is not None and found[0][0].shape[2] == 2 * BLOCK
    assert cache.lookup([7] * (3 * BLOCK)) is None
    assert cache.lookup(first[:BLOCK]) is None  # nothing after a whole block
    assert cache.hits == 2 and cache.tokens_saved == 4 * BLOCK


def test_bytes_bounded_least_recently_used_first() -> None:
    prompts = [[seed] * (2 * BLOCK) for seed in range(1, 5)]
    cache = PrefixCache(_bytes(2 * BLOCK) * 3)
    for prompt in prompts[:3]:
        cache.add(prompt, _layers(prompt))
    assert cache.lookup(prompts[0] + [1]) is not None  # the first is now the most recent
    cache.add(prompts[3], _layers(prompts[3]))
    assert cache.used <= cache.capacity
    assert cache.lookup(prompts[1] + [1]) is None  # the least recently used went
    assert all(cache.covers(prompts[i] + [1]) for i in (0, 2, 3))
    too_big = [5] * (8 * BLOCK)
    cache.add(too_big, _layers(too_big))
    assert not cache.covers([*too_big, 1]) and cache.used <= cache.capacity


def test_a_hash_collision_is_not_served(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(prefix_cache, "_chain", lambda tokens, blocks: list(range(blocks)))
    cache = PrefixCache(1 << 20)
    first = [1] * (2 * BLOCK)
    cache.add(first, _layers(first))
    assert cache.lookup([2] * (2 * BLOCK) + [3]) is None  # same hashes, other tokens
    assert cache.lookup([*first, 3]) is not None


def test_off_at_zero_bytes() -> None:
    cache = PrefixCache(0)
    prompt = [1] * (2 * BLOCK)
    cache.add(prompt, _layers(prompt))
    assert cache.used == 0 and cache.lookup([*prompt, 2]) is None
