"""The chunk budget (engine/chunk_budget.py) learns what a chunk's tokens and the keys they attend
cost from step times, and sizes the next chunk to its own position."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tritonbox_triton.engine.chunk_budget import (
    CHUNK_SHARE,
    FIRST_CHUNK,
    SMALLEST_CHUNK,
    ChunkBudget,
    keys_attended,
)

STEP_S, PER_TOKEN, PER_KEY = 0.040, 2e-4, 1e-6


@dataclass(frozen=True)
class Piece:
    start: int
    end: int


def _step_with(*chunks: Piece) -> float:
    """A machine whose chunk tokens cost PER_TOKEN each and PER_KEY per key they attend."""
    extra = sum(PER_TOKEN * (c.end - c.start) + PER_KEY * keys_attended(c.start, c.end - c.start)
                for c in chunks)  # fmt: skip
    return STEP_S + extra


def test_the_first_chunk_is_small_until_steps_are_timed() -> None:
    assert ChunkBudget(512).tokens() == FIRST_CHUNK
    assert ChunkBudget(0).tokens() == 0  # chunks off


def test_it_learns_both_costs_and_a_later_chunk_is_shorter() -> None:
    budget = ChunkBudget(4096)
    budget.observed(STEP_S)
    start = 0
    while start < 2000:  # a long prompt filling, a chunk a step, as the engine sizes them
        tokens = budget.tokens(start)
        chunk = Piece(start, start + tokens)
        budget.observed(_step_with(chunk), [chunk])
        start = chunk.end
    assert budget.per_token == pytest.approx(PER_TOKEN, rel=0.05)
    assert budget.per_key == pytest.approx(PER_KEY, rel=0.05)
    early, late = budget.tokens(0), budget.tokens(1500)
    assert early > late >= SMALLEST_CHUNK
    for start in (0, 500, 1500):  # each chunk adds about CHUNK_SHARE of a plain step, no more
        tokens = budget.tokens(start)
        added = _step_with(Piece(start, start + tokens)) - STEP_S
        assert added <= CHUNK_SHARE * STEP_S
        assert added >= CHUNK_SHARE * STEP_S * 0.6  # rounded down to whole 16s


def test_several_chunks_in_a_step_count_together() -> None:
    budget = ChunkBudget(4096)
    budget.observed(STEP_S)
    for start in range(0, 1200, 48):
        chunks = [Piece(start, start + 32), Piece(100, 116)]
        budget.observed(_step_with(*chunks), chunks)
    assert budget.per_token == pytest.approx(PER_TOKEN, rel=0.05)
    assert budget.per_key == pytest.approx(PER_KEY, rel=0.05)
