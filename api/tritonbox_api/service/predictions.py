"""Run predictions: one producer task per prediction owns it from its start to its end.

The producer streams from Triton (in a child task, the only thing a cancellation interrupts),
turns token ids into exact text, cuts stop words, and then, whatever ended the stream (the
engine, a stop word, `cancel` from a route, a disconnect, shutdown, an error), runs the clean-up
once and to its end: the engine's `stop` with a deadline, the row's completion, the concurrency
slot and the in-flight gauge. Nobody else cancels or completes a prediction.

A prediction of several choices (OpenAI's `n`) runs one engine stream per choice side by side in
that same child task; the clean-up stops each choice's engine request, and the row keeps every
choice (`choices`; `output` is the first's).

Longer than 250 lines because one producer owns a prediction from its start to its end (stream, stop
words, the engine's stop, the row), and its clean-up's guarantees read best in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from tritonbox_api import metrics
from tritonbox_api.db import crud
from tritonbox_api.db.group_commit import PredictionWrites
from tritonbox_api.db.models import FinishReason, Prediction, Source, Status, utc_now
from tritonbox_api.db.session import Database
from tritonbox_api.protocol.errors import ApiError
from tritonbox_api.service import batch_context
from tritonbox_api.service.adapters import NOT_IN_CACHE
from tritonbox_api.service.outcome import completed_in_memory
from tritonbox_api.service.prepare import PreparedGeneration
from tritonbox_api.service.running import (
    ChoiceText,
    Ended,
    Event,
    RunningPrediction,
    TokenLogprob,
)
from tritonbox_api.text.decoder import IncrementalDecoder
from tritonbox_api.text.stop_words import StopStringMatcher
from tritonbox_api.triton_gateway import TritonGateway, TritonUnavailableError, queue_full
from tritonbox_common.client import Chunk, TritonRequestError
from tritonbox_common.log_probs import TopLogprobs, token_log_probs, top_log_probs
from tritonbox_common.prompt_log_probs import prompt_log_probs

__all__ = ["Ended", "Event", "PredictionService", "RunningPrediction"]

log = logging.getLogger(__name__)
T = TypeVar("T")

# How long the engine's `stop` may take before the clean-up goes on without it.
ENGINE_STOP_TIMEOUT_S = 5.0


async def _to_the_end(awaitable: Awaitable[T], on_cancel: Callable[[], object] | None = None) -> T:
    """Await `awaitable` to its end even if the awaiting task is cancelled meanwhile (then
    `on_cancel` is called, and the wait goes on)."""
    task = asyncio.ensure_future(awaitable)
    while True:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                return task.result()
            log.warning("a prediction's producer was cancelled: finishing its clean-up first")
            if on_cancel is not None:
                on_cancel()


@dataclass
class _Progress:
    output: list[str] = field(default_factory=list)
    completion_tokens: int = 0
    time_to_first_token_s: float | None = None
    finish_reason: FinishReason | None = None
    stop_word: str | None = None  # the stop word that ended it, when one did
    engine_opened: bool = False  # the request was sent to the engine
    engine_finished: bool = False  # the engine ended the request itself (nothing to stop)
    others: list[_Progress] = field(default_factory=list)  # the other choices' (`n` > 1)


@dataclass
class _Outcome:
    status: Status = Status.SUCCEEDED
    error: str | None = None
    retryable: bool = False


def _add_logprobs(entries: list[TokenLogprob], chunk: Chunk) -> None:
    """The chunk's token log-probs, kept for the route; before the chunk's text is emitted."""
    values = token_log_probs(chunk.result, len(chunk.ids))
    if len(values) != len(chunk.ids):
        raise TritonRequestError(f"the engine sent {len(values)} log-probs for {len(chunk.ids)}"
                                 " tokens (is `output_log_probs` among its outputs?)")  # fmt: skip
    tops: list[TopLogprobs | None] = [*top_log_probs(chunk.result, len(chunk.ids))]
    tops = tops or [None] * len(chunk.ids)
    entries += zip(chunk.ids, values, tops, strict=True)


def _add_prompt_logprobs(
    entries: list[TokenLogprob], prepared: PreparedGeneration, chunk: Chunk
) -> None:
    """With `echo`: the prompt tokens' entries, first (from the engine's first response)."""
    ids = prepared.request.input_ids or ()
    scored = prompt_log_probs(chunk.result, ids, prepared.logprobs or 0)
    if scored is None:
        raise TritonRequestError("the engine sent no prompt log-probs with its first response "
                                 "(prompt_log_probs or context_logits)")  # fmt: skip
    entries[:0] = scored


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
        # Its inserts and completions: those that pile up on the writer share one commit.
        self._writes = PredictionWrites(database)
        self._max_concurrent = max_concurrent
        self._log = log_predictions
        self._running: dict[str, RunningPrediction] = {}
        # Concurrency slots taken: one per engine request, so a prediction of `n` choices takes
        # `n` (it is `n` requests in the engine's batch and queue).
        self._slots = 0
        # Batch lines running: their slots are the batch runner's (BATCH_MAX_RUNNING_LINES),
        # not the live requests' (service/batch_context.py).
        self._batch_lines: set[str] = set()

    @property
    def live_slots(self) -> int:
        """Slots live requests hold now (batch lines' are not among them)."""
        return self._slots

    @property
    def running_ids(self) -> list[str]:
        """The predictions holding a concurrency slot now."""
        return list(self._running)

    def start(
        self,
        prepared: PreparedGeneration,
        *,
        tokenizer: Any,
        source: Source,
        model: str,
        sent: dict[str, Any],
        extra: list[PreparedGeneration] | None = None,
        key_name: str | None = None,
    ) -> RunningPrediction:
        """Start generating; 429 when its slots (one per choice) would take the engine requests
        running past MAX_CONCURRENT_REQUESTS. `extra`: the other choices (`n` > 1), generated
        side by side under this one prediction. Alone, a prediction runs whatever its `n`
        (never more than the routes' limit on `n`): else it could never run at all."""
        slots = 1 + len(extra or ())
        line = batch_context.current()
        if line is None and self._slots and self._slots + slots > self._max_concurrent:
            metrics.REJECTED.labels("overloaded").inc()
            free = max(self._max_concurrent - self._slots, 0)
            raise ApiError(
                429,
                f"the api is generating its maximum of {self._max_concurrent} predictions "
                f"(MAX_CONCURRENT_REQUESTS; each choice of `n` takes one): {free} free, this "
                f"request needs {slots}; retry shortly",
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
            adapter_name=prepared.adapter.name if prepared.adapter else None,
            adapter_sha256=prepared.adapter.sha256 if prepared.adapter else None,
            api_key_name=key_name,
            batch_id=line.batch_id if line else None,
            custom_id=line.custom_id if line else None,
        )
        running = RunningPrediction(id=record.id, prepared=prepared, extra=extra or [])
        # The slot and the gauge are taken here and given back once, by the producer.
        self._running[record.id] = running
        if line is None:
            self._slots += slots
        else:
            self._batch_lines.add(record.id)
        metrics.IN_FLIGHT.inc()
        running.producer = asyncio.create_task(self._produce(running, record, tokenizer))
        return running

    async def cancel(self, prediction_id: str, reason: str = "cancel requested") -> bool:
        """Ask a running prediction to stop and wait until it has ended; False if not running."""
        running = self._running.get(prediction_id)
        if running is None:
            return False
        running.cancel(reason)
        await running.wait()
        return True

    async def cancel_all(self) -> None:
        runs = list(self._running.values())
        for running in runs:
            running.cancel("the api is shutting down")
        await asyncio.gather(*(running.wait() for running in runs), return_exceptions=True)

    def _insert(self, record: Prediction) -> asyncio.Task[Any] | None:
        if not self._log:
            return None
        insert = self._writes.create(
            id=record.id,
            source=record.source,
            model=record.model,
            input=record.input,
            applied=record.applied,
            prompt_tokens=record.prompt_tokens,
            adapter_name=record.adapter_name,
            adapter_sha256=record.adapter_sha256,
            api_key_name=record.api_key_name,
            batch_id=record.batch_id,
            custom_id=record.custom_id,
        )
        # Not awaited before generating: the insert overlaps the engine's prefill.
        return asyncio.create_task(insert)

    async def _produce(
        self, running: RunningPrediction, record: Prediction, tokenizer: Any
    ) -> None:
        started = time.perf_counter()
        progress = _Progress()
        outcome = _Outcome(status=Status.FAILED, error="internal error: the api failed")
        final: Prediction | None = None
        try:
            inserted = self._insert(record)
            progress.others = [_Progress() for _ in running.extra]
            generation = asyncio.create_task(
                self._generate_all(running, tokenizer, progress, started)
            )
            running.attach(generation)
            # Only the child is ever cancelled; should this task be (loop teardown), the child
            # is stopped and the clean-up below still runs.
            await _to_the_end(asyncio.wait([generation]), on_cancel=generation.cancel)
            outcome = await _to_the_end(self._outcome(running, generation, progress))
            every = [progress, *progress.others]
            choices = zip([running.prepared, *running.extra], every, strict=True)
            for prepared, each in choices:
                if each.engine_opened and not each.engine_finished:
                    request_id = prepared.request.request_id
                    await _to_the_end(
                        self._gateway.stop_request(request_id, timeout_s=ENGINE_STOP_TIMEOUT_S)
                    )
            total = time.perf_counter() - started
            final = await _to_the_end(self._complete(record, inserted, outcome, progress, total))
        except BaseException:
            log.exception("prediction %s: clean-up failed", running.id)
        finally:
            if final is None:  # only a bug gets here; the row is completed at the next start
                values = self._values(record, outcome, progress, time.perf_counter() - started)
                final = completed_in_memory(record, values)
            if self._running.pop(running.id, None) is not None:
                if running.id in self._batch_lines:
                    self._batch_lines.discard(running.id)
                else:
                    self._slots -= 1 + len(running.extra)
            metrics.IN_FLIGHT.dec()
            metrics.observe(final)
            running.end(Ended(final, outcome.retryable))

    async def _outcome(
        self, running: RunningPrediction, generation: asyncio.Task[None], progress: _Progress
    ) -> _Outcome:
        if generation.cancelled():
            for each in (progress, *progress.others):
                each.finish_reason = each.finish_reason or FinishReason.CANCELED
            progress.finish_reason = FinishReason.CANCELED
            return _Outcome(Status.CANCELED)
        failure = generation.exception()
        if failure is None:
            return _Outcome(Status.SUCCEEDED)
        for each in progress.others:
            each.finish_reason = each.finish_reason or FinishReason.ERROR
        progress.finish_reason = FinishReason.ERROR
        if isinstance(failure, TritonUnavailableError):
            return _Outcome(Status.FAILED, str(failure), retryable=True)
        if isinstance(failure, TritonRequestError):
            # The engine's error ended that choice's request (_stream marked it); any other
            # choice, or a request whose answer the api refused, is still stopped.
            # A restarting Triton answers "unknown model" before its models are back; a full
            # engine queue (MAX_QUEUE_SIZE) refuses for now only.
            retryable = progress.completion_tokens == 0 and (
                queue_full(str(failure)) or not await self._gateway.is_ready()
            )
            return _Outcome(Status.FAILED, str(failure), retryable)
        log.error("prediction %s failed", running.id, exc_info=failure)
        return _Outcome(Status.FAILED, "internal error: the api could not finish this prediction")

    async def _generate_all(
        self, running: RunningPrediction, tokenizer: Any, progress: _Progress, started: float
    ) -> None:
        """Every choice side by side; one failing ends the others (the prediction fails)."""
        if not running.extra:
            return await self._generate(running, tokenizer, progress, started)
        tasks = [asyncio.create_task(self._generate(running, tokenizer, progress, started))]
        for index, (prepared, other) in enumerate(
            zip(running.extra, progress.others, strict=True), 1
        ):
            tasks.append(asyncio.create_task(
                self._generate(running, tokenizer, other, started, prepared, index)
            ))  # fmt: skip
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _generate(
        self,
        running: RunningPrediction,
        tokenizer: Any,
        progress: _Progress,
        started: float,
        prepared: PreparedGeneration | None = None,
        index: int = 0,
    ) -> None:
        """One choice (`index`; the first by default) from the engine to its text events."""
        prepared = prepared or running.prepared
        decoder = IncrementalDecoder(tokenizer)
        matcher = StopStringMatcher(prepared.stop_words)

        def emit(text: str) -> None:
            if text:
                progress.output.append(text)
                running.queue.put_nowait(text if index == 0 else ChoiceText(index, text))

        request = prepared.request
        entries = running.logprobs[index]
        # The cpu engine sends the end token that ended the answer (with its log-prob, which
        # OpenAI's and vLLM's log-probs include); TensorRT-LLM's executor leaves it out. It is
        # counted (vLLM counts it) and has its log-prob entry, but its text is never output.
        end_id = int(request.sampling.get("end_id", -1))
        ended = False  # the last tokens came ended with the end token
        progress.engine_opened = True
        echo = prepared.echo  # the prompt's text (and entries) still to come first
        async with contextlib.aclosing(self._stream(prepared, progress)) as chunks:
            async for chunk in chunks:
                progress.engine_finished = chunk.final
                if echo:  # vLLM: the prompt comes with the first chunk
                    if prepared.logprobs is not None:
                        _add_prompt_logprobs(entries, prepared, chunk)
                    emit(request.prompt)
                    echo = False
                if not chunk.ids or prepared.prompt_only:  # prompt_only: a token is dropped
                    continue
                if progress.time_to_first_token_s is None:
                    progress.time_to_first_token_s = time.perf_counter() - started
                progress.completion_tokens += len(chunk.ids)
                if prepared.logprobs is not None:
                    _add_logprobs(entries, chunk)
                # Only ever a chunk's last: the engine ends on it.
                ended = end_id >= 0 and chunk.ids[-1] == end_id
                emit(matcher.push(decoder.push(chunk.ids[:-1] if ended else chunk.ids)))
                if matcher.stopped:
                    # The api's exact-text match is the one rule for stop words: the producer
                    # stops the engine's request once this stream is closed.
                    progress.finish_reason = FinishReason.STOP_WORD
                    progress.stop_word = matcher.matched
                    return
        emit(matcher.push(decoder.flush()))
        emit(matcher.flush())
        if matcher.stopped:
            progress.finish_reason = FinishReason.STOP_WORD
            progress.stop_word = matcher.matched
        elif prepared.prompt_only or (
            not ended and progress.completion_tokens >= request.max_tokens
        ):
            progress.finish_reason = FinishReason.LENGTH
        else:
            progress.finish_reason = FinishReason.STOP

    async def _stream(
        self, prepared: PreparedGeneration, progress: _Progress
    ) -> AsyncGenerator[Chunk, None]:
        """The engine's chunks; a LoRA adapter the engine no longer caches (evicted, or
        Triton restarted) is sent again with its weights, once, if no token came yet."""
        try:
            async for chunk in self._gateway.stream(prepared.request):
                yield chunk
        except TritonRequestError as error:
            adapter = prepared.adapter
            resend = adapter is not None and adapter.lora.weights is None
            if not resend or NOT_IN_CACHE not in str(error) or progress.completion_tokens:
                progress.engine_finished = True  # an error response is the request's last
                raise
            assert adapter is not None
            log.info("adapter %s: not in the engine's cache; sending its weights", adapter.name)
            request = replace(prepared.request, lora=adapter.full)
            async for chunk in self._gateway.stream(request):
                yield chunk

    @staticmethod
    def _values(
        record: Prediction, outcome: _Outcome, progress: _Progress, total_time_s: float
    ) -> dict[str, Any]:
        every = [progress, *progress.others]
        choices = [
            {
                "index": index,
                "output": "".join(each.output),
                "finish_reason": each.finish_reason.value if each.finish_reason else None,
                "stop_word": each.stop_word,
                "completion_tokens": each.completion_tokens,
            }
            for index, each in enumerate(every)
        ]
        return dict(
            id=record.id,
            status=outcome.status,
            output="".join(progress.output),
            finish_reason=progress.finish_reason,
            stop_word=progress.stop_word,
            choices=choices if progress.others else None,
            error=outcome.error,
            completion_tokens=sum(each.completion_tokens for each in every),
            time_to_first_token_s=progress.time_to_first_token_s,
            total_time_s=total_time_s,
        )

    async def _complete(
        self,
        record: Prediction,
        inserted: asyncio.Task[Any] | None,
        outcome: _Outcome,
        progress: _Progress,
        total_time_s: float,
    ) -> Prediction:
        values = self._values(record, outcome, progress, total_time_s)
        if inserted is None:
            return completed_in_memory(record, values)
        try:
            await inserted
            return await self._writes.complete(**values)
        except Exception:
            log.exception("could not save prediction %s", record.id)
            return completed_in_memory(record, values)
