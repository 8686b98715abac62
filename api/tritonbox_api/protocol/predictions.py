"""Replicate-style predictions: the request body and the public prediction object."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tritonbox_api.db.models import FinishReason, Prediction, Source, Status
from tritonbox_api.protocol.generation import GenerationInput


class PredictionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: GenerationInput
    stream: bool = Field(default=False, description="Answer with server-sent events.")
    source: Literal["api", "playground"] = Field(
        default="api", description="Who asks: the playground marks its own runs."
    )


class PredictRequest(GenerationInput):
    """Seed-compatible `/predict`: the TensorRT-LLM truss JSON."""

    stream: bool = Field(default=True, description="Stream plain-text chunks.")


class PredictionMetrics(BaseModel):
    prompt_tokens: int | None
    completion_tokens: int | None
    time_to_first_token_s: float | None
    time_per_output_token_s: float | None
    total_time_s: float | None
    tokens_per_second: float | None


class PredictionUrls(BaseModel):
    get: str
    cancel: str
    web: str
    playground: str


class AdapterRef(BaseModel):
    name: str
    sha256: str = Field(description="Of the adapter's files when it answered.")


class PredictionOut(BaseModel):
    id: str
    status: Status
    source: Source
    model: str
    input: dict[str, Any] = Field(description="The parameters as sent.")
    applied: dict[str, Any] = Field(description="Every parameter as the engine got it.")
    output: str
    error: str | None
    finish_reason: FinishReason | None
    stop_word: str | None = Field(
        description="The stop word that ended the output (finish_reason `stop_word`); it is cut "
        "from `output` and stood right after its last character."
    )
    adapter: AdapterRef | None = Field(
        description="The LoRA adapter that answered; null: the base model."
    )
    metrics: PredictionMetrics
    choices: list[dict[str, Any]] | None = Field(
        default=None,
        description="With several choices (OpenAI's `n` > 1): each one's index, output, "
        "finish_reason, stop_word and completion_tokens; `output` is the first's and "
        "`metrics.completion_tokens` the sum. Null for one choice.",
    )
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    urls: PredictionUrls


class PredictUsage(BaseModel):
    prompt_tokens: int | None
    completion_tokens: int | None


class PredictOut(BaseModel):
    """`POST /predict` with `"stream": false`: the whole output, however it ended."""

    id: str
    output: str
    status: Status
    finish_reason: FinishReason | None
    stop_word: str | None
    error: str | None
    usage: PredictUsage
    urls: PredictionUrls


class PredictionList(BaseModel):
    results: list[PredictionOut]
    next: str | None = Field(description="URL of the next (older) page, if any.")


def _utc(moment: datetime | None) -> datetime | None:
    # SQLite gives datetimes back without their zone; they were stored in UTC.
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


def prediction_urls(prediction_id: str, *, public_url: str, playground_url: str) -> PredictionUrls:
    return PredictionUrls(
        get=f"{public_url}/v1/predictions/{prediction_id}",
        cancel=f"{public_url}/v1/predictions/{prediction_id}/cancel",
        web=f"{public_url}/p/{prediction_id}",
        playground=f"{playground_url}/?p={prediction_id}",
    )


def prediction_out(row: Prediction, *, public_url: str, playground_url: str) -> PredictionOut:
    created = _utc(row.created_at)
    assert created is not None
    return PredictionOut(
        id=row.id,
        status=row.status,
        source=row.source,
        model=row.model,
        input=row.input,
        applied=row.applied,
        output=row.output,
        error=row.error,
        finish_reason=row.finish_reason,
        stop_word=row.stop_word,
        adapter=AdapterRef(name=row.adapter_name, sha256=row.adapter_sha256 or "")
        if row.adapter_name
        else None,
        metrics=PredictionMetrics(
            prompt_tokens=row.prompt_tokens,
            completion_tokens=row.completion_tokens,
            time_to_first_token_s=row.time_to_first_token_s,
            time_per_output_token_s=row.time_per_output_token_s,
            total_time_s=row.total_time_s,
            tokens_per_second=row.tokens_per_second,
        ),
        choices=row.choices,
        created_at=created,
        started_at=_utc(row.started_at),
        completed_at=_utc(row.completed_at),
        urls=prediction_urls(row.id, public_url=public_url, playground_url=playground_url),
    )
