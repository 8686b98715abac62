"""OpenAI's Files API, for batches: upload a batch's input (JSONL, purpose `batch`), read the
output and error files a batch writes (purpose `batch_output`), list and delete them. The files'
limits and rows are the file service's (service/batch_files.py)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, File, Form, Query, Request, Response, UploadFile

from tritonbox_api.db.batches import BatchFile
from tritonbox_api.deps import Guarded, Limited, ServicesDep, key_name
from tritonbox_api.protocol.batches import FileDeleted, FileList, FileObject, epoch
from tritonbox_api.routes.openai_errors import REFUSED, OpenAIRoute
from tritonbox_api.routes.responses import GUARDED, errors

router = APIRouter(
    prefix="/v1",
    tags=["batches"],
    dependencies=Guarded,
    responses=GUARDED,
    route_class=OpenAIRoute,
)
JSONL = "application/jsonl"
# MAX_BODY_BYTES does not bound an upload: its form's own parts (boundaries, the purpose) on
# top of MAX_BATCH_FILE_BYTES do (main.py).
FORM_SLACK_BYTES = 65_536


def file_object(row: BatchFile) -> FileObject:
    return FileObject(
        id=row.id,
        bytes=row.bytes,
        created_at=epoch(row.created_at) or 0,
        filename=row.filename,
        purpose=row.purpose,
    )


@router.post(
    "/files",
    response_model=FileObject,
    dependencies=Limited,  # one request per minute of the key's
    responses=errors(400, 413, 429, notes={400: REFUSED}),
)
async def upload(
    request: Request,
    services: ServicesDep,
    file: Annotated[UploadFile, File(description="JSONL: one request a line.")],
    purpose: Annotated[Literal["batch"], Form(description="`batch`: files are for batches.")],
) -> FileObject:
    """Upload a batch's input file (`purpose` batch): JSONL, each line a request."""
    # One byte past the limit is enough for the service to refuse it (413), and no more is read.
    content = await file.read(services.settings.max_batch_file_bytes + 1)
    row = await services.files.create(
        content=content,
        filename=file.filename or "batch.jsonl",
        purpose=purpose,
        key_name=key_name(request),
    )
    return file_object(row)


@router.get("/files", response_model=FileList, responses=errors(400, notes={400: REFUSED}))
async def list_files(
    services: ServicesDep,
    purpose: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    after: str | None = None,
    order: Literal["asc", "desc"] = "desc",
) -> FileList:
    """Files, newest first (`order` asc: oldest first); `after`: the last id of a page."""
    rows, more = await services.files.page(
        purpose=purpose, after=after, limit=limit, ascending=order == "asc"
    )
    data = [file_object(row) for row in rows]
    first, last = (data[0].id, data[-1].id) if data else (None, None)
    return FileList(data=data, first_id=first, last_id=last, has_more=more)


@router.get("/files/{file_id}", response_model=FileObject, responses=errors(404))
async def get_file(file_id: str, services: ServicesDep) -> FileObject:
    return file_object(await services.files.get(file_id))


@router.get(
    "/files/{file_id}/content",
    response_class=Response,
    responses={
        200: {
            "content": {JSONL: {"schema": {"type": "string"}}},
            "description": "The file's bytes.",
        },
        **errors(404),
    },
)
async def file_content(file_id: str, services: ServicesDep) -> Response:
    return Response(await services.files.content(file_id), media_type=JSONL)


@router.delete("/files/{file_id}", response_model=FileDeleted, responses=errors(404))
async def delete_file(file_id: str, services: ServicesDep) -> FileDeleted:
    """Delete a file. A batch made from it keeps its lines (they were read at its create)."""
    await services.files.delete(file_id)
    return FileDeleted(id=file_id)
