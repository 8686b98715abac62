"""A prompt prefilled a chunk at a time beside the decode rows (chunked prefill), or continued
from the keys and values of a prefix another prompt left (prefix_cache.py).

Prefilled in one pass, a long prompt held every running stream for the whole pass: a
2,000-token prompt is ~25 decode steps of work. Here it is cut into chunks, and each chunk rides
along one decode step (decode_step.py): its tokens go through the same products as the rows',
which read the weights once for both, so a step with a chunk costs the step plus the chunk's own
arithmetic. TensorRT-LLM (`enable_chunked_context`) and vLLM (`--enable-chunked-prefill`) do the
same with a token budget per step. Here the budget comes from what the engine observes
(chunk_budget.py): as many tokens as cost about `CHUNK_SHARE` of a step without them, so the
running streams' time per token stays under twice its steady value on any machine and model,
up to `prefill_chunk_tokens` (timings.py). Only prompts longer than that or costing more than
`whole_prefill_s` come in chunks: another is prefilled whole as it arrives (a pass of its own,
or, continuing from a cached prefix, its whole rest in the next step). A prompt whose rest
costs at most `FINISH_SHARE` (a whole plain step) is finished in one step: cut at `CHUNK_SHARE`
it took a step more to its first token and the batch ran emptier. With several prompts filling, the
step's share grows with their number (`CHUNK_SHARE` each, up to `MOST_SHARE`): their users wait
for a first token while the streams' time per token rises. Several prompts may fill at once: the
budget goes to the one with the least left first (`step_chunks`), so a short prompt that arrives
behind a long one is not held for the whole of it (the mean time to first token is least that
way), and the rest of a step's budget goes to the next. A long prompt is passed over only by
prompts shorter than what it has left, and only while they are admitted (the batch's room
bounds them). When no stream runs, what is left of each is prefilled at once (nobody waits for it).

A chunk's queries attend over the prompt's keys up to their own, through the compiled attention
(or windowed.py's explicit one), so a prompt's attention is the same however it was cut; its
products have other row counts than one pass would, which moves values within bfloat16's
rounding, as a shared prefill does (prefill.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .chunk_budget import CHUNK_SHARE, FINISH_SHARE, MOST_SHARE, ChunkBudget
from .kv_batch import Layers
from .request import EngineRequest

KVLayout = tuple[int, int, int, torch.dtype]  # layers, kv heads, head dim, dtype


@dataclass(frozen=True, eq=False)
class PromptChunk:
    """The next `ids` of a prompt from position `start`; `keys`/`values`: per layer the
    prompt's buffers [1, kv heads, prompt length, dim], filled up to `start`, written here up to
    `end`. `last`: whether the prompt ends with it (its logits then wanted)."""

    ids: torch.Tensor
    start: int
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    last: bool

    @property
    def end(self) -> int:
        return self.start + int(self.ids.shape[0])


class Filling:
    """One prompt being prefilled in chunks: its keys and values so far (`done` positions)."""

    def __init__(self, request: EngineRequest, layout: KVLayout,
                 prefix: Layers | None = None) -> None:  # fmt: skip
        """`layout`: the model's layers, kv heads, head dim and dtype; `prefix`: keys and values
        of the prompt's first positions, computed before (prefix_cache.py)."""
        self.request = request
        layers, kv_heads, dim, dtype = layout
        shape = (1, kv_heads, len(request.prompt), dim)
        self.keys = [torch.empty(shape, dtype=dtype) for _ in range(layers)]
        self.values = [torch.empty_like(keys) for keys in self.keys]
        self.done = 0
        self.whole = False  # finished in the next step (BatchPrefill: a short rest)
        if prefix is not None:
            self.done = prefix[0][0].shape[2]
            for index, (keys, values) in enumerate(prefix):
                self.keys[index][:, :, : self.done] = keys
                self.values[index][:, :, : self.done] = values

    @property
    def left(self) -> int:
        return len(self.request.prompt) - self.done

    def chunk(self, budget: int) -> PromptChunk:
        """The next chunk, of at most `budget` tokens (what is left when `budget` is 0)."""
        end = (
            len(self.request.prompt)
            if budget <= 0
            else min(self.done + budget, len(self.request.prompt))
        )
        ids = torch.tensor(self.request.prompt[self.done : end])
        last = end == len(self.request.prompt)
        return PromptChunk(ids, self.done, self.keys, self.values, last)

    def advance(self, chunk: PromptChunk) -> None:
        self.done = chunk.end

    def layers(self) -> Layers:
        """The prompt's keys and values, per layer [1, kv heads, length, dim]."""
        return list(zip(self.keys, self.values, strict=True))


def step_chunks(fillings: list[Filling], budget: ChunkBudget | None) -> list[PromptChunk]:
    """The next chunks, as many tokens as `budget` gives a step (None, or a budget of 0: the
    whole of what is left of each): `fillings` are put in order, those to finish whole first,
    then by what they have left, least first (in place: the chunks are those of its first
    fillings, as many as the budget reaches)."""
    fillings.sort(key=lambda filling: (not filling.whole, filling.left))
    if budget is None or not fillings:
        return _taken(fillings, 0)
    first = fillings[0]
    share = min(CHUNK_SHARE * len(fillings), MOST_SHARE)  # more waiting: more for them
    tokens = budget.tokens(first.done, share)
    if whole := sum(filling.left for filling in fillings if filling.whole):
        return _taken(fillings, max(tokens, whole))  # short rests first, whole
    # Within FINISH_SHARE it is finished now: its first token a step or two sooner.
    finishing = tokens if share >= FINISH_SHARE else budget.tokens(first.done, FINISH_SHARE)
    if tokens > 0 and first.left <= finishing:
        tokens = max(tokens, first.left)
    return _taken(fillings, tokens)


def _taken(fillings: list[Filling], budget: int) -> list[PromptChunk]:
    chunks: list[PromptChunk] = []
    left = budget
    for filling in fillings:
        if budget > 0 and left <= 0:
            break
        chunk = filling.chunk(left if budget > 0 else 0)
        chunks.append(chunk)
        left -= int(chunk.ids.shape[0])
    return chunks
