"""OpenAI-compatible routes: completions, chat completions and models, streamed as the SDK
expects (`data:` chunks, an error chunk mid-stream, then `data: [DONE]`)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from tritonbox_api.db.models import FinishReason, Prediction, Source, Status
from tritonbox_api.deps import Guarded, Services, ServicesDep
from tritonbox_api.protocol.errors import ApiError, invalid, unavailable
from tritonbox_api.protocol.openai import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
    ModelList,
    Usage,
)
from tritonbox_api.routes.common import prediction_headers, start
from tritonbox_api.routes.sse import EventStream, frame, frame_parts
from tritonbox_api.service.predictions import Ended
from tritonbox_api.service.runner import Started
from tritonbox_api.triton_gateway import TritonUnavailableError

router = APIRouter(prefix="/v1", tags=["openai"], dependencies=Guarded)


def _finish_reason(prediction: Prediction) -> str | None:
    if prediction.finish_reason is FinishReason.LENGTH:
        return "length"
    if prediction.finish_reason in (FinishReason.STOP, FinishReason.STOP_WORD):
        return "stop"
    return None


def _usage(prediction: Prediction) -> dict[str, int]:
    prompt, completion = prediction.prompt_tokens or 0, prediction.completion_tokens or 0
    return Usage(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
    ).model_dump()


def _error_body(prediction: Prediction) -> str:
    kind = "canceled" if prediction.status is Status.CANCELED else "server_error"
    message = prediction.error or f"the prediction was {prediction.status.value}"
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}})


_SLOT = "\u0000text\u0000"  # stands for a delta's text in its encoded template


class _Shape:
    """How one route spells its objects: `text_completion` or `chat.completion`."""

    def __init__(self, chat: bool, started: Started) -> None:
        self.chat = chat
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{started.id}"
        self.model = started.model
        self.created = int(time.time())
        # A delta chunk is the same JSON around its text every time: encoded once, then only
        # the text is encoded per chunk (a dict and a whole json.dumps per token add up).
        self._deltas = {first: self._template(first) for first in (True, False)}
        self._events = {first: frame_parts(*self._deltas[first]) for first in (True, False)}

    def envelope(self, choice: dict[str, Any], chunk: bool) -> dict[str, Any]:
        kind = "chat.completion" if self.chat else "text_completion"
        kind += ".chunk" if chunk and self.chat else ""
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }

    def delta(self, text: str, *, first: bool) -> dict[str, Any]:
        if not self.chat:
            return self.envelope({"index": 0, "text": text, "finish_reason": None}, True)
        delta = {"role": "assistant", "content": text} if first else {"content": text}
        return self.envelope({"index": 0, "delta": delta, "finish_reason": None}, True)

    def delta_json(self, text: str, *, first: bool) -> str:
        """`json.dumps(self.delta(text, first=first), ensure_ascii=False)`, cheaper."""
        before, after = self._deltas[first]
        return before + json.dumps(text, ensure_ascii=False) + after

    def delta_event(self, text: str, *, first: bool) -> bytes:
        """`frame(self.delta_json(text, first=first))`: the chunk's SSE event, as sent."""
        before, after = self._events[first]
        # JSON has no raw line breaks: the event is one `data:` line.
        return before + json.dumps(text, ensure_ascii=False).encode() + after

    def _template(self, first: bool) -> tuple[str, str]:
        encoded = json.dumps(self.delta(_SLOT, first=first), ensure_ascii=False)
        # The text is the last string of the chunk: nothing after it can hold the slot's marker.
        before, _, after = encoded.rpartition(json.dumps(_SLOT))
        return before, after

    def last(self, prediction: Prediction) -> dict[str, Any]:
        reason = _finish_reason(prediction)
        if self.chat:
            choice = {"index": 0, "delta": {}, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": "", "finish_reason": reason}
        return self.envelope(choice, True)

    def whole(self, prediction: Prediction) -> dict[str, Any]:
        if self.chat:
            message = {"role": "assistant", "content": prediction.output}
            choice = {"index": 0, "message": message, "finish_reason": _finish_reason(prediction)}
        else:
            choice = {
                "index": 0,
                "text": prediction.output,
                "finish_reason": _finish_reason(prediction),
                "logprobs": None,
            }
        return {**self.envelope(choice, False), "usage": _usage(prediction)}


async def _sse(shape: _Shape, started: Started, include_usage: bool) -> AsyncIterator[bytes]:
    first = True
    async for event in started.events():
        if not isinstance(event, Ended):
            yield shape.delta_event(event, first=first)
            first = False
            continue
        prediction = event.prediction
        if prediction.status is Status.SUCCEEDED:
            yield frame(json.dumps(shape.last(prediction)))
            if include_usage:
                yield frame(json.dumps({**shape.envelope({}, True), "choices": [],
                                        "usage": _usage(prediction)}))  # fmt: skip
        else:
            yield frame(_error_body(prediction))
    yield frame("[DONE]")


async def _complete(
    request: Request,
    services: Services,
    body: CompletionRequest | ChatCompletionRequest,
    *,
    chat: bool,
) -> Response:
    adapter = await _adapter_of(services, body.model)
    try:
        params = body.generation()
    except ValueError as error:
        raise invalid("prompt", str(error).removeprefix("prompt: ")) from None
    if adapter is not None:
        params = params.model_copy(update={"adapter": adapter})
    sent = body.model_dump(mode="json", exclude_unset=True)
    # `generation()` always sets max_tokens: whether the client did decides if the default may
    # be clamped to the engine's MAX_OUTPUT_LEN.
    given = "max_tokens" in sent or "max_completion_tokens" in sent
    started = await start(
        services,
        request,
        params,
        source=Source.OPENAI,
        sent=sent,
        stream=body.stream,
        max_tokens_given=given,
    )
    shape = _Shape(chat, started)
    headers = prediction_headers(services, started.id)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return EventStream(_sse(shape, started, include_usage), headers=headers, ping=10)
    prediction = (await started.result()).prediction
    if prediction.status is not Status.SUCCEEDED:
        failure = json.loads(_error_body(prediction))
        code = 499 if prediction.status is Status.CANCELED else 502
        return JSONResponse(failure, status_code=code, headers=headers)
    return JSONResponse(shape.whole(prediction), headers=headers)


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


@router.post("/completions")
async def completions(body: CompletionRequest, request: Request, services: ServicesDep) -> Response:
    return await _complete(request, services, body, chat=False)


@router.post("/chat/completions")
async def chat_completions(
    body: ChatCompletionRequest, request: Request, services: ServicesDep
) -> Response:
    return await _complete(request, services, body, chat=True)


@router.get("/models", response_model=ModelList)
async def models(services: ServicesDep) -> ModelList:
    try:
        name = (await services.engine_context.get()).model_name
    except TritonUnavailableError as error:
        raise unavailable(f"the engine is not available yet: {error}") from None
    adapters = [
        ModelCard(
            id=row.name,
            created=int(row.created_at.timestamp()),
            parent=name,
            root=row.source,
        )
        for row in await services.adapters.list()
    ]
    return ModelList(data=[ModelCard(id=name, created=0, root=name), *adapters])
