"""OpenAI's Files API, for batches: upload a batch's input (JSONL, purpose `batch`), read the
output and error files a batch writes (purpose `batch_output`), list and delete them."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, File, Form, Query, Request, Response, UploadFile

from tritonbox_api.db import batch_files
from tritonbox_api.db.batches import BatchFile
from tritonbox_api.deps import Guarded, Limited, ServicesDep, key_name
from tritonbox_api.protocol.batch_lines import content_lines
from tritonbox_api.protocol.batches import FileDeleted, FileList, FileObject, epoch
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


def not_found(file_id: str) -> ApiError:
    return ApiError(404, f"file: no file {file_id!r}", type="not_found_error", param="file_id")


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
    settings = services.settings
    content = await file.read(settings.max_batch_file_bytes + 1)
    if len(content) > settings.max_batch_file_bytes:
        raise ApiError(
            413,
            f"file: larger than the limit of {settings.max_batch_file_bytes} "
            "bytes (MAX_BATCH_FILE_BYTES)",
            param="file",
        )
    lines = len(content_lines(content))
    if lines > settings.max_batch_lines:
        raise ApiError(
            413,
            f"file: {lines} lines, more than the limit of "
            f"{settings.max_batch_lines} (MAX_BATCH_LINES)",
            param="file",
        )
    name, who = file.filename or "batch.jsonl", key_name(request)
    row = await services.database.run(
        lambda s: batch_files.add_file(
            s, purpose=purpose, filename=name, content=content, key_name=who
        )
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
    rows, more = await services.database.read(
        lambda s: batch_files.list_files(
            s, purpose=purpose, after=after, limit=limit, ascending=order == "asc"
        )
    )
    data = [file_object(row) for row in rows]
    first, last = (data[0].id, data[-1].id) if data else (None, None)
    return FileList(data=data, first_id=first, last_id=last, has_more=more)


@router.get("/files/{file_id}", response_model=FileObject, responses=errors(404))
async def get_file(file_id: str, services: ServicesDep) -> FileObject:
    row = await services.database.read(lambda s: batch_files.get_file(s, file_id))
    if row is None:
        raise not_found(file_id)
    return file_object(row)


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
    row = await services.database.read(lambda s: batch_files.get_file(s, file_id, content=True))
    if row is None:
        raise not_found(file_id)
    return Response(row.content, media_type=JSONL)


@router.delete("/files/{file_id}", response_model=FileDeleted, responses=errors(404))
async def delete_file(file_id: str, services: ServicesDep) -> FileDeleted:
    """Delete a file. A batch made from it keeps its lines (they were read at its create)."""
    if not await services.database.run(lambda s: batch_files.delete_file(s, file_id)):
        raise not_found(file_id)
    return FileDeleted(id=file_id)
