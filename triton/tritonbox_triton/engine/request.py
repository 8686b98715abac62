"""What the engine is given and whom it tells: a request, where its results go, who counts them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from . import prompt_logprobs
from .lora_layers import EngineAdapter
from .params import SamplingParams
from .sampling import SequenceState, TokenChoice
from .stats import IterationStats

TopLogprobs = tuple[list[int], list[float]]  # one token's best alternatives: ids, log-probs


class EngineFinish(StrEnum):
    STOP = "stop"  # the end id
    LENGTH = "length"
    STOP_WORD = "stop_word"


class TokenSink(Protocol):
    """Where one request's results go (a Triton response sender, or a test's collector)."""

    def is_cancelled(self) -> bool: ...

    def on_tokens(
        self,
        tokens: list[int],
        logprobs: list[float],
        finish: EngineFinish | None,
        top: Sequence[TopLogprobs] = (),
    ) -> None:
        """New tokens; `finish` is set on the last call. `top`: per token, its request's
        `num_top_logprobs` best (ids, log-probs); empty when it asked for none."""

    def on_error(self, message: str) -> None:
        """The request failed; no further calls follow."""

    def on_cancelled(self) -> None:
        """The request was cancelled by its client; no further calls follow."""

    def on_prompt(self, scores: prompt_logprobs.PromptScores) -> None:
        """The prompt's scores, when asked for: before the request's first `on_tokens`."""


class EngineObserver(Protocol):
    def on_iteration(self, stats: IterationStats) -> None: ...

    def on_tokens(self, count: int) -> None: ...

    def on_finished(self, outcome: str) -> None: ...


class NullObserver:
    def on_iteration(self, stats: IterationStats) -> None:
        pass

    def on_tokens(self, count: int) -> None:
        pass

    def on_finished(self, outcome: str) -> None:
        pass


@dataclass(eq=False)  # identity: two equal requests are still two requests
class EngineRequest:
    prompt: list[int]
    params: SamplingParams
    sink: TokenSink
    stop_words: list[list[int]]
    bad_words: list[list[int]]
    request_id: str = ""
    # Held until the request finishes, so an adapter evicted from the cache meanwhile stays.
    lora: EngineAdapter | None = None

    @property
    def reserved_tokens(self) -> int:
        return len(self.prompt) + self.params.max_tokens


@dataclass
class Running:
    """A request in the decode batch: its sequence so far, and its tokens not sent yet."""

    request: EngineRequest
    state: SequenceState
    held: list[TokenChoice] = field(default_factory=list)  # made, not sent yet (responses.py)
