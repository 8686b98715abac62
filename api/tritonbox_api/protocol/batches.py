"""OpenAI's Batch API objects (files, batches) as this api answers them, and the create body."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# The routes a batch line may target: those whose answers are whole JSON objects.
ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
# OpenAI takes "24h" only; here also a whole number of seconds, minutes or hours up to a week,
# so that a short job can expire early (and a test need not wait a day). The pattern is the
# whole rule (so the OpenAPI schema states it): 1-99999 s, 1-9999 m, 1-168 h.
WINDOW_PATTERN = r"^(?:[1-9][0-9]{0,4}s|[1-9][0-9]{0,3}m|(?:[1-9][0-9]?|1[0-5][0-9]|16[0-8])h)$"
_WINDOW = re.compile(WINDOW_PATTERN)
_UNITS = {"s": 1, "m": 60, "h": 3600}
MAX_WINDOW_TEXT = "168h"
MAX_METADATA = 16  # OpenAI's limits on metadata: pairs, key and value lengths
MAX_KEY_CHARS, MAX_VALUE_CHARS = 64, 512


def window(text: str) -> timedelta:
    """A completion window ("24h", "90m", "30s") as a duration; ValueError if it is none."""
    if _WINDOW.match(text) is None:
        raise ValueError(
            f"completion_window: {text!r} is not a window: a whole number of s, m or h up to "
            f"{MAX_WINDOW_TEXT}, as 24h"
        )
    return timedelta(seconds=int(text[:-1]) * _UNITS[text[-1]])


def epoch(moment: datetime | None) -> int | None:
    return int(moment.timestamp()) if moment is not None else None


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str = Field(description="`batch` (an upload), `batch_output` (a batch's output).")
    status: Literal["processed"] = "processed"
    status_details: str | None = None
    expires_at: int | None = None


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class RequestCounts(BaseModel):
    total: int
    completed: int = Field(description="Lines answered 2xx: in the output file.")
    failed: int = Field(
        description="Lines in the error file: answered 4xx/5xx, malformed, expired or cancelled."
    )


class BatchError(BaseModel):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class BatchObject(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: str = Field(
        description="validating, in_progress, finalizing, completed, failed, expired, "
        "cancelling or cancelled."
    )
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts
    metadata: dict[str, str] | None = None


class BatchList(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class CreateBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(max_length=64)
    endpoint: Literal["/v1/chat/completions", "/v1/completions"]
    completion_window: str = Field(
        default="24h",
        description="24h, or a whole number of s (to 99999), m (to 9999) or h (to 168).",
        json_schema_extra={"pattern": WINDOW_PATTERN},  # checked by `window`, named
    )
    metadata: dict[str, str] | None = Field(
        default=None,
        json_schema_extra={
            "maxProperties": MAX_METADATA,
            "propertyNames": {"maxLength": MAX_KEY_CHARS},
            "additionalProperties": {"type": "string", "maxLength": MAX_VALUE_CHARS},
        },
    )
    # OpenAI's newer expiry of the output files: taken, not applied (files are kept until
    # deleted here).
    output_expires_after: dict[str, Any] | None = None

    @field_validator("completion_window")
    @classmethod
    def _window(cls, value: str) -> str:
        window(value)
        return value

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return None
        if len(value) > MAX_METADATA:
            raise ValueError(f"metadata: {len(value)} pairs, more than {MAX_METADATA}")
        for key, text in value.items():
            if len(key) > MAX_KEY_CHARS or len(text) > MAX_VALUE_CHARS:
                raise ValueError(
                    f"metadata: keys of at most {MAX_KEY_CHARS} characters, values of at "
                    f"most {MAX_VALUE_CHARS}; {key!r} is over"
                )
        return value
