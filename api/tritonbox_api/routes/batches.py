"""OpenAI's Batch API: create a batch from an uploaded file, read it, list them, cancel it.

The lines are read and checked at create, in one pass: a duplicate custom_id refuses the batch
(400), too many lines too (413, MAX_BATCH_LINES); a line that cannot run as it stands is that
line's error, never the batch's. The lines then run in the api workers (service/batch_runner.py).
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query, Request

from tritonbox_api import metrics
from tritonbox_api.db import batch_files, batch_store
from tritonbox_api.db.batch_files import new_id
from tritonbox_api.db.batches import Batch, BatchStatus
from tritonbox_api.db.models import utc_now
from tritonbox_api.deps import Guarded, Limited, Services, ServicesDep, key_name
from tritonbox_api.protocol import batch_lines
from tritonbox_api.protocol.batches import (
    BatchErrors,
    BatchList,
    BatchObject,
    CreateBatch,
    RequestCounts,
    epoch,
    window,
)
from tritonbox_api.protocol.errors import ApiError
from tritonbox_api.routes.openai_errors import REFUSED, OpenAIRoute
from tritonbox_api.routes.responses import GUARDED, errors

router = APIRouter(
    prefix="/v1",
    tags=["batches"],
    dependencies=Guarded,
    responses=GUARDED,
    route_class=OpenAIRoute,
)


def batch_object(batch: Batch, counts: tuple[int, int]) -> BatchObject:
    completed, failed = counts
    return BatchObject(
        id=batch.id,
        endpoint=batch.endpoint,
        errors=BatchErrors.model_validate(batch.errors) if batch.errors else None,
        input_file_id=batch.input_file_id,
        completion_window=batch.completion_window,
        status=batch.status.value,
        output_file_id=batch.output_file_id,
        error_file_id=batch.error_file_id,
        created_at=epoch(batch.created_at) or 0,
        in_progress_at=epoch(batch.in_progress_at),
        expires_at=epoch(batch.expires_at),
        finalizing_at=epoch(batch.finalizing_at),
        completed_at=epoch(batch.completed_at),
        failed_at=epoch(batch.failed_at),
        expired_at=epoch(batch.expired_at),
        cancelling_at=epoch(batch.cancelling_at),
        cancelled_at=epoch(batch.cancelled_at),
        request_counts=RequestCounts(total=batch.total, completed=completed, failed=failed),
        metadata=batch.meta,
    )


async def _answer(services: Services, batch: Batch) -> BatchObject:
    counts = await services.database.read(lambda s: batch_store.counts(s, [batch.id]))
    return batch_object(batch, counts[batch.id])


def _not_found(batch_id: str) -> ApiError:
    return ApiError(404, f"batch: no batch {batch_id!r}", type="not_found_error", param="batch_id")


@router.post(
    "/batches",
    response_model=BatchObject,
    dependencies=Limited,  # one request per minute of the key's; its lines are not metered
    responses=errors(400, 404, 413, 429, notes={400: REFUSED}),
)
async def create_batch(body: CreateBatch, request: Request, services: ServicesDep) -> BatchObject:
    """Run every line of an uploaded file (purpose batch) within `completion_window`."""
    source = await services.database.read(
        lambda s: batch_files.get_file(s, body.input_file_id, content=True)
    )
    if source is None:
        raise ApiError(
            404,
            f"input_file_id: no file {body.input_file_id!r}",
            type="not_found_error",
            param="input_file_id",
        )
    if source.purpose != "batch":
        raise ApiError(
            400,
            f"input_file_id: {source.id} is a batch's output, not an input (purpose batch)",
            param="input_file_id",
        )
    lines = await asyncio.to_thread(batch_lines.parse, source.content)  # megabytes: off the loop
    limit = services.settings.max_batch_lines
    if len(lines) > limit:
        raise ApiError(
            413,
            f"input_file_id: {len(lines)} lines, more than the limit of {limit} (MAX_BATCH_LINES)",
            param="input_file_id",
        )
    twice = batch_lines.duplicate(lines)
    if twice is not None:
        custom_id, first, second = twice
        raise ApiError(
            400,
            f"input_file_id: custom_id {custom_id!r} is on lines {first} and "
            f"{second}; each line needs its own",
            param="input_file_id",
        )
    now = utc_now()
    batch = Batch(
        id=new_id("batch_"),
        status=BatchStatus.VALIDATING,
        endpoint=body.endpoint,
        input_file_id=source.id,
        completion_window=body.completion_window,
        total=len(lines),
        created_at=now,
        expires_at=now + window(body.completion_window),
        meta=body.metadata,
        api_key_name=key_name(request),
    )
    if not lines:  # OpenAI fails such a batch in validation: nothing to run
        batch.status, batch.failed_at = BatchStatus.FAILED, now
        message = "the input file has no lines"
        batch.errors = {"object": "list", "data": [{"code": "empty_file", "message": message}]}
    created = await services.database.run(
        lambda s: batch_store.create_batch(s, batch=batch, lines=lines)
    )
    refused = sum(each.refusal is not None for each in lines)
    if refused:
        metrics.BATCH_LINES.labels("failed").inc(refused)
    if services.batches is not None:
        services.batches.wake()
    return await _answer(services, created)


@router.get("/batches", response_model=BatchList, responses=errors(400, notes={400: REFUSED}))
async def list_batches(
    services: ServicesDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: str | None = None,
) -> BatchList:
    """Batches, newest first; `after`: the last id of a page."""
    rows, more = await services.database.read(
        lambda s: batch_store.list_batches(s, after=after, limit=limit)
    )
    counts = await services.database.read(lambda s: batch_store.counts(s, [b.id for b in rows]))
    data = [batch_object(row, counts[row.id]) for row in rows]
    first, last = (data[0].id, data[-1].id) if data else (None, None)
    return BatchList(data=data, first_id=first, last_id=last, has_more=more)


@router.get("/batches/{batch_id}", response_model=BatchObject, responses=errors(404))
async def get_batch(batch_id: str, services: ServicesDep) -> BatchObject:
    batch = await services.database.read(lambda s: batch_store.get_batch(s, batch_id))
    if batch is None:
        raise _not_found(batch_id)
    return await _answer(services, batch)


@router.post("/batches/{batch_id}/cancel", response_model=BatchObject, responses=errors(404))
async def cancel_batch(batch_id: str, services: ServicesDep) -> BatchObject:
    """Stop a batch: lines not begun end cancelled, running ones are stopped (the engine's
    request too, as for a client that leaves); what finished is kept. An ended batch is
    answered as it is."""
    batch = await services.database.run(lambda s: batch_store.request_cancel(s, batch_id))
    if batch is None:
        raise _not_found(batch_id)
    if services.batches is not None:
        services.batches.wake()
    return await _answer(services, batch)
