"""Rate limits per key on the real api process in front of the real tritonserver (its synthetic
engine: exactly `max_tokens` tokens at a fixed pace, no model's CPU): a key past its requests
or tokens per minute gets 429 with Retry-After and OpenAI's x-ratelimit-* headers on every
generating route, while another key is still served (the limiter's arithmetic:
test_rate_limit.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from tritonbox_testing.api_process import RunningApi, launch_api

MODEL = "SmolLM2-135M-Instruct"  # the session's default model (the synthetic engine's name)
KEYS = "slow:use:slow-key:rpm=5,tok:use:tok-key:tpm=200,free:use:free-key,bat:use:bat-key:rpm=3"
RATE_HEADERS = ("limit", "remaining", "reset")


@pytest.fixture(scope="module")
def limited_api(
    triton_launcher: Callable[..., Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningApi]:
    with triton_launcher(engine="synthetic", synthetic_token_interval_s=0.005) as triton:
        running = launch_api(triton, tmp_path_factory.mktemp("api"), api_keys=KEYS)
        try:
            running.wait_ready()
            yield running
        finally:
            running.stop()


def _post(api: RunningApi, key: str, path: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{api.url}{path}", json=body, headers=headers, timeout=60)


# One small generation on each generating route.
ROUTES: list[tuple[str, dict[str, Any]]] = [
    ("/predict", {"prompt": "Hello", "max_tokens": 2, "stream": False}),
    ("/v1/predictions", {"input": {"prompt": "Hello", "max_tokens": 2}}),
    ("/v1/completions", {"model": MODEL, "prompt": "Hello", "max_tokens": 2}),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
    ),
]


def test_past_its_requests_per_minute_a_key_gets_429_and_another_is_served(
    limited_api: RunningApi,
) -> None:
    remaining = []
    for path, body in ROUTES:
        answer = _post(limited_api, "slow-key", path, body)
        assert answer.status_code in (200, 201), answer.text
        assert answer.headers["x-ratelimit-limit-requests"] == "5"
        assert answer.headers["x-ratelimit-reset-requests"].endswith("s")
        remaining.append(int(answer.headers["x-ratelimit-remaining-requests"]))
        assert "x-ratelimit-limit-tokens" not in answer.headers  # no token limit on this key
    assert remaining == [4, 3, 2, 1]
    assert _post(limited_api, "slow-key", *ROUTES[0]).status_code == 200  # the fifth
    # Every generating route, and creating a batch, refuses the sixth and on.
    for path, body in [*ROUTES, ("/v1/batches", {})]:
        refused = _post(limited_api, "slow-key", path, body)
        assert refused.status_code == 429, (path, refused.text)
        error = refused.json()["error"]
        assert error["type"] == "rate_limit_error"
        assert "rate limit reached for key slow: 5 requests per minute" in error["message"]
        assert 1 <= int(refused.headers["Retry-After"]) <= 12  # one more in 12 s
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        for what in RATE_HEADERS:
            assert f"x-ratelimit-{what}-requests" in refused.headers
    # Another key is not touched by it; a key without limits gets no headers.
    for path, body in ROUTES:
        served = _post(limited_api, "free-key", path, body)
        assert served.status_code in (200, 201), served.text
        assert not any(h.startswith("x-ratelimit-") for h in served.headers)


def test_past_its_tokens_per_minute_a_key_gets_429_and_unused_tokens_come_back(
    limited_api: RunningApi,
) -> None:
    path = "/v1/completions"
    # Reserves its prompt + 150 of the key's 200, uses a few: a stop word ends it early.
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 150, "stop": ["fox"]}
    first = _post(limited_api, "tok-key", path, body)
    assert first.status_code == 200, first.text
    assert first.json()["choices"][0]["finish_reason"] == "stop"
    assert first.headers["x-ratelimit-limit-tokens"] == "200"
    assert int(first.headers["x-ratelimit-remaining-tokens"]) < 200
    assert "x-ratelimit-limit-requests" not in first.headers
    # Fits only because the first gave back what it did not use; uses all 150 (synthetic).
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 150}
    second = _post(limited_api, "tok-key", path, body)
    assert second.status_code == 200, second.text
    assert second.json()["usage"]["completion_tokens"] == 150
    third = _post(limited_api, "tok-key", path, body)
    assert third.status_code == 429, third.text
    message = third.json()["error"]["message"]
    assert "rate limit reached for key tok: 200 tokens per minute" in message
    assert int(third.headers["Retry-After"]) >= 1
    for what in RATE_HEADERS:
        assert f"x-ratelimit-{what}-tokens" in third.headers
    assert int(third.headers["x-ratelimit-remaining-tokens"]) < 150
    # More than the whole minute: never fits, so no Retry-After.
    large = _post(limited_api, "tok-key", path, {**body, "max_tokens": 120, "n": 2})
    assert large.status_code == 429
    assert "request too large for key tok" in large.json()["error"]["message"]
    assert "Retry-After" not in large.headers
    # Another key meanwhile: served.
    assert _post(limited_api, "free-key", path, body).status_code == 200


def test_a_batchs_lines_are_not_metered(limited_api: RunningApi) -> None:
    """Creating the batch is a request of the key's; its lines (more than the key's requests per
    minute here) run in the room live requests leave, unrefused."""
    auth = {"Authorization": "Bearer bat-key"}
    lines = [
        {"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions",
         "body": {"model": MODEL, "prompt": "Hello", "max_tokens": 2}}
        for i in range(4)
    ]  # fmt: skip
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    with httpx.Client(base_url=limited_api.url, headers=auth, timeout=60) as client:
        upload = client.post(
            "/v1/files",
            files={"file": ("in.jsonl", content, "application/jsonl")},
            data={"purpose": "batch"},
        )
        assert upload.status_code == 200, upload.text
        body = {"input_file_id": upload.json()["id"], "endpoint": "/v1/completions",
                "completion_window": "24h"}  # fmt: skip
        created = client.post("/v1/batches", json=body)
        assert created.status_code == 200, created.text
        assert created.headers["x-ratelimit-limit-requests"] == "3"
        deadline = time.monotonic() + 120
        while (batch := client.get(f"/v1/batches/{created.json()['id']}").json())["status"] in (
            "validating", "in_progress", "finalizing",
        ):  # fmt: skip
            assert time.monotonic() < deadline, batch
            time.sleep(0.2)
    assert batch["status"] == "completed", batch
    assert batch["request_counts"]["completed"] == 4, batch
