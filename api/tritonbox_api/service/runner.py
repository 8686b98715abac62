"""Start a prediction for a route: engine facts, validation, then the first event.

Waiting for the first event before answering lets a route still send a proper status code
(503 when Triton is down) instead of a stream that fails at once.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, replace

from tritonbox_api.db.models import Status
from tritonbox_api.protocol.errors import ApiError, unavailable
from tritonbox_api.service.adapters import AdapterService
from tritonbox_api.service.engine_context import EngineContextLoader
from tritonbox_api.service.options import GenerationOptions
from tritonbox_api.service.predictions import PredictionService
from tritonbox_api.service.prepare import prepare
from tritonbox_api.service.prompts import PromptInput
from tritonbox_api.service.running import Ended, Event, RunningPrediction
from tritonbox_api.triton_gateway import TritonUnavailableError, queue_full
from tritonbox_common.guided import GUIDE_INPUT
from tritonbox_common.prompt_log_probs import ECHO_MAX_PROMPT_TOKENS


@dataclass
class Started:
    running: RunningPrediction
    model: str
    _first: Event
    _rest: AsyncGenerator[Event, None]

    @property
    def id(self) -> str:
        return self.running.id

    async def events(self) -> AsyncIterator[Event]:
        """Text pieces, then `Ended`; leaving early (a client gone) cancels the prediction."""
        try:
            yield self._first
            if isinstance(self._first, Ended):
                return
            async for event in self._rest:
                yield event
        finally:
            self.running.cancel("its consumer left")  # a no-op once it has ended
            await self._rest.aclose()

    async def result(self) -> Ended:
        async for event in self.events():
            if isinstance(event, Ended):
                return event
        raise AssertionError("a prediction always ends with Ended")


def _free(used: int) -> None:
    """No tokens per minute to settle (no key, or no limit)."""


def _used(running: RunningPrediction) -> int:
    """The tokens a prediction used; none when the engine failed it before its first token
    (it refused it, its queue full, or was not there): nothing was generated."""
    ended = running.ended
    if ended is None:
        return 0
    row = ended.prediction
    if row.status is Status.FAILED and not row.completion_tokens:
        return 0
    return (row.prompt_tokens or 0) + (row.completion_tokens or 0)


async def begin(
    options: GenerationOptions,
    *,
    loader: EngineContextLoader,
    predictions: PredictionService,
    adapters: AdapterService,
    max_beam_width: int,
    echo_max_prompt_tokens: int = ECHO_MAX_PROMPT_TOKENS,
    on_start: Callable[[RunningPrediction], None] = lambda running: None,
    key_name: str | None = None,
    reserve: Callable[[int], Callable[[int], None]] | None = None,
) -> Started:
    """Start a prediction; `on_start` sees it before its first event is awaited. `reserve`:
    the key's tokens per minute (rate_limit.py), given the most this request may use (429 when
    they do not fit); what it returns is called with the usage at the end."""
    try:
        context = await loader.get()
    except TritonUnavailableError as error:
        raise unavailable(f"the engine is not available yet: {error}") from None
    # An unknown adapter is a 404 before anything else is checked or stored.
    wanted = options.params.adapter
    adapter = await adapters.select(wanted) if wanted else None
    every = []  # each prompt's request; all are checked before any is sent
    prompts: list[PromptInput | None] = [*options.prompts] if options.prompts else [None]
    for prompt in prompts:
        prepared = await prepare(
            options,
            context,
            max_beam_width=max_beam_width,
            prompt_input=prompt,
            echo_max_prompt_tokens=echo_max_prompt_tokens,
        )
        # One seed for the request (a random one drawn once): prompt i's choice j is seeded
        # seed + j, what that prompt alone would answer.
        options = options.with_params(seed=prepared.applied["seed"])
        every.append(prepared.with_adapter(adapter) if adapter is not None else prepared)
    # The row counts every prompt's tokens (OpenAI's and vLLM's usage for a list of prompts).
    lead = replace(every[0], prompt_tokens=sum(each.prompt_tokens for each in every))
    # The most it may use: the prompts, and max_tokens for each choice of each.
    n = options.n
    most = lead.prompt_tokens + n * sum(each.request.max_tokens for each in every)
    settle = reserve(most) if reserve is not None else _free
    try:
        running = predictions.start(
            lead,
            tokenizer=context.tokenizer,
            source=options.source,
            model=context.model_name,
            sent=options.sent,
            extra=[each.choice(index) for each in every for index in range(n)][1:],
            key_name=key_name,
        )
    except BaseException:
        settle(0)  # refused (MAX_CONCURRENT_REQUESTS): it used nothing
        raise
    if running.producer is not None:  # the producer ends it, whatever ends it
        running.producer.add_done_callback(lambda _: settle(_used(running)))
    rest = running.events()
    try:
        on_start(running)
        first = await anext(rest)
    except BaseException:
        running.cancel("its request failed before the first event")
        raise
    if isinstance(first, Ended) and first.retryable:
        failure = first.prediction.error or ""
        if queue_full(failure):
            # The cpu engine's queue of requests waiting for their guide to compile is the
            # other one (engine/guide_pool.py).
            full = (
                "the engine's queue of requests waiting for their guide to compile is full"
                if GUIDE_INPUT in failure
                else "the engine's queue is full (MAX_QUEUE_SIZE)"
            )
            refusal = ApiError(
                429,
                f"{full}; prediction {running.id} was saved as failed, retry shortly",
                type="rate_limit_error",
                headers={"Retry-After": "1", "X-Prediction-Id": running.id},
            )
            raise refusal
        refusal = unavailable(
            f"the engine is unavailable ({first.prediction.error}); prediction "
            f"{running.id} was saved as failed, retry shortly"
        )
        refusal.headers["X-Prediction-Id"] = running.id
        raise refusal
    # OpenAI clients see the model they asked for: the adapter's name when one answers.
    model = adapter.name if adapter is not None else context.model_name
    return Started(running=running, model=model, _first=first, _rest=rest)
