"""Health, readiness and Prometheus metrics of the running api."""

from __future__ import annotations

import time

import httpx
from tritonbox_testing.api_process import RunningApi


def test_health_and_readiness(api: httpx.Client) -> None:
    assert api.get("/healthz").json() == {"status": "ok"}
    ready = api.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {
        "status": "ready",
        "triton": "ready",
        "database": "writable",
        "tokenizer": "loaded",  # loaded from the start, before any request needed it
    }


def test_metrics_count_predictions(api: httpx.Client) -> None:
    def value(text: str, line_start: str) -> float:
        lines = [line for line in text.splitlines() if line.startswith(line_start)]
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines)

    before = api.get("/metrics").text
    api.post("/v1/predictions", json={"input": {"prompt": "Hi", "max_tokens": 3}})
    after = api.get("/metrics").text
    for name in (
        "tritonbox_time_to_first_token_seconds_count",
        "tritonbox_e2e_request_latency_seconds_count",
        "tritonbox_requests_total{finish_reason",
    ):
        assert value(after, name) == value(before, name) + 1, name
    assert value(after, "tritonbox_generation_tokens_total") > value(
        before, "tritonbox_generation_tokens_total"
    )
    assert "tritonbox_requests_in_flight 0.0" in after


def test_probes_stay_out_of_the_access_log(api: httpx.Client, api_server: RunningApi) -> None:
    marker = "/v1/predictions/probe-log-marker"
    for path in ("/healthz", "/readyz", "/metrics?x=1"):
        api.get(path)
    api.get(marker)  # 404: an ordinary request, logged
    deadline = time.monotonic() + 10
    while marker not in api_server.log_path.read_text():
        assert time.monotonic() < deadline, "the access log never showed the marker request"
        time.sleep(0.1)
    access = [line for line in api_server.log_path.read_text().splitlines() if '" ' in line]
    assert not [
        line for line in access if any(p in line for p in ("/healthz", "/readyz", "/metrics"))
    ]
