"""Run predictions: one producer task per prediction streams from Triton, turns token ids into
exact text, cuts stop words, and records the prediction from its start to its end.

The producer is decoupled from the HTTP request that started it (it feeds a queue), so a
prediction can be cancelled from anywhere (`cancel`, a client that goes away) and always ends
with its row completed, whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from sqlmodel import Session

from tritonbox_api import metrics
from tritonbox_api.db import crud
from tritonbox_api.db.models import FinishReason, Prediction, Source, Status, utc_now
from tritonbox_api.db.session import Database
from tritonbox_api.protocol.errors import ApiError
from tritonbox_api.service.outcome import completed_in_memory, observe
from tritonbox_api.service.prepare import PreparedGeneration
from tritonbox_api.text.decoder import IncrementalDecoder
from tritonbox_api.text.stop_words import StopStringMatcher
from tritonbox_api.triton_gateway import TritonGateway, TritonUnavailableError
from tritonbox_common.client import TritonRequestError

log = logging.getLogger(__name__)


@dataclass
class Ended:
    """The last event of a prediction: its completed record."""

    prediction: Prediction
    retryable: bool = False  # failed because Triton was down or restarting


Event = str | Ended  # a piece of output text, or the end


@dataclass
class RunningPrediction:
    id: str
    prepared: PreparedGeneration
    queue: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    task: asyncio.Task[None] | None = None

    async def events(self) -> AsyncGenerator[Event, None]:
        """Text pieces, then `Ended`. Leaving early cancels the prediction.

        Pieces that queued up while the consumer was busy (a loaded event loop, a slow client)
        come as one: a consumer that falls behind then pays for one chunk and one write instead
        of one per token, and catches up. The text is the same, only cut in fewer pieces.
        """
        try:
            while True:
                event = await self.queue.get()
                end: Ended | None = None
                if isinstance(event, str):
                    event, end = self._coalesce(event)
                yield event
                if end is not None:
                    yield end
                if isinstance(event, Ended) or end is not None:
                    return
        finally:
            if self.task is not None and not self.task.done():
                self.task.cancel()

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
            pieces.append(event)
        return "".join(pieces), None

    async def result(self) -> Prediction:
        async for event in self.events():
            if isinstance(event, Ended):
                return event.prediction
        raise AssertionError("a prediction always ends with Ended")


@dataclass
class _Progress:
    output: list[str] = field(default_factory=list)
    completion_tokens: int = 0
    time_to_first_token_s: float | None = None
    finish_reason: FinishReason | None = None


class PredictionService:
    def __init__(
        self,
        *,
        gateway: TritonGateway,
        database: Database,
        max_concurrent: int,
        log_predictions: bool = True,
    ) -> None:
        self._gateway = gateway
        self._database = database
        self._max_concurrent = max_concurrent
        self._log = log_predictions
        self._running: dict[str, RunningPrediction] = {}

    def start(
        self,
        prepared: PreparedGeneration,
        *,
        tokenizer: Any,
        source: Source,
        model: str,
        sent: dict[str, Any],
    ) -> RunningPrediction:
        """Start generating; 429 when MAX_CONCURRENT_REQUESTS predictions already run."""
        if len(self._running) >= self._max_concurrent:
            metrics.REJECTED.labels("overloaded").inc()
            raise ApiError(
                429,
                f"the api is generating its maximum of {self._max_concurrent} predictions "
                "(MAX_CONCURRENT_REQUESTS); retry shortly",
                type="rate_limit_error",
                headers={"Retry-After": "1"},
            )
        record = Prediction(
            id=crud.new_prediction_id(),
            status=Status.PROCESSING,
            source=source,
            model=model,
            input=sent,
            applied=prepared.applied,
            prompt_tokens=prepared.prompt_tokens,
            started_at=utc_now(),
        )
        running = RunningPrediction(id=record.id, prepared=prepared)
        self._running[record.id] = running
        running.task = asyncio.create_task(self._produce(running, record, tokenizer))
        return running

    async def cancel(self, prediction_id: str) -> bool:
        """Cancel a running prediction and wait until its row is saved; False if not running."""
        running = self._running.get(prediction_id)
        if running is None or running.task is None:
            return False
        running.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(running.task)
        return True

    async def cancel_all(self) -> None:
        for prediction_id in list(self._running):
            await self.cancel(prediction_id)

    def _insert(self, record: Prediction) -> asyncio.Task[Any] | None:
        if not self._log:
            return None
        row: dict[str, Any] = dict(
            id=record.id,
            source=record.source,
            model=record.model,
            input=record.input,
            applied=record.applied,
            prompt_tokens=record.prompt_tokens,
        )

        def insert(session: Session) -> Prediction:
            return crud.create_prediction(session=session, **row)

        # Not awaited before generating: the insert overlaps the engine's prefill.
        return asyncio.create_task(self._database.run(insert))

    async def _produce(
        self, running: RunningPrediction, record: Prediction, tokenizer: Any
    ) -> None:
        metrics.IN_FLIGHT.inc()
        inserted = self._insert(record)
        started = time.perf_counter()
        progress = _Progress()
        status, error, retryable = Status.SUCCEEDED, None, False
        try:
            await self._generate(running, tokenizer, progress, started)
        except asyncio.CancelledError:
            status, progress.finish_reason = Status.CANCELED, FinishReason.CANCELED
        except TritonUnavailableError as failure:
            status, error, progress.finish_reason = Status.FAILED, str(failure), FinishReason.ERROR
            retryable = True
        except TritonRequestError as failure:
            status, error, progress.finish_reason = Status.FAILED, str(failure), FinishReason.ERROR
            # A restarting Triton answers "unknown model" before its models are back.
            retryable = progress.completion_tokens == 0 and not await self._gateway.is_ready()
        except Exception:
            log.exception("prediction %s failed", running.id)
            status, error = (
                Status.FAILED,
                "internal error: the api could not finish this prediction",
            )
            progress.finish_reason = FinishReason.ERROR
        finally:
            total = time.perf_counter() - started
            final = await self._complete(record, inserted, status, error, progress, total)
            self._running.pop(running.id, None)
            metrics.IN_FLIGHT.dec()
            observe(final)
            running.queue.put_nowait(Ended(final, retryable))

    async def _generate(
        self, running: RunningPrediction, tokenizer: Any, progress: _Progress, started: float
    ) -> None:
        prepared = running.prepared
        decoder = IncrementalDecoder(tokenizer)
        matcher = StopStringMatcher(prepared.stop_words)

        def emit(text: str) -> None:
            if text:
                progress.output.append(text)
                running.queue.put_nowait(text)

        request = prepared.request
        async with contextlib.aclosing(self._gateway.stream(request)) as chunks:
            async for chunk in chunks:
                if not chunk.ids:
                    continue
                if progress.time_to_first_token_s is None:
                    progress.time_to_first_token_s = time.perf_counter() - started
                progress.completion_tokens += len(chunk.ids)
                emit(matcher.push(decoder.push(chunk.ids)))
                if matcher.stopped:
                    # Closing the stream (leaving this block) stops the engine's request too.
                    progress.finish_reason = FinishReason.STOP_WORD
                    return
        emit(matcher.push(decoder.flush()))
        emit(matcher.flush())
        if matcher.stopped:
            progress.finish_reason = FinishReason.STOP_WORD
        elif progress.completion_tokens >= request.max_tokens:
            progress.finish_reason = FinishReason.LENGTH
        else:
            progress.finish_reason = FinishReason.STOP

    async def _complete(
        self,
        record: Prediction,
        inserted: asyncio.Task[Any] | None,
        status: Status,
        error: str | None,
        progress: _Progress,
        total_time_s: float,
    ) -> Prediction:
        values: dict[str, Any] = dict(
            id=record.id,
            status=status,
            output="".join(progress.output),
            finish_reason=progress.finish_reason,
            error=error,
            completion_tokens=progress.completion_tokens,
            time_to_first_token_s=progress.time_to_first_token_s,
            total_time_s=total_time_s,
        )
        if inserted is None:
            return completed_in_memory(record, values)

        def complete(session: Session) -> Prediction:
            return crud.complete_prediction(session=session, **values)

        try:
            # Shielded: a second cancellation must not lose the row's ending.
            await asyncio.shield(inserted)
            return await asyncio.shield(self._database.run(complete))
        except Exception:
            log.exception("could not save prediction %s", record.id)
            return completed_in_memory(record, values)
