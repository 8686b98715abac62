"""A prediction's row: written when it starts, completed once when it ends.

The insert is not awaited before generating (it overlaps the engine's prefill); the completion
awaits it first. Should the database fail, or LOG_PREDICTIONS be off, the prediction still ends
with its record completed in memory (service/outcome.py).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from tritonbox_api.db import crud
from tritonbox_api.db.group_commit import PredictionWrites
from tritonbox_api.db.models import Prediction, Source, Status, utc_now
from tritonbox_api.db.session import Database
from tritonbox_api.service.batch_context import LineContext
from tritonbox_api.service.generation import Progress
from tritonbox_api.service.outcome import completed_in_memory
from tritonbox_api.service.prepare import PreparedGeneration

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    status: Status = Status.SUCCEEDED
    error: str | None = None
    retryable: bool = False


def new_record(
    prepared: PreparedGeneration,
    *,
    source: Source,
    model: str,
    sent: dict[str, Any],
    key_name: str | None,
    line: LineContext | None,
) -> Prediction:
    """The row of a prediction starting now (`processing`), with a new id."""
    return Prediction(
        id=crud.new_prediction_id(),
        status=Status.PROCESSING,
        source=source,
        model=model,
        input=sent,
        applied=prepared.applied,
        prompt_tokens=prepared.prompt_tokens,
        started_at=utc_now(),
        adapter_name=prepared.adapter.name if prepared.adapter else None,
        adapter_sha256=prepared.adapter.sha256 if prepared.adapter else None,
        api_key_name=key_name,
        batch_id=line.batch_id if line else None,
        custom_id=line.custom_id if line else None,
    )


def values(
    record: Prediction, outcome: Outcome, progress: Progress, total_time_s: float
) -> dict[str, Any]:
    """The row's completion: every choice's text and counts (`choices` only with `n` > 1)."""
    every = [progress, *progress.others]
    choices = [
        {
            "index": index,
            "output": "".join(each.output),
            "finish_reason": each.finish_reason.value if each.finish_reason else None,
            "stop_word": each.stop_word,
            "completion_tokens": each.completion_tokens,
        }
        for index, each in enumerate(every)
    ]
    return dict(
        id=record.id,
        status=outcome.status,
        output="".join(progress.output),
        finish_reason=progress.finish_reason,
        stop_word=progress.stop_word,
        choices=choices if progress.others else None,
        error=outcome.error,
        completion_tokens=sum(each.completion_tokens for each in every),
        time_to_first_token_s=progress.time_to_first_token_s,
        total_time_s=total_time_s,
    )


class Recorder:
    def __init__(self, database: Database, *, log_predictions: bool) -> None:
        # Its inserts and completions: those that pile up on the writer share one commit.
        self.writes = PredictionWrites(database)
        self._log = log_predictions

    def insert(self, record: Prediction) -> asyncio.Task[Any] | None:
        """The row's insert, started and not awaited; None when predictions are not saved."""
        if not self._log:
            return None
        insert = self.writes.create(
            id=record.id,
            source=record.source,
            model=record.model,
            input=record.input,
            applied=record.applied,
            prompt_tokens=record.prompt_tokens,
            adapter_name=record.adapter_name,
            adapter_sha256=record.adapter_sha256,
            api_key_name=record.api_key_name,
            batch_id=record.batch_id,
            custom_id=record.custom_id,
        )
        # Not awaited before generating: the insert overlaps the engine's prefill.
        return asyncio.create_task(insert)

    async def complete(
        self,
        record: Prediction,
        inserted: asyncio.Task[Any] | None,
        outcome: Outcome,
        progress: Progress,
        total_time_s: float,
    ) -> Prediction:
        """The completed row; in memory only when not saved or when saving failed."""
        ending = values(record, outcome, progress, total_time_s)
        if inserted is None:
            return completed_in_memory(record, ending)
        try:
            await inserted
            return await self.writes.complete(**ending)
        except Exception:
            log.exception("could not save prediction %s", record.id)
            return completed_in_memory(record, ending)
