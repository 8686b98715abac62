"""The chunk budget (engine/chunk_budget.py) learns what a chunk's tokens and the keys they attend
cost from step times, and sizes the next chunk to its own position."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from tritonbox_triton.engine.chunk_budget import (
    CHUNK_SHARE,
    FINISH_SHARE,
    FIRST_CHUNK,
    MOST_SHARE,
    SMALLEST_CHUNK,
    ChunkBudget,
    keys_attended,
)
from tritonbox_triton.engine.filling import Filling, step_chunks
from tritonbox_triton.engine.params import SamplingParams
from tritonbox_triton.engine.request import EngineRequest

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


def _learned() -> ChunkBudget:
    """A budget that has timed a plain step and chunks of 32 tokens over 1,200 positions."""
    budget = ChunkBudget(4096)
    budget.observed(STEP_S)
    for start in range(0, 1200, 48):
        chunk = Piece(start, start + 32)
        budget.observed(_step_with(chunk), [chunk])
    return budget


def _filling(length: int) -> Filling:
    params = SamplingParams(max_tokens=1, end_id=2, pad_id=0)
    request = EngineRequest(list(range(3, 3 + length)), params, None, [], [])  # type: ignore[arg-type]
    return Filling(request, (1, 1, 4, torch.float32))


def test_a_prompt_that_fits_a_whole_step_is_finished_in_one() -> None:
    """Cut at CHUNK_SHARE, a chat turn beside a few streams took two or three steps to its
    first token; one whose rest costs at most a plain step (FINISH_SHARE) goes whole."""
    budget = _learned()
    share, finish = budget.tokens(0), budget.tokens(0, FINISH_SHARE)
    assert share < finish
    between = (share + finish) // 2
    chunks = step_chunks([_filling(between)], budget)
    assert [(c.start, c.end, c.last) for c in chunks] == [(0, between, True)]
    longer = step_chunks([_filling(finish + 40)], budget)  # more than a step's worth: cut
    assert [(c.start, c.end, c.last) for c in longer] == [(0, share, False)]
    added = _step_with(Piece(0, between)) - STEP_S
    assert added <= FINISH_SHARE * STEP_S


def test_several_prompts_filling_get_a_larger_share_of_a_step() -> None:
    budget = _learned()
    alone = step_chunks([_filling(3000)], budget)
    three = step_chunks([_filling(3000) for _ in range(3)], budget)
    assert sum(c.end - c.start for c in alone) == budget.tokens(0, CHUNK_SHARE)
    assert sum(c.end - c.start for c in three) == budget.tokens(0, min(3 * CHUNK_SHARE, MOST_SHARE))
    added = _step_with(*(Piece(c.start, c.end) for c in three)) - STEP_S
    assert added <= MOST_SHARE * STEP_S


def test_a_prompt_is_whole_while_it_costs_at_most_the_limit() -> None:
    """timings.whole_prefill_s: a prompt that cheap and no longer than a chunk's most is
    prefilled whole beside streams. Its cost by the fit over chunks, which counts the keys a
    late token attends, then by the passes, a fixed part and a part per token."""
    budget = ChunkBudget(512)
    assert budget.whole(0, 512, 0.5) and not budget.whole(0, 513, 0.5)  # nothing known yet
    budget.passed(0.001, 1000)  # however cheap, longer than a chunk's most: in chunks
    assert not budget.whole(0, 513, 0.5)
    assert not budget.whole(0, 10, 0.0)  # 0: every prompt longer than a chunk in chunks
    budget = _learned()
    cost = PER_TOKEN * 1000 + PER_KEY * keys_attended(0, 1000)
    assert budget.seconds(0, 1000) == pytest.approx(cost, rel=1e-3)
    assert budget.whole(0, 1000, cost * 1.01) and not budget.whole(0, 1000, cost * 0.99)
    assert not budget.whole(2000, 1000, cost * 1.01)  # its keys cost more late in a prompt
    budget.passed(0.012, 3)  # a short pass is mostly its fixed part: 10 ms + 0.4 ms a token
    for tokens in (40, 300, 120):
        budget.passed(0.010 + 0.0004 * tokens, tokens)
    assert budget.seconds(0, 1000) == pytest.approx(0.41, rel=0.02)
    assert budget.whole(0, 1000, 0.42) and not budget.whole(0, 1000, 0.40)


def test_padding_is_worth_what_a_plain_step_costs_in_prompt_tokens() -> None:
    budget = ChunkBudget(512)
    assert budget.padding_worth() is None  # nothing observed: prompts are padded together
    budget.observed(STEP_S)
    budget.passed(0.17, 400)  # one pass: its mean per token counts its fixed part too
    assert budget.padding_worth() == int(STEP_S / (0.17 / 400))
    for tokens in (40, 300, 120):  # 10 ms + 0.4 ms a token: the fit's part per token
        budget.passed(0.010 + 0.0004 * tokens, tokens)
    assert budget.padding_worth() == pytest.approx(STEP_S / 0.0004, abs=1)


def test_a_filling_prompt_to_finish_whole_goes_first_and_whole() -> None:
    budget = _learned()
    long, short = _filling(3000), _filling(600)
    short.whole = True
    assert short.left > budget.tokens(0, FINISH_SHARE)  # cut, were it not whole
    chunks = step_chunks([long, short], budget)
    assert (chunks[0].start, chunks[0].end, chunks[0].last) == (0, 600, True)
    assert sum(c.end - c.start for c in chunks) == max(600, budget.tokens(0, MOST_SHARE))
