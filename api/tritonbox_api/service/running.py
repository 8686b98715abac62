"""A prediction while it runs, as its consumers see it: its events, and a way to ask it to stop.

Consumers (a route's response, a POST cancel, a disconnect watcher, shutdown) never end a
prediction themselves: `cancel()` only asks, and the prediction's producer task
(service/producer.py) does the stopping, recording and releasing, once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from tritonbox_api.db.models import Prediction
from tritonbox_api.service.prepare import PreparedGeneration
from tritonbox_common.log_probs import TopLogprobs

log = logging.getLogger(__name__)


@dataclass
class Ended:
    """The last event of a prediction: its completed record."""

    prediction: Prediction
    retryable: bool = False  # failed because Triton was down or restarting


@dataclass(frozen=True, slots=True)
class ChoiceText:
    """A piece of another choice's text (OpenAI's `n` > 1); the first choice's is a plain str."""

    index: int
    text: str


Event = str | ChoiceText | Ended  # a piece of output text, or the end
# One token's id, log-prob and (when asked for) its most likely alternatives: a generated
# token's, or with `echo` a prompt token's (the first has no log-prob: None, None).
TokenLogprob = tuple[int, float | None, TopLogprobs | None]


@dataclass(eq=False)
class RunningPrediction:
    id: str
    prepared: PreparedGeneration
    # The other choices (OpenAI's `n` > 1): the same request with their own seeds and ids.
    extra: list[PreparedGeneration] = field(default_factory=list)
    # The producer's events for the one consumer of `events()`.
    queue: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    # An event the coalescer took from the queue but could not join (another choice's text):
    # the next one out, before the queue's.
    held: Event | None = None
    # Set by the producer: the engine stream, the one thing a cancellation may interrupt.
    generation: asyncio.Task[None] | None = None
    producer: asyncio.Task[None] | None = None
    cancel_reason: str | None = None
    # Its engine requests' `stop` already went out (a batch line stopped for a live request,
    # PredictionService): the producer's clean-up sends none again.
    engine_stopped: bool = False
    ended: Ended | None = None
    # With `prepared.logprobs`: each choice's entries (indexed as the choices), one per token
    # (with `echo` the prompt's first), each appended before its text is.
    logprobs: list[list[TokenLogprob]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.logprobs = [[] for _ in range(1 + len(self.extra))]

    @property
    def engine_request_ids(self) -> list[str]:
        """Its engine requests' ids: one per choice."""
        return [each.request.request_id for each in (self.prepared, *self.extra)]

    def cancel(self, reason: str) -> None:
        """Ask the prediction to stop; idempotent, from any task, before or after it started."""
        if self.cancel_reason is not None or self.ended is not None:
            return
        self.cancel_reason = reason
        log.info("prediction %s: cancelling (%s)", self.id, reason)
        if self.generation is not None:
            self.generation.cancel()

    def attach(self, generation: asyncio.Task[None]) -> None:
        """The producer's engine stream; a cancel that came first applies to it at once."""
        self.generation = generation
        if self.cancel_reason is not None:
            generation.cancel()

    def end(self, ended: Ended) -> None:
        self.ended = ended
        self.queue.put_nowait(ended)

    async def wait(self) -> Ended:
        """The end, without consuming the events (POST cancel, shutdown)."""
        if self.producer is not None:
            # Shielded: the waiter may be cancelled (its client left); the producer must not.
            await asyncio.shield(self.producer)
        assert self.ended is not None, "the producer always ends its prediction"
        return self.ended

    async def events(self) -> AsyncGenerator[Event, None]:
        """Text pieces, then `Ended`. Leaving early (a client gone) cancels the prediction.

        Pieces that queued up while the consumer was busy (a loaded event loop, a slow client)
        come as one: a consumer that falls behind then pays for one chunk and one write instead
        of one per token, and catches up. The text is the same, only cut in fewer pieces.
        """
        try:
            while True:
                if self.held is None:
                    event = await self.queue.get()
                else:
                    event, self.held = self.held, None
                end: Ended | None = None
                if isinstance(event, str):
                    event, end = self._coalesce(event)
                yield event
                if end is not None:
                    yield end
                if isinstance(event, Ended) or end is not None:
                    return
        finally:
            # Synchronous on purpose: a generator closed by a cancellation must not await.
            self.cancel("its consumer left")

    def _coalesce(self, text: str) -> tuple[str, Ended | None]:
        """`text` joined with the pieces already queued behind it, and the end if it is there
        too (kept apart: the end is never merged into text)."""
        if self.queue.empty():  # the common case when keeping up: nothing to join
            return text, None
        pieces = [text]
        while not self.queue.empty():
            event = self.queue.get_nowait()
            if isinstance(event, Ended):
                return "".join(pieces), event
            if isinstance(event, ChoiceText):  # another choice's: not joined, left for next
                self.held = event
                return "".join(pieces), None
            pieces.append(event)
        return "".join(pieces), None

    async def result(self) -> Prediction:
        async for event in self.events():
            if isinstance(event, Ended):
                return event.prediction
        raise AssertionError("a prediction always ends with Ended")
