"""The `prediction` table: one row per generation, from every route; `api_worker`: live workers;
`adapter`: the registered LoRA adapters.

A row is inserted when a prediction starts (status `processing`) and completed when it ends;
`input` keeps the request's parameters as sent, `applied` every parameter as the engine got it.
The schema changes only through a migration (tritonbox_api/migrations); a test checks that the
migrations and these models agree.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import JSON, Column
from sqlalchemy import Enum as SQLEnum
from sqlmodel import Field, SQLModel


class Status(StrEnum):
    STARTING = "starting"
    PROCESSING = "processing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"

    @property
    def finished(self) -> bool:
        return self in (Status.SUCCEEDED, Status.FAILED, Status.CANCELED)


class Source(StrEnum):
    API = "api"  # /v1/predictions
    OPENAI = "openai"  # /v1/completions, /v1/chat/completions
    PREDICT = "predict"  # seed-compatible /predict
    PLAYGROUND = "playground"  # /v1/predictions with the playground's source header


class FinishReason(StrEnum):
    STOP = "stop"  # the model ended its answer (end token)
    LENGTH = "length"  # max_tokens reached
    STOP_WORD = "stop_word"  # a stop word matched (and was cut from the output)
    CANCELED = "canceled"  # client gone or POST .../cancel
    ERROR = "error"


def _stored_by_value(enum: type[StrEnum]) -> SQLEnum:
    # By value, not by name: whoever opens the SQLite file sees the strings the api shows.
    return SQLEnum(
        enum, native_enum=False, length=16, values_callable=lambda e: [m.value for m in e]
    )


def utc_now() -> datetime:
    return datetime.now(UTC)


class Prediction(SQLModel, table=True):
    id: str = Field(primary_key=True, max_length=64)
    status: Status = Field(default=Status.STARTING, index=True, sa_type=_stored_by_value(Status))
    source: Source = Field(index=True, sa_type=_stored_by_value(Source))
    model: str
    input: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    applied: dict[str, Any] = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    output: str = ""
    error: str | None = None
    finish_reason: FinishReason | None = Field(default=None, sa_type=_stored_by_value(FinishReason))
    # Which of the request's stop words ended it (finish_reason `stop_word`): cut from `output`,
    # so it stood right after the output's last character.
    stop_word: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    time_to_first_token_s: float | None = None
    time_per_output_token_s: float | None = None
    total_time_s: float | None = None
    tokens_per_second: float | None = None
    created_at: datetime = Field(default_factory=utc_now, index=True)
    started_at: datetime | None = None
    completed_at: datetime | None = None
    # The api worker running it (ApiWorker.id); None for rows from before several workers.
    owner: str | None = Field(default=None, index=True, max_length=64)
    # Set by `POST .../cancel` on any worker; the owner sees it and stops the generation.
    cancel_requested_at: datetime | None = None
    # The LoRA adapter that answered (Adapter.name and the sha256 of its files); None: the base.
    adapter_name: str | None = Field(default=None, max_length=64)
    adapter_sha256: str | None = Field(default=None, max_length=64)
    # With several choices (`n` > 1): each one's {index, output, finish_reason, stop_word,
    # completion_tokens}; `output` and the rest above are the first's, completion_tokens the sum.
    choices: list[dict[str, Any]] | None = Field(default=None, sa_column=Column(JSON))
    # The name of the API key it came with (API_KEYS; `default`: API_KEY); None: no key is set.
    api_key_name: str | None = Field(default=None, max_length=64)
    # A batch line's answer (Batch API): the batch's id and the line's custom_id; else None.
    batch_id: str | None = Field(default=None, index=True, max_length=64)
    custom_id: str | None = None


class Adapter(SQLModel, table=True):
    """A registered LoRA adapter of the served base model. The weights stay in `source` (a
    local PEFT folder, or a Hugging Face repo downloaded into the model cache); `sha256` of its
    two files is checked again whenever they are read."""

    name: str = Field(primary_key=True, max_length=64)
    source: str
    base_model: str | None = None
    rank: int
    alpha: float
    target_modules: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    sha256: str = Field(max_length=64)
    size_bytes: int
    created_at: datetime = Field(default_factory=utc_now)


class ApiWorker(SQLModel, table=True):
    """A live api process: its heartbeat tells the others its running predictions are not
    orphans (crash recovery fails only the rows of workers whose heartbeat stopped)."""

    __tablename__ = "api_worker"

    id: str = Field(primary_key=True, max_length=64)
    started_at: datetime = Field(default_factory=utc_now)
    heartbeat_at: datetime = Field(default_factory=utc_now)
