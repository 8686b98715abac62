"""A prediction's engine streams turned into its events: exact text, stop words, log-probs.

This runs in the producer's child task (service/producer.py), the only thing a cancellation
interrupts; it records how far each choice got in its `Progress`, from which the producer then
decides how the prediction ended. It never stops an engine request itself: the producer does,
once the streams are closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field, replace
from typing import Any

from tritonbox_api.db.models import FinishReason
from tritonbox_api.service.adapters import NOT_IN_CACHE
from tritonbox_api.service.prepare import PreparedGeneration
from tritonbox_api.service.running import ChoiceText, RunningPrediction, TokenLogprob
from tritonbox_api.text.decoder import IncrementalDecoder
from tritonbox_api.text.stop_words import StopStringMatcher
from tritonbox_api.triton_gateway import TritonGateway
from tritonbox_common.client import Chunk, TritonRequestError
from tritonbox_common.log_probs import TopLogprobs, token_log_probs, top_log_probs
from tritonbox_common.prompt_log_probs import prompt_log_probs

log = logging.getLogger(__name__)


@dataclass
class Progress:
    """How far one choice got; the first choice's also holds the others'."""

    output: list[str] = field(default_factory=list)
    completion_tokens: int = 0
    time_to_first_token_s: float | None = None
    finish_reason: FinishReason | None = None
    stop_word: str | None = None  # the stop word that ended it, when one did
    engine_opened: bool = False  # the request was sent to the engine
    engine_finished: bool = False  # the engine ended the request itself (nothing to stop)
    others: list[Progress] = field(default_factory=list)  # the other choices' (`n` > 1)


async def generate_all(
    gateway: TritonGateway,
    running: RunningPrediction,
    tokenizer: Any,
    progress: Progress,
    started: float,
) -> None:
    """Every choice side by side; one failing ends the others (the prediction fails)."""
    if not running.extra:
        return await _generate(gateway, running, tokenizer, progress, started)
    tasks = [asyncio.create_task(_generate(gateway, running, tokenizer, progress, started))]
    for index, (prepared, other) in enumerate(zip(running.extra, progress.others, strict=True), 1):
        tasks.append(asyncio.create_task(
            _generate(gateway, running, tokenizer, other, started, prepared, index)
        ))  # fmt: skip
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _generate(
    gateway: TritonGateway,
    running: RunningPrediction,
    tokenizer: Any,
    progress: Progress,
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
    async with contextlib.aclosing(_stream(gateway, prepared, progress)) as chunks:
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
    elif prepared.prompt_only or (not ended and progress.completion_tokens >= request.max_tokens):
        progress.finish_reason = FinishReason.LENGTH
    else:
        progress.finish_reason = FinishReason.STOP


async def _stream(
    gateway: TritonGateway, prepared: PreparedGeneration, progress: Progress
) -> AsyncGenerator[Chunk, None]:
    """The engine's chunks; a LoRA adapter the engine no longer caches (evicted, or
    Triton restarted) is sent again with its weights, once, if no token came yet."""
    try:
        async for chunk in gateway.stream(prepared.request):
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
        async for chunk in gateway.stream(request):
            yield chunk


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
