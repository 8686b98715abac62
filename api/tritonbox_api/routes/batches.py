"""OpenAI's Batch API: create a batch from an uploaded file, read it, list them, cancel it.

What a batch is and how its lines are checked and run is the batch service's
(service/batches.py); these routes parse the request and answer the batch as OpenAI shapes it.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from tritonbox_api.deps import Guarded, Limited, ServicesDep, key_name
from tritonbox_api.protocol.batches import (
    BatchErrors,
    BatchList,
    BatchObject,
    CreateBatch,
    RequestCounts,
    epoch,
)
from tritonbox_api.routes.openai_errors import REFUSED, OpenAIRoute
from tritonbox_api.routes.responses import GUARDED, errors
from tritonbox_api.service.batches import CountedBatch

router = APIRouter(
    prefix="/v1",
    tags=["batches"],
    dependencies=Guarded,
    responses=GUARDED,
    route_class=OpenAIRoute,
)


def batch_object(counted: CountedBatch) -> BatchObject:
    batch = counted.batch
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
        request_counts=RequestCounts(
            total=batch.total, completed=counted.completed, failed=counted.failed
        ),
        metadata=batch.meta,
    )


@router.post(
    "/batches",
    response_model=BatchObject,
    dependencies=Limited,  # one request per minute of the key's; its lines are not metered
    responses=errors(400, 404, 413, 429, notes={400: REFUSED}),
)
async def create_batch(body: CreateBatch, request: Request, services: ServicesDep) -> BatchObject:
    """Run every line of an uploaded file (purpose batch) within `completion_window`."""
    return batch_object(await services.batches.create(body=body, key_name=key_name(request)))


@router.get("/batches", response_model=BatchList, responses=errors(400, notes={400: REFUSED}))
async def list_batches(
    services: ServicesDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: str | None = None,
) -> BatchList:
    """Batches, newest first; `after`: the last id of a page."""
    rows, more = await services.batches.page(after=after, limit=limit)
    data = [batch_object(row) for row in rows]
    first, last = (data[0].id, data[-1].id) if data else (None, None)
    return BatchList(data=data, first_id=first, last_id=last, has_more=more)


@router.get("/batches/{batch_id}", response_model=BatchObject, responses=errors(404))
async def get_batch(batch_id: str, services: ServicesDep) -> BatchObject:
    return batch_object(await services.batches.get(batch_id))


@router.post("/batches/{batch_id}/cancel", response_model=BatchObject, responses=errors(404))
async def cancel_batch(batch_id: str, services: ServicesDep) -> BatchObject:
    """Stop a batch: lines not begun end cancelled, running ones are stopped (the engine's
    request too, as for a client that leaves); what finished is kept. An ended batch is
    answered as it is."""
    return batch_object(await services.batches.cancel(batch_id))
