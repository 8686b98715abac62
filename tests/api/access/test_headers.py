"""Every response carries the security headers; the permalink page's CSP allows its own inline
script and style and nothing else."""

from __future__ import annotations

import httpx
import pytest
from tritonbox_testing.api_process import RunningApi

pytestmark = pytest.mark.server

COMMON = {
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
}


def _prediction(url: str) -> str:
    body = {"input": {"prompt": "Say hi", "max_tokens": 2, "temperature": 0}}
    made = httpx.post(f"{url}/v1/predictions", json=body, timeout=120)
    assert made.status_code == 201
    prediction_id: str = made.json()["id"]
    return prediction_id


def test_json_errors_streams_and_pages_carry_the_headers(api_server: RunningApi) -> None:
    url = api_server.url
    prediction_id = _prediction(url)
    answers = [
        httpx.get(f"{url}/healthz"),
        httpx.get(f"{url}/v1/predictions/{prediction_id}"),
        httpx.post(f"{url}/v1/predictions", json={"input": {}}),  # a 422
        httpx.post(f"{url}/predict", json={"prompt": "Hi", "max_tokens": 2}, timeout=120),
        httpx.get(f"{url}/p/{prediction_id}"),
        httpx.get(f"{url}/p/{'x' * 32}"),  # the not-found page
    ]
    for answer in answers:
        for name, value in COMMON.items():
            assert answer.headers.get(name) == value, (answer.request.url, name)
        policy = answer.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy
    page_policy = answers[4].headers["content-security-policy"]
    assert "script-src 'sha256-" in page_policy and "style-src 'sha256-" in page_policy
    assert "unsafe-inline" not in page_policy
    assert answers[1].headers["content-security-policy"].startswith("default-src 'none'")
