"""Replicate-style predictions: create (JSON or SSE), list, read, cancel."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse

from tritonbox_api.db.models import Prediction, Source, Status
from tritonbox_api.deps import Guarded, Limited, Services, ServicesDep
from tritonbox_api.protocol.errors import ApiError, invalid
from tritonbox_api.protocol.predictions import (
    PredictionCreate,
    PredictionList,
    PredictionOut,
    prediction_out,
)
from tritonbox_api.routes.common import prediction_headers, start
from tritonbox_api.routes.responses import (
    EVENT_STREAM,
    GENERATING,
    GUARDED,
    errors,
    streamed,
)
from tritonbox_api.routes.sse import EventStream, frame
from tritonbox_api.service.options import GenerationOptions
from tritonbox_api.service.predictions import Ended
from tritonbox_api.service.runner import Started

# Guarded route by route: reading one prediction is open to whoever holds its id (a permalink is
# a capability, as the page at /p/{id} is), while creating, listing and cancelling need the key.
router = APIRouter(prefix="/v1/predictions", tags=["predictions"])


def _out(services: Services, row: Prediction) -> PredictionOut:
    settings = services.settings
    return prediction_out(
        row, public_url=settings.public_url, playground_url=settings.playground_url
    )


async def _sse(services: Services, started: Started) -> AsyncIterator[bytes]:
    async for event in started.events():
        if isinstance(event, Ended):
            final = _out(services, event.prediction)
            if final.status is Status.FAILED:
                yield frame(json.dumps({"detail": final.error}), "error")
            yield frame(final.model_dump_json(), "done")
        elif isinstance(event, str):  # one choice here: never another choice's text
            yield frame(event, "output")


@router.post(
    "",
    response_model=PredictionOut,
    status_code=201,
    dependencies=[*Guarded, *Limited],
    responses={
        # Streamed, it is answered 200 (the events start before the prediction is done).
        **streamed(
            200,
            EVENT_STREAM,
            "With `stream`: its events (`output` chunks, `error` if it failed, `done` with the "
            "prediction).",
        ),
        **GUARDED,
        **errors(400, 422, *GENERATING),
    },
)
async def create_prediction(
    body: PredictionCreate, request: Request, services: ServicesDep
) -> Response:
    options = GenerationOptions(
        body.input, source=Source(body.source), stream=body.stream, sent=body.input.sent()
    )
    started = await start(services, request, options)
    headers = prediction_headers(services, started.id)
    if body.stream:
        return EventStream(_sse(services, started), headers=headers, ping=10)
    ended = await started.result()
    final = _out(services, ended.prediction)
    return JSONResponse(final.model_dump(mode="json"), status_code=201, headers=headers)


@router.get(
    "", response_model=PredictionList, dependencies=Guarded, responses={**GUARDED, **errors(422)}
)
async def list_predictions(
    services: ServicesDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
    status: Status | None = None,
    source: Source | None = None,
) -> PredictionList:
    try:
        rows, next_cursor = await services.predictions.page(
            limit=limit, cursor=cursor, status=status, source=source
        )
    except ValueError as error:
        raise invalid("cursor", str(error).removeprefix("cursor: ")) from None
    next_url = None
    if next_cursor is not None:
        query = f"limit={limit}&cursor={next_cursor}"
        query += f"&status={status.value}" if status else ""
        query += f"&source={source.value}" if source else ""
        next_url = f"{services.settings.public_url}/v1/predictions?{query}"
    return PredictionList(results=[_out(services, row) for row in rows], next=next_url)


async def _get(services: Services, prediction_id: str) -> Prediction:
    row = await services.predictions.get(prediction_id)
    if row is None:
        raise ApiError(404, f"no prediction with id {prediction_id!r}", type="not_found_error")
    return row


@router.get("/{prediction_id}", response_model=PredictionOut, responses=errors(404))
async def get_prediction(prediction_id: str, services: ServicesDep) -> PredictionOut:
    return _out(services, await _get(services, prediction_id))


@router.post(
    "/{prediction_id}/cancel",
    response_model=PredictionOut,
    dependencies=Guarded,
    responses={**GUARDED, **errors(404)},
)
async def cancel_prediction(prediction_id: str, services: ServicesDep) -> PredictionOut:
    """Cancel a running prediction (a finished one is returned as it is)."""
    await services.predictions.cancel_anywhere(prediction_id)
    return _out(services, await _get(services, prediction_id))
