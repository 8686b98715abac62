"""A finished prediction's record when it is not saved (LOG_PREDICTIONS=false, or the
database failed)."""

from __future__ import annotations

from typing import Any

from tritonbox_api.db.models import Prediction, utc_now


def completed_in_memory(record: Prediction, values: dict[str, Any]) -> Prediction:
    """The record completed with `values`, its derived timings filled in."""
    final = record.model_copy(update={**values, "completed_at": utc_now()})
    tokens, total = final.completion_tokens or 0, final.total_time_s or 0.0
    ttft = final.time_to_first_token_s
    if tokens > 1 and ttft is not None:
        final.time_per_output_token_s = (total - ttft) / (tokens - 1)
    final.tokens_per_second = tokens / total if total > 0 else None
    return final
