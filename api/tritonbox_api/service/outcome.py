"""A finished prediction's record when it is not saved, and its Prometheus observations."""

from __future__ import annotations

from typing import Any

from tritonbox_api import metrics
from tritonbox_api.db.models import Prediction, utc_now


def completed_in_memory(record: Prediction, values: dict[str, Any]) -> Prediction:
    """The record completed with `values` (LOG_PREDICTIONS=false, or the database failed)."""
    final = record.model_copy(update={**values, "completed_at": utc_now()})
    tokens, total = final.completion_tokens or 0, final.total_time_s or 0.0
    ttft = final.time_to_first_token_s
    if tokens > 1 and ttft is not None:
        final.time_per_output_token_s = (total - ttft) / (tokens - 1)
    final.tokens_per_second = tokens / total if total > 0 else None
    return final


def observe(prediction: Prediction) -> None:
    reason = prediction.finish_reason.value if prediction.finish_reason else "none"
    metrics.REQUESTS.labels(prediction.status.value, prediction.source.value, reason).inc()
    metrics.PROMPT_TOKENS.inc(prediction.prompt_tokens or 0)
    metrics.OUTPUT_TOKENS.inc(prediction.completion_tokens or 0)
    if prediction.time_to_first_token_s is not None:
        metrics.TIME_TO_FIRST_TOKEN.observe(prediction.time_to_first_token_s)
    if prediction.time_per_output_token_s is not None:
        metrics.TIME_PER_OUTPUT_TOKEN.observe(prediction.time_per_output_token_s)
    if prediction.total_time_s is not None:
        metrics.E2E_LATENCY.observe(prediction.total_time_s)
