"""A `TokenSink` that records what the engine sends, for in-process engine tests."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from tritonbox_triton.engine.prompt_logprobs import PromptScores
from tritonbox_triton.engine.scheduler import EngineFinish, TopLogprobs


class CollectingSink:
    def __init__(self, cancel_after: int | None = None) -> None:
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.top: list[TopLogprobs] = []
        self.calls = 0
        self.sizes: list[int] = []  # the tokens of each on_tokens call
        self.finish: EngineFinish | None = None
        self.error: str | None = None
        self.cancelled = False
        self.done = threading.Event()
        self._cancel_after = cancel_after
        self.tokens_when_cancel_seen: int | None = None
        self.prompt: PromptScores | None = None
        self.prompt_before_tokens = False  # on_prompt came before any on_tokens

    def is_cancelled(self) -> bool:
        cancelled = self._cancel_after is not None and len(self.tokens) >= self._cancel_after
        if cancelled and self.tokens_when_cancel_seen is None:
            self.tokens_when_cancel_seen = len(self.tokens)
        return cancelled

    def on_tokens(
        self,
        tokens: list[int],
        logprobs: list[float],
        finish: EngineFinish | None,
        top: Sequence[TopLogprobs] = (),
    ) -> None:
        self.tokens += tokens
        self.logprobs += logprobs
        self.top += top
        self.calls += 1
        self.sizes.append(len(tokens))
        if finish is not None:
            self.finish = finish
            self.done.set()

    def on_prompt(self, scores: PromptScores) -> None:
        self.prompt = scores
        self.prompt_before_tokens = self.calls == 0

    def on_error(self, message: str) -> None:
        self.error = message
        self.done.set()

    def on_cancelled(self) -> None:
        self.cancelled = True
        self.done.set()

    def wait(self, timeout_s: float = 120.0) -> CollectingSink:
        assert self.done.wait(timeout_s), "the engine did not finish the request in time"
        return self


@pytest.fixture
def make_sink() -> type[CollectingSink]:
    return CollectingSink
