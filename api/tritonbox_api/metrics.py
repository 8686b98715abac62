"""Prometheus metrics of the api, named after vLLM's so existing dashboards fit."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from tritonbox_api.db.models import Prediction

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)

TIME_TO_FIRST_TOKEN = Histogram(
    "tritonbox_time_to_first_token_seconds",
    "Time from request to the first generated token.",
    buckets=_LATENCY_BUCKETS,
)
TIME_PER_OUTPUT_TOKEN = Histogram(
    "tritonbox_time_per_output_token_seconds",
    "Mean time between output tokens of one request, after the first.",
    buckets=_TOKEN_BUCKETS,
)
E2E_LATENCY = Histogram(
    "tritonbox_e2e_request_latency_seconds",
    "Time from request to the end of its generation.",
    buckets=_LATENCY_BUCKETS,
)
# `key`: the API key's name (API_KEYS; `default`: API_KEY; empty: the api has no key), so each
# team member's or script's share shows.
PROMPT_TOKENS = Counter(
    "tritonbox_prompt_tokens", "Prompt tokens of finished predictions.", ["key"]
)
OUTPUT_TOKENS = Counter("tritonbox_generation_tokens", "Tokens generated.", ["key"])
REQUESTS = Counter(
    "tritonbox_requests",
    "Predictions by how they ended.",
    ["status", "source", "finish_reason", "key"],
)
# livesum: with several api workers (multiprocess mode), the sum over the live ones.
IN_FLIGHT = Gauge(
    "tritonbox_requests_in_flight", "Predictions being generated now.", multiprocess_mode="livesum"
)
REJECTED = Counter("tritonbox_requests_rejected", "Requests refused before generation.", ["reason"])


def observe(prediction: Prediction) -> None:
    """Count one finished prediction and observe its timings."""
    reason = prediction.finish_reason.value if prediction.finish_reason else "none"
    key = prediction.api_key_name or ""
    REQUESTS.labels(prediction.status.value, prediction.source.value, reason, key).inc()
    PROMPT_TOKENS.labels(key).inc(prediction.prompt_tokens or 0)
    OUTPUT_TOKENS.labels(key).inc(prediction.completion_tokens or 0)
    if prediction.time_to_first_token_s is not None:
        TIME_TO_FIRST_TOKEN.observe(prediction.time_to_first_token_s)
    if prediction.time_per_output_token_s is not None:
        TIME_PER_OUTPUT_TOKEN.observe(prediction.time_per_output_token_s)
    if prediction.total_time_s is not None:
        E2E_LATENCY.observe(prediction.total_time_s)


# Batch API (service/batch_runner.py): every line ends once with one outcome (completed: in the
# output file; failed, expired, cancelled: in the error file).
BATCH_LINES = Counter("tritonbox_batch_lines", "Batch lines by how they ended.", ["outcome"])
# The database's count (every worker reads the same): the highest of the live workers' reads.
BATCH_LINES_WAITING = Gauge(
    "tritonbox_batch_lines_waiting",
    "Batch lines not yet begun, over every open batch.",
    multiprocess_mode="livemax",
)
