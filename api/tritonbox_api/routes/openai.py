"""OpenAI-compatible routes: completions, chat completions and models, streamed as the SDK
expects (`data:` chunks, an error chunk mid-stream, then `data: [DONE]`)."""

from __future__ import annotations

import json

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from tritonbox_api.db.models import Prediction, Source, Status
from tritonbox_api.deps import Guarded, Limited, Services, ServicesDep
from tritonbox_api.protocol.errors import ApiError, FieldError, invalid, unavailable
from tritonbox_api.protocol.openai import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
)
from tritonbox_api.routes.common import prediction_headers, start
from tritonbox_api.routes.openai_errors import REFUSED, OpenAIRoute, client_named
from tritonbox_api.routes.openai_logprobs import LogprobShape
from tritonbox_api.routes.openai_shape import Shape, error_body
from tritonbox_api.routes.openai_stream import sse
from tritonbox_api.routes.responses import EVENT_STREAM, GENERATING, GUARDED, errors, streamed
from tritonbox_api.routes.sse import EventStream
from tritonbox_api.service.options import GenerationOptions
from tritonbox_api.service.prompts import prompt_inputs
from tritonbox_api.triton_gateway import TritonUnavailableError
from tritonbox_common.guided import GUIDE_INPUT

# Refusals are 400 here, with OpenAI's body and the client's field names (openai_errors.py).
router = APIRouter(
    prefix="/v1",
    tags=["openai"],
    dependencies=Guarded,
    responses=GUARDED,
    route_class=OpenAIRoute,
)
# A completion: JSON, or with `stream` OpenAI's chunks, each a `data:` event, then `[DONE]`.
# Refused: 400 (never 422); not finished: 499 when cancelled, 502 when the engine failed it.
COMPLETION = {
    **streamed(200, EVENT_STREAM, "The completion, or with `stream` its chunks as events."),
    **errors(400, *GENERATING, 499, 502, notes={400: REFUSED}),
}


async def _complete(
    request: Request,
    services: Services,
    body: CompletionRequest | ChatCompletionRequest,
    *,
    chat: bool,
) -> Response:
    try:
        return await _answer(request, services, body, chat=chat)
    except ApiError as error:
        # Checked once translated to GenerationInput: named as the client sent them again.
        raise client_named(error, body, chat=chat) from None


async def _answer(
    request: Request,
    services: Services,
    body: CompletionRequest | ChatCompletionRequest,
    *,
    chat: bool,
) -> Response:
    adapter = await _adapter_of(services, body.model)
    try:
        params = body.generation()
    except FieldError as error:
        raise invalid(error.param, error.reason) from None
    except ValidationError as error:  # the chat's text parts, joined, longer than a prompt
        raise invalid("prompt", str(error)) from None
    prompts = None
    if isinstance(body, CompletionRequest):
        # Token ids checked against the vocabulary, and decoded for echo and the row.
        prompts = prompt_inputs(await services.engine_context.get(), body.prompts())
    try:
        top, top_field = body.top_logprobs_asked()
        guided = body.guided_decoding()
    except FieldError as error:
        raise ApiError(400, str(error), param=error.param) from None
    if guided is not None:
        params = params.model_copy(update={"guided_decoding": guided})
    if adapter is not None:
        params = params.model_copy(update={"adapter": adapter})
    sent = body.model_dump(mode="json", exclude_unset=True, by_alias=True)  # `schema`, `json`
    completion = body if isinstance(body, CompletionRequest) else None
    options = GenerationOptions(
        params,
        source=Source.OPENAI,
        stream=body.stream,
        sent=sent,
        # `generation()` always sets max_tokens: whether the client did decides if the default
        # may be clamped to the engine's MAX_OUTPUT_LEN.
        max_tokens_given="max_tokens" in sent or "max_completion_tokens" in sent,
        logprobs=top,
        logprobs_field=top_field,
        n=body.n,
        echo=completion is not None and completion.echo,
        prompt_only=completion is not None and completion.prompt_only,
        prompts=prompts,
    )
    started = await start(services, request, options)
    shape = Shape(chat, started)
    logprobs = None
    if top is not None:
        tokenizer = (await services.engine_context.get()).tokenizer
        count = len(started.running.logprobs)
        logprobs = [LogprobShape(tokenizer, chat=chat, top=top) for _ in range(count)]
    headers = prediction_headers(services, started.id)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        events = sse(shape, started, include_usage, logprobs)
        return EventStream(events, headers=headers, ping=10)
    prediction = (await started.result()).prediction
    if prediction.status is not Status.SUCCEEDED:
        if guided is not None and _guide_refused(prediction):
            # xgrammar refused what the api's own checks let through: the client's error.
            field = body.structured_field()
            reason = (prediction.error or "").rpartition(f"{GUIDE_INPUT}: ")[2]
            raise ApiError(400, f"{field}: the engine cannot follow it: {reason}", param=field)
        failure = json.loads(error_body(prediction))
        code = 499 if prediction.status is Status.CANCELED else 502
        return JSONResponse(failure, status_code=code, headers=headers)
    whole = None
    if logprobs is not None:
        every = zip(logprobs, started.running.logprobs, strict=True)
        whole = [each.part(entries) for each, entries in every]
    return JSONResponse(shape.whole(prediction, whole), headers=headers)


def _guide_refused(prediction: Prediction) -> bool:
    """The engine refused the request's guide before writing anything (grammar.py's error)."""
    return f"{GUIDE_INPUT}: " in (prediction.error or "") and not prediction.completion_tokens


async def _adapter_of(services: Services, model: str) -> str | None:
    """None for the base model, the adapter's name for a registered adapter; else 404."""
    try:
        served = (await services.engine_context.get()).model_name
    except TritonUnavailableError as error:
        raise unavailable(f"the engine is not available yet: {error}") from None
    if model == served:
        return None
    if await services.adapters.get(model) is not None:
        return model
    raise ApiError(
        404,
        f"model: {model!r} is not served here; this server serves {served!r} and its "
        "adapters (GET /v1/models lists them)",
        type="not_found_error",
        param="model",
    )


@router.post("/completions", responses=COMPLETION, dependencies=Limited)
async def completions(body: CompletionRequest, request: Request, services: ServicesDep) -> Response:
    return await _complete(request, services, body, chat=False)


@router.post("/chat/completions", responses=COMPLETION, dependencies=Limited)
async def chat_completions(
    body: ChatCompletionRequest, request: Request, services: ServicesDep
) -> Response:
    return await _complete(request, services, body, chat=True)


async def _model_cards(services: Services) -> list[ModelCard]:
    try:
        name = (await services.engine_context.get()).model_name
    except TritonUnavailableError as error:
        raise unavailable(f"the engine is not available yet: {error}") from None
    adapters = [
        ModelCard(
            id=row.name,
            created=int(row.created_at.timestamp()),
            parent=name,
            root=services.adapters.shown_source(row),  # no server folder in an answer
        )
        for row in await services.adapters.list()
    ]
    return [ModelCard(id=name, created=0, root=name), *adapters]


@router.get("/models", response_model=ModelList, responses=errors(503))
async def models(services: ServicesDep) -> ModelList:
    """The base model, then every registered LoRA adapter (`parent`: the base)."""
    return ModelList(data=await _model_cards(services))


@router.get("/models/{model_id}", response_model=ModelCard, responses=errors(404, 503))
async def model(model_id: str, services: ServicesDep) -> ModelCard:
    """One model: the base or an adapter (the openai SDK's `models.retrieve`)."""
    for card in await _model_cards(services):
        if card.id == model_id:
            return card
    raise ApiError(
        404, f"model: {model_id!r} is not served here", type="not_found_error", param="model"
    )
