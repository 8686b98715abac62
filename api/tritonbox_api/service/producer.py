"""A prediction's producer task: it owns the prediction from its start to its end.

The producer runs the engine streams in a child task (service/generation.py), the only thing a
cancellation interrupts, and then, whatever ended them (the engine, a stop word, `cancel` from a
route, a disconnect, shutdown, an error), runs the clean-up once and to its end: the engine's
`stop` with a deadline for each choice's request still open, the row's completion, the
concurrency slots and the in-flight gauge. Nobody else cancels or completes a prediction.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any, TypeVar

from tritonbox_api import metrics
from tritonbox_api.db.models import FinishReason, Prediction, Status
from tritonbox_api.service import recording
from tritonbox_api.service.generation import Progress, generate_all
from tritonbox_api.service.outcome import completed_in_memory
from tritonbox_api.service.recording import Outcome, Recorder
from tritonbox_api.service.running import Ended, RunningPrediction
from tritonbox_api.triton_gateway import TritonGateway, TritonUnavailableError, queue_full
from tritonbox_common.client import TritonRequestError

log = logging.getLogger(__name__)
T = TypeVar("T")

# How long the engine's `stop` may take before the clean-up goes on without it.
ENGINE_STOP_TIMEOUT_S = 5.0
# The longest a live request waits for the stops of the batch lines stopped for it before it is
# sent anyway. Sixteen stops are answered within ~40-70 ms on 2 busy cores; later than this,
# something ahead of the engine holds them (the trtllm and synthetic steps keep Triton's dynamic
# batcher, which held some of the cpu step's requests for its 500 ms default wait: the cpu
# model's config.pbtxt), and the live request would only wait that out twice.
STOPS_AHEAD_S = 0.1


async def produce(
    running: RunningPrediction,
    record: Prediction,
    tokenizer: Any,
    *,
    gateway: TritonGateway,
    recorder: Recorder,
    release: Callable[[RunningPrediction], None],
    after: Collection[asyncio.Task[bool]] = (),
) -> None:
    """Generate `running`, then clean up; `release` gives back its slots, once, at the end.
    `after`: engine stops (of batch lines stopped for it) to see through, for STOPS_AHEAD_S
    at most, before its request is sent, so that it does not wait in the engine's queue behind
    lines not yet dropped there, nor reach Triton among their stops."""
    started = time.perf_counter()
    progress = Progress()
    outcome = Outcome(status=Status.FAILED, error="internal error: the api failed")
    final: Prediction | None = None
    try:
        inserted = recorder.insert(record)
        progress.others = [Progress() for _ in running.extra]
        generation = asyncio.create_task(
            _after(after, lambda: generate_all(gateway, running, tokenizer, progress, started))
        )
        running.attach(generation)
        # Only the child is ever cancelled; should this task be (loop teardown), the child
        # is stopped and the clean-up below still runs.
        await _to_the_end(asyncio.wait([generation]), on_cancel=generation.cancel)
        outcome = await _to_the_end(_outcome(gateway, running, generation, progress))
        every = [progress, *progress.others]
        for prepared, each in zip([running.prepared, *running.extra], every, strict=True):
            if each.engine_opened and not each.engine_finished and not running.engine_stopped:
                request_id = prepared.request.request_id
                await _to_the_end(gateway.stop_request(request_id, timeout_s=ENGINE_STOP_TIMEOUT_S))
        total = time.perf_counter() - started
        final = await _to_the_end(recorder.complete(record, inserted, outcome, progress, total))
    except BaseException:
        log.exception("prediction %s: clean-up failed", running.id)
    finally:
        if final is None:  # only a bug gets here; the row is completed at the next start
            ending = recording.values(record, outcome, progress, time.perf_counter() - started)
            final = completed_in_memory(record, ending)
        release(running)
        metrics.IN_FLIGHT.dec()
        metrics.observe(final)
        running.end(Ended(final, outcome.retryable))


async def _after(stops: Collection[asyncio.Task[bool]], work: Callable[[], Awaitable[T]]) -> T:
    if stops:
        await asyncio.wait(stops, timeout=STOPS_AHEAD_S)
    return await work()


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


async def _outcome(
    gateway: TritonGateway,
    running: RunningPrediction,
    generation: asyncio.Task[None],
    progress: Progress,
) -> Outcome:
    """How the prediction ended, from its child task's end; each choice's finish reason set."""
    if generation.cancelled():
        for each in (progress, *progress.others):
            each.finish_reason = each.finish_reason or FinishReason.CANCELED
        progress.finish_reason = FinishReason.CANCELED
        return Outcome(Status.CANCELED)
    failure = generation.exception()
    if failure is None:
        return Outcome(Status.SUCCEEDED)
    for each in progress.others:
        each.finish_reason = each.finish_reason or FinishReason.ERROR
    progress.finish_reason = FinishReason.ERROR
    if isinstance(failure, TritonUnavailableError):
        return Outcome(Status.FAILED, str(failure), retryable=True)
    if isinstance(failure, TritonRequestError):
        # The engine's error ended that choice's request (generation._stream marked it); any
        # other choice, or a request whose answer the api refused, is still stopped.
        # A restarting Triton answers "unknown model" before its models are back; a full
        # engine queue (MAX_QUEUE_SIZE) refuses for now only.
        retryable = progress.completion_tokens == 0 and (
            queue_full(str(failure)) or not await gateway.is_ready()
        )
        return Outcome(Status.FAILED, str(failure), retryable)
    log.error("prediction %s failed", running.id, exc_info=failure)
    return Outcome(Status.FAILED, "internal error: the api could not finish this prediction")
