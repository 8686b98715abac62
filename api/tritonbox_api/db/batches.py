"""The Batch API's tables: `batch_file` (uploaded input files and the output and error files a
batch writes), `batch` (one row per batch, its status and timestamps, OpenAI's object) and
`batch_line` (one row per line of its input file: the unit the api workers claim, run and end).

A line's row is its whole life: `pending` until a worker claims it (`running`, `claimed_by`),
then `done` with its `outcome` and the output line it wrote (`result`). The output and error
files are made from those rows once every line is done, so each line is in exactly one of them,
once. Input files are kept in the database (`content`), so every api worker, on any machine,
reads the same bytes and a restart loses nothing.
"""

from __future__ import annotations

import builtins
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import JSON, Column, Index, LargeBinary, Text, UniqueConstraint
from sqlmodel import Field, SQLModel

from tritonbox_api.db.models import _stored_by_value, utc_now


class BatchStatus(StrEnum):
    """OpenAI's batch statuses."""

    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def ended(self) -> bool:
        return self in (self.COMPLETED, self.FAILED, self.EXPIRED, self.CANCELLED)


class LineState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"


class LineOutcome(StrEnum):
    COMPLETED = "completed"  # answered 2xx: in the output file
    FAILED = "failed"  # answered 4xx/5xx, or malformed: in the error file
    EXPIRED = "expired"  # not done within the completion window: in the error file
    CANCELLED = "cancelled"  # the batch was cancelled first: in the error file


class BatchFile(SQLModel, table=True):
    __tablename__ = "batch_file"

    id: str = Field(primary_key=True, max_length=64)
    purpose: str = Field(max_length=16)  # batch (an upload), batch_output (a batch's output)
    filename: str
    bytes: int
    created_at: datetime = Field(default_factory=utc_now, index=True)
    api_key_name: str | None = Field(default=None, max_length=64)
    content: builtins.bytes = Field(sa_column=Column(LargeBinary, nullable=False))


class Batch(SQLModel, table=True):
    __tablename__ = "batch"

    id: str = Field(primary_key=True, max_length=64)
    status: BatchStatus = Field(index=True, sa_type=_stored_by_value(BatchStatus))
    endpoint: str
    input_file_id: str = Field(max_length=64)
    completion_window: str = Field(max_length=16)
    total: int  # lines in the input file
    created_at: datetime = Field(default_factory=utc_now, index=True)
    expires_at: datetime
    in_progress_at: datetime | None = None
    finalizing_at: datetime | None = None
    completed_at: datetime | None = None
    failed_at: datetime | None = None
    expired_at: datetime | None = None
    cancelling_at: datetime | None = None
    cancelled_at: datetime | None = None
    output_file_id: str | None = Field(default=None, max_length=64)
    error_file_id: str | None = Field(default=None, max_length=64)
    errors: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    # `metadata` is SQLAlchemy's own attribute on a model: the column keeps OpenAI's name.
    meta: dict[str, str] | None = Field(default=None, sa_column=Column("metadata", JSON))
    api_key_name: str | None = Field(default=None, max_length=64)


class BatchLine(SQLModel, table=True):
    __tablename__ = "batch_line"
    __table_args__ = (
        UniqueConstraint("batch_id", "line", name="uq_batch_line_batch_id_line"),
        # The claim's query: a batch's pending lines, in file order.
        Index("ix_batch_line_batch_id_state", "batch_id", "state"),
    )

    id: int | None = Field(default=None, primary_key=True)
    batch_id: str = Field(max_length=64)
    line: int  # its number in the input file, from 1
    custom_id: str | None = None
    url: str | None = None
    body: str | None = Field(default=None, sa_column=Column(Text))  # JSON text
    state: LineState = Field(default=LineState.PENDING, sa_type=_stored_by_value(LineState))
    outcome: LineOutcome | None = Field(default=None, sa_type=_stored_by_value(LineOutcome))
    claimed_by: str | None = Field(default=None, max_length=64)  # the api worker running it
    attempts: int = 0  # runs begun (an engine that was down, a worker that stopped: again)
    prediction_id: str | None = Field(default=None, max_length=64)
    result: str | None = Field(default=None, sa_column=Column(Text))  # its output line (JSON)
    ended_at: datetime | None = None
