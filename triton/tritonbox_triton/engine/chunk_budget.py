"""How many prompt tokens a decode step carries while streams run (chunked prefill, filling.py),
from what the engine observes: the time of a plain step, and what a chunk adds to it.

A chunk's token costs its share of the products, about the same anywhere in a prompt, and its
attention over every key before it, which grows with its position: late in a 1,500-token prompt
a token cost ~1.1 ms beside 16 streams where an early one cost ~0.4. A cost per token averaged
over past chunks therefore lagged behind a long prompt's later chunks, and those steps ran
long: the streams' time per token p90 came out at 2.3x steady where the budget meant 1.7x. So
the extra time of a step with chunks is fitted as `per_token` x tokens + `per_key` x (the keys
those tokens attend), by least squares over recent steps, and the next chunk is as long as
costs `CHUNK_SHARE` of a plain step at its own position.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

# A step's chunks may cost about this share of a step without them: the step then takes ~1.7x a
# plain one, under the 2x the streams' time per token is allowed while a prompt comes in, with
# room for a step that runs long.
CHUNK_SHARE = 0.7
# A prompt whose rest costs at most this share is finished in one step (filling.step_chunks):
# the step then takes up to 2x a plain one, the bound, once, where cut at CHUNK_SHARE a short
# prompt (a chat turn of ~35 tokens beside 4 streams) took two or three steps to its first token.
FINISH_SHARE = 1.0
# With several prompts filling, each step gives them CHUNK_SHARE per prompt, up to this: their
# users wait for a first token while the streams' time per token rises (a step at most 3x).
MOST_SHARE = 2.0
FIRST_CHUNK = 32  # tokens, before any step's cost is known
# Chunks are whole multiples of this: oneDNN makes a kernel per row count, once. Late in a long
# prompt even 16 tokens' attention cost more than the share (~50 ms at position 2,000 beside 4
# streams), so the smallest chunk is small.
SMALLEST_CHUNK = 4
_EMA = 0.2  # the weight of a new plain step's time
_DECAY = 0.9  # the weight each older observation keeps in the fit, per new one


class Chunk(Protocol):
    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...


def keys_attended(start: int, tokens: int) -> float:
    """The keys `tokens` prompt tokens from position `start` attend in all (causally)."""
    return tokens * start + tokens * (tokens + 1) / 2


class ChunkBudget:
    """The tokens a decode step carries of filling prompts, from observed step times."""

    def __init__(self, most: int) -> None:
        self.most = most  # prefill_chunk_tokens; 0: no chunks
        self.step_s: float | None = None  # a plain step's time, a moving average
        self.per_token = 0.0  # seconds a chunk token adds, for its products
        self.per_key = 0.0  # seconds each key a chunk token attends adds
        self._sums = [0.0] * 5  # decayed sums of t², t·k, k², t·y, k·y (t tokens, k keys)
        self._passes = [0.0] * 5  # decayed sums of 1, n, n², y, n·y over prefill passes

    def tokens(self, start: int = 0, share: float = CHUNK_SHARE) -> int:
        """How many tokens of a prompt already filled up to `start` the next step carries, for
        chunks that cost `share` of a plain step."""
        if self.most <= 0:
            return 0
        if self.step_s is None or (self.per_token <= 0 and self.per_key <= 0):
            return min(self.most, FIRST_CHUNK)
        allowed = share * self.step_s
        # per_key/2 · n² + (per_token + per_key · (start + 1/2)) · n = allowed
        a, b = self.per_key / 2, self.per_token + self.per_key * (start + 0.5)
        fitting = int(
            allowed / b if a <= 0 else (-b + math.sqrt(b * b + 4 * a * allowed)) / (2 * a)
        )
        fitting -= fitting % SMALLEST_CHUNK
        return max(SMALLEST_CHUNK, min(self.most, fitting))

    def seconds(self, start: int, tokens: int) -> float | None:
        """What `tokens` prompt tokens from position `start` cost to prefill: as a pass of
        their own, fitted as a fixed part and a part per token over recent passes; before any
        pass, by the fit over chunks; None: neither known yet."""
        if (cost := self._pass_seconds(tokens)) is not None:
            return cost
        if self.per_token > 0 or self.per_key > 0:
            return self.per_token * tokens + self.per_key * keys_attended(start, tokens)
        return None

    def whole(self, start: int, tokens: int, limit_s: float) -> bool:
        """Whether the rest of a prompt, `tokens` from `start`, is prefilled whole beside running
        streams: no longer than a chunk's most, and costing at most `limit_s`
        (timings.whole_prefill_s) where the cost is known. A longer prompt comes in chunks on
        any machine: on a fast one a 2,000-token prompt took less than the limit, and the
        streams waited for it whole."""
        if limit_s <= 0 or tokens > self.most:
            return False
        cost = self.seconds(start, tokens)
        return cost is None or cost <= limit_s

    def padding_worth(self) -> int | None:
        """Padding tokens worth adding to a shared pass rather than giving a prompt a pass of its
        own: as many as cost a plain step, about the fixed part of a pass (every weight read
        once). None until both are observed. Beside streams, two prompts of 72 and 445 tokens
        padded into one pass took 1.28 s where passes of their own take ~0.45 s."""
        per_token = self._token_s()
        if self.step_s is None or per_token is None or per_token <= 0:
            return None
        return int(self.step_s / per_token)

    def _token_s(self) -> float | None:
        """A prompt token's cost: by the passes' fit, else the chunks', else the passes' mean
        (which counts their fixed part, so it errs towards passes of their own)."""
        if (fit := _least_squares(self._passes)) is not None:
            return fit[1]
        if self.per_token > 0:
            return self.per_token
        _, n, _, y, _ = self._passes
        return y / n if n > 0 else None

    def passed(self, seconds: float, tokens: int) -> None:
        """A prefill pass of `tokens` prompt tokens in all took `seconds`."""
        n = float(tokens)
        new = (1.0, n, n * n, seconds, n * seconds)
        self._passes = [_DECAY * old + value for old, value in zip(self._passes, new, strict=True)]

    def _pass_seconds(self, tokens: int) -> float | None:
        # A pass's time per token alone would count its fixed part (reading the weights) once
        # per token: a 3-token pass made a 453-token prompt look 2 s long.
        _, n, _, y, _ = self._passes
        if n <= 0:
            return None
        if (fit := _least_squares(self._passes)) is not None:
            fixed, per_token = fit
            return fixed + per_token * tokens
        return y / n * tokens  # passes too alike to tell the parts apart

    def observed(self, seconds: float, chunks: Sequence[Chunk] = ()) -> None:
        """A step took `seconds`, carrying `chunks` of prompts (none: a plain step)."""
        if not chunks:
            self.step_s = (
                seconds if self.step_s is None else ((1 - _EMA) * self.step_s + _EMA * seconds)
            )
            return
        if self.step_s is None:
            return
        extra = max(seconds - self.step_s, 0.0)
        t = float(sum(chunk.end - chunk.start for chunk in chunks))
        k = sum(keys_attended(chunk.start, chunk.end - chunk.start) for chunk in chunks)
        new = (t * t, t * k, k * k, t * extra, k * extra)
        self._sums = [_DECAY * old + value for old, value in zip(self._sums, new, strict=True)]
        self._fit()

    def _fit(self) -> None:
        tt, _, kk, ty, ky = self._sums
        if (fit := _least_squares(self._sums)) is not None:
            self.per_token, self.per_key = fit
            return
        # Too alike to tell apart (or a fit below zero): the keys' part alone, or the tokens'.
        if kk > 0 and ky > 0:
            self.per_token, self.per_key = 0.0, ky / kk
        elif tt > 0:
            self.per_token, self.per_key = max(ty / tt, 0.0), 0.0


def _least_squares(sums: list[float]) -> tuple[float, float] | None:
    """(x, y) from the normal equations [[a, b], [b, c]] · (x, y) = (u, v) of decayed sums
    `sums` = (a, b, c, u, v); None where the two parts are too alike to tell apart, or one
    comes out below zero."""
    a, b, c, u, v = sums
    det = a * c - b * b
    if det <= 1e-9 * a * c:
        return None
    x, y = (u * c - v * b) / det, (v * a - u * b) / det
    return (x, y) if x >= 0 and y >= 0 else None
