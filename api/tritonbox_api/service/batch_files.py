"""Batch files (OpenAI's Files API): a batch's input, uploaded (purpose `batch`), and the output
and error files a batch writes (purpose `batch_output`). The routes (routes/files.py) parse and
answer; the limits and the rows are kept here, so no route queries the files itself."""

from __future__ import annotations

from tritonbox_api.db import batch_files
from tritonbox_api.db.batches import BatchFile
from tritonbox_api.db.session import Database
from tritonbox_api.protocol.batch_lines import content_lines
from tritonbox_api.protocol.errors import ApiError
from tritonbox_api.settings import ApiSettings


def not_found(file_id: str) -> ApiError:
    return ApiError(404, f"file: no file {file_id!r}", type="not_found_error", param="file_id")


class FileService:
    def __init__(self, *, database: Database, settings: ApiSettings) -> None:
        self._database = database
        self._settings = settings

    async def create(
        self, *, content: bytes, filename: str, purpose: str, key_name: str | None
    ) -> BatchFile:
        """Keep an uploaded file; 413 past MAX_BATCH_FILE_BYTES or MAX_BATCH_LINES. `content`
        may be one byte over the limit (the route reads no more), which is enough to tell."""
        settings = self._settings
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
        return await self._database.run(
            lambda s: batch_files.add_file(
                s, purpose=purpose, filename=filename, content=content, key_name=key_name
            )
        )

    async def page(
        self, *, purpose: str | None, after: str | None, limit: int, ascending: bool
    ) -> tuple[list[BatchFile], bool]:
        """A page of files (without their bytes), newest first unless `ascending`, and whether
        more follow."""
        return await self._database.read(
            lambda s: batch_files.list_files(
                s, purpose=purpose, after=after, limit=limit, ascending=ascending
            )
        )

    async def get(self, file_id: str) -> BatchFile:
        """The file without its bytes (they may be megabytes); 404 when there is none."""
        row = await self._database.read(lambda s: batch_files.get_file(s, file_id))
        if row is None:
            raise not_found(file_id)
        return row

    async def content(self, file_id: str) -> bytes:
        """The file's bytes; 404 when there is no such file."""
        row = await self._database.read(lambda s: batch_files.get_file(s, file_id, content=True))
        if row is None:
            raise not_found(file_id)
        return row.content

    async def delete(self, file_id: str) -> None:
        """Delete a file; 404 when there is none. A batch made from it keeps its lines (they
        were read at its create)."""
        if not await self._database.run(lambda s: batch_files.delete_file(s, file_id)):
            raise not_found(file_id)
