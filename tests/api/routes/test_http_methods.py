"""405 names the methods a path serves (`Allow`); HEAD answers wherever GET does, without a body."""

from __future__ import annotations

import httpx
import pytest

OK = {"input": {"prompt": "The capital of France is", "max_tokens": 2, "temperature": 0}}


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("DELETE", "/v1/predictions", {"GET", "HEAD", "POST"}),
        ("POST", "/v1/models", {"GET", "HEAD"}),
        ("GET", "/predict", {"POST"}),
        ("PUT", "/healthz", {"GET", "HEAD"}),
        ("GET", "/v1/chat/completions", {"POST"}),
    ],
)
def test_405_carries_allow(api: httpx.Client, method: str, path: str, allowed: set[str]) -> None:
    answer = api.request(method, path)
    assert answer.status_code == 405
    assert set(answer.headers["allow"].split(", ")) == allowed
    assert answer.json()["error"]["type"] == "invalid_request_error"


def test_head_answers_as_get_without_a_body(api: httpx.Client) -> None:
    made = api.post("/v1/predictions", json=OK)
    assert made.status_code == 201
    prediction_id = made.json()["id"]
    for path in (
        "/v1/models",
        "/healthz",
        f"/v1/predictions/{prediction_id}",
        f"/p/{prediction_id}",
    ):
        get, head = api.get(path), api.head(path)
        assert (get.status_code, head.status_code) == (200, 200), path
        assert head.content == b""
        assert head.headers["content-type"] == get.headers["content-type"]
        assert head.headers["content-length"] == str(len(get.content))
        assert head.headers["x-content-type-options"] == "nosniff"
    missing = api.head("/v1/predictions/" + "x" * 32)
    assert missing.status_code == 404 and missing.content == b""
    assert api.head("/predict").status_code == 405
