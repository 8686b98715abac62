"""Seed-compatible `POST /predict`: the TensorRT-LLM truss JSON, plain-text streaming."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from tritonbox_api.db.models import Source, Status
from tritonbox_api.deps import Guarded, Limited, ServicesDep
from tritonbox_api.protocol.predictions import (
    PredictOut,
    PredictRequest,
    PredictUsage,
    prediction_urls,
)
from tritonbox_api.routes.common import prediction_headers, start
from tritonbox_api.routes.responses import GENERATING, GUARDED, TEXT, errors
from tritonbox_api.service.options import GenerationOptions
from tritonbox_api.service.predictions import Ended
from tritonbox_api.service.runner import Started

router = APIRouter(tags=["predict"], dependencies=Guarded, responses=GUARDED)


async def _text(started: Started) -> AsyncIterator[str]:
    async for event in started.events():
        if isinstance(event, Ended):
            if event.prediction.status is Status.FAILED:
                # Plain text has no error channel: the failure ends the text, visibly.
                yield f"\n\n[error: {event.prediction.error}]"
        elif isinstance(event, str):  # one choice here: never another choice's text
            yield event


@router.post(
    "/predict",
    dependencies=Limited,
    responses={
        200: {
            "model": PredictOut,
            "description": 'The output as plain-text chunks, or with `"stream": false` JSON.',
            "content": {"text/plain": TEXT},
        },
        **errors(400, 422, *GENERATING),
    },
)
async def predict(body: PredictRequest, request: Request, services: ServicesDep) -> Response:
    """Plain-text chunks by default; `"stream": false` answers JSON with the whole output."""
    options = GenerationOptions(
        body.model_copy(), source=Source.PREDICT, stream=body.stream, sent=body.sent()
    )
    started = await start(services, request, options)
    headers = prediction_headers(services, started.id)
    if body.stream:
        return StreamingResponse(
            _text(started), media_type="text/plain; charset=utf-8", headers=headers
        )
    prediction = (await started.result()).prediction
    settings = services.settings
    urls = prediction_urls(
        prediction.id, public_url=settings.public_url, playground_url=settings.playground_url
    )
    whole = PredictOut(
        id=prediction.id,
        output=prediction.output,
        status=prediction.status,
        finish_reason=prediction.finish_reason,
        stop_word=prediction.stop_word,
        error=prediction.error,
        usage=PredictUsage(
            prompt_tokens=prediction.prompt_tokens,
            completion_tokens=prediction.completion_tokens,
        ),
        urls=urls,
    )
    return JSONResponse(whole.model_dump(mode="json"), headers=headers)
