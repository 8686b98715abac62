"""Batches (OpenAI's Batch API): create one from an uploaded file, read them, cancel one.

The lines are read and checked at create, in one pass: a duplicate custom_id refuses the batch
(400), too many lines too (413, MAX_BATCH_LINES); a line that cannot run as it stands is that
line's error, never the batch's. The lines then run in the api workers (batch_runner.py), which
a create or a cancel wakes so that it acts without waiting for its next poll.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tritonbox_api import metrics
from tritonbox_api.db import batch_files, batch_store
from tritonbox_api.db.batch_files import new_id
from tritonbox_api.db.batches import Batch, BatchStatus
from tritonbox_api.db.models import utc_now
from tritonbox_api.db.session import Database
from tritonbox_api.protocol import batch_lines
from tritonbox_api.protocol.batches import CreateBatch, window
from tritonbox_api.protocol.errors import ApiError
from tritonbox_api.service.batch_runner import BatchRunner
from tritonbox_api.settings import ApiSettings


@dataclass(frozen=True)
class CountedBatch:
    """A batch and its lines done so far: what its answer reports (`request_counts`)."""

    batch: Batch
    completed: int
    failed: int  # every line in the error file


def not_found(batch_id: str) -> ApiError:
    return ApiError(404, f"batch: no batch {batch_id!r}", type="not_found_error", param="batch_id")


class BatchService:
    def __init__(self, *, database: Database, settings: ApiSettings) -> None:
        self._database = database
        self._settings = settings
        # Set once the app has started it (main.py: the runner sends lines through the app, so
        # it is built after these services); until then nothing runs lines to wake.
        self.runner: BatchRunner | None = None

    def _wake(self) -> None:
        if self.runner is not None:
            self.runner.wake()

    async def _counted(self, batches: list[Batch]) -> list[CountedBatch]:
        counts = await self._database.read(lambda s: batch_store.counts(s, [b.id for b in batches]))
        return [CountedBatch(b, *counts[b.id]) for b in batches]

    async def create(self, *, body: CreateBatch, key_name: str | None) -> CountedBatch:
        """Read and check the input file's lines and keep the batch with a row per line; 404
        for no such file, 400 for an output file or a repeated custom_id, 413 for too many."""
        source = await self._database.read(
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
        lines = await asyncio.to_thread(batch_lines.parse, source.content)  # megabytes: off loop
        limit = self._settings.max_batch_lines
        if len(lines) > limit:
            raise ApiError(
                413,
                f"input_file_id: {len(lines)} lines, more than the limit of {limit} "
                "(MAX_BATCH_LINES)",
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
            api_key_name=key_name,
        )
        if not lines:  # OpenAI fails such a batch in validation: nothing to run
            batch.status, batch.failed_at = BatchStatus.FAILED, now
            message = "the input file has no lines"
            batch.errors = {"object": "list", "data": [{"code": "empty_file", "message": message}]}
        created = await self._database.run(
            lambda s: batch_store.create_batch(s, batch=batch, lines=lines)
        )
        refused = sum(each.refusal is not None for each in lines)
        if refused:  # lines refused as they stand ended at create: the runner never sees them
            metrics.BATCH_LINES.labels("failed").inc(refused)
        self._wake()
        return (await self._counted([created]))[0]

    async def page(self, *, after: str | None, limit: int) -> tuple[list[CountedBatch], bool]:
        """A page of batches, newest first, after the batch `after`; and whether more follow."""
        rows, more = await self._database.read(
            lambda s: batch_store.list_batches(s, after=after, limit=limit)
        )
        return await self._counted(rows), more

    async def get(self, batch_id: str) -> CountedBatch:
        """The batch of that id; 404 when there is none."""
        batch = await self._database.read(lambda s: batch_store.get_batch(s, batch_id))
        if batch is None:
            raise not_found(batch_id)
        return (await self._counted([batch]))[0]

    async def cancel(self, batch_id: str) -> CountedBatch:
        """Stop a batch: lines not begun end cancelled, the runners stop running ones (the
        engine's request too); what finished is kept. An ended batch comes back as it is; 404
        when there is none."""
        batch = await self._database.run(lambda s: batch_store.request_cancel(s, batch_id))
        if batch is None:
            raise not_found(batch_id)
        self._wake()
        return (await self._counted([batch]))[0]
