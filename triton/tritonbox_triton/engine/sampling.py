"""Choosing one sequence's next token from its logits, with that request's own settings.

Each row of a batch is processed on its own: a mixed batch holds greedy and sampled requests,
each with its penalties, word lists and seeded generator. The order of the warpers (penalties,
temperature, top-k, top-p) is the one `transformers.generate()` uses, so greedy results match
it. A sampled token is drawn from the same distribution as generate() draws from, by inverse CDF
from the request's seeded generator (reproducible per seed, whatever the batch), not by
torch.multinomial's one random number per vocabulary entry: the same seed gives another draw
than generate().

Log-probs (the chosen token's, and the top alternatives') are the log-softmax of the logits after
the penalties, the min_tokens and bad-word bans and (when sampling) the temperature, before top-k
and top-p cut the tail: the distribution the token was drawn from, before truncation. Greedy
(temperature 0, top_k 1) divides by no temperature, so with no penalties they are the model's own.

A guided request (structured output, grammar.py) also masks what its grammar forbids, after the
bans, so its log-probs are those of the constrained distribution it was sampled from.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import torch

from .params import SamplingParams
from .truncation import Ids, draw_index, kept_ids
from .words import WordRules

if TYPE_CHECKING:  # xgrammar is imported by whoever compiles guides (model.py), not here
    from .grammar import GuideState

# Candidates rejected by the bad-word text check before giving up on sampling and taking the
# best remaining token: a bound, so a pathological word list cannot stall the batch.
MAX_REJECTIONS = 32


@dataclass(slots=True)
class TokenChoice:
    token: int
    logprob: float
    # The `num_top_logprobs` most likely tokens of the same distribution, best first.
    top_ids: list[int] = field(default_factory=list)
    top_logprobs: list[float] = field(default_factory=list)


@dataclass
class SequenceState:
    """What the sampler needs to know about one sequence's history."""

    params: SamplingParams
    prompt: list[int]
    words: WordRules
    generated: list[int] = field(default_factory=list)
    counts: Counter[int] = field(default_factory=Counter)
    generator: torch.Generator = field(init=False)
    guide: GuideState | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.generator = torch.Generator().manual_seed(self.params.seed)
        if self.params.guide is not None:
            self.guide = self.params.guide.matcher(self.params.end_id)

    def append(self, token: int) -> None:
        self.generated.append(token)
        self.counts[token] += 1

    def context(self) -> list[int]:
        return self.prompt + self.generated


def _apply_penalties(logits: torch.Tensor, state: SequenceState) -> None:
    params = state.params
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(state.prompt) | state.counts.keys()), dtype=torch.long)
        scores = logits[seen]
        logits[seen] = torch.where(
            scores < 0, scores * params.repetition_penalty, scores / params.repetition_penalty
        )
    if (params.presence_penalty or params.frequency_penalty) and state.counts:
        ids = torch.tensor(list(state.counts.keys()), dtype=torch.long)
        counts = torch.tensor(list(state.counts.values()), dtype=logits.dtype)
        logits[ids] -= params.presence_penalty + params.frequency_penalty * counts


def _greedy_token(logits: torch.Tensor, words: WordRules, context: list[int]) -> int:
    """The best token that completes no bad word (`logits` changed in place)."""
    for _ in range(MAX_REJECTIONS):
        token = int(torch.argmax(logits))
        if not words.completes_bad_word(context, token):
            return token
        logits[token] = float("-inf")
        if torch.isneginf(logits).all():
            return token
    return int(torch.argmax(logits))


def _sampled_token(
    kept: Ids, values: npt.NDArray[np.float32], state: SequenceState, context: list[int]
) -> int:
    """A token drawn among `kept` (ascending ids; `values` their logits) that completes no bad
    word: a rejected one leaves the draw, as if its logit were -inf."""
    for _ in range(MAX_REJECTIONS):
        token = int(kept[draw_index(values, state.generator)])
        if not state.words.completes_bad_word(context, token):
            return token
        still = kept != token
        kept, values = kept[still], values[still]
        if kept.size == 0:
            return token
    return int(kept[np.argmax(values)])


def end_banned(state: SequenceState) -> bool:
    """Whether min_tokens still bans this sequence's end id."""
    return state.params.end_id >= 0 and len(state.generated) < state.params.min_tokens


def choose_token(logits: torch.Tensor, state: SequenceState) -> TokenChoice:
    """Pick the next token for one sequence; `logits` is its float32 row (modified in place)."""
    params = state.params
    guide = state.guide
    if guide is not None and guide.finished:
        # The grammar ended without an end id (-1, ignore_eos): report the end the scheduler
        # knows, the request's end id, which it never emits.
        return TokenChoice(token=params.end_id, logprob=0.0)
    unbanned = logits.clone() if guide is not None else logits
    _apply_penalties(logits, state)
    if end_banned(state):
        logits[params.end_id] = float("-inf")
    context = state.context()
    for token in state.words.banned_tokens(context):
        logits[token] = float("-inf")
    if guide is not None:
        guide.mask(logits)
        if torch.isneginf(logits).all():
            # min_tokens or a bad word banned all the grammar allows: the grammar wins, as an
            # answer outside it is never one.
            logits = unbanned
            guide.mask(logits)

    if not params.greedy:
        logits = logits.div_(params.temperature)  # the row is this call's to change
    logprobs = torch.log_softmax(logits, dim=-1)
    if params.greedy:
        token = _greedy_token(logits, state.words, context)
    else:
        kept = kept_ids(logits, logprobs, params.top_k, params.top_p)
        token = _sampled_token(kept, logits.numpy()[kept], state, context)
    if guide is not None:
        guide.accept(token)  # the mask allowed it, so the matcher takes it
    choice = TokenChoice(token=token, logprob=float(logprobs[token]))
    if params.num_top_logprobs > 0:
        choice.top_ids, choice.top_logprobs = top_logprobs(logprobs, params.num_top_logprobs)
    return choice


def top_logprobs(logprobs: torch.Tensor, count: int) -> tuple[list[int], list[float]]:
    """The `count` most likely ids of a row and their log-probs, most likely first; equal ones
    by id, as argmax takes the first of equal maxima, so a greedy choice leads its equals
    (topk orders them as it likes: bfloat16 logits tie often enough to see)."""
    threshold = torch.topk(logprobs, min(count, logprobs.numel())).values[-1]
    ids = torch.nonzero(logprobs >= threshold)[:, 0]  # ascending
    order = torch.sort(logprobs[ids], descending=True, stable=True).indices[:count]
    return ids[order].tolist(), logprobs[ids[order]].tolist()
