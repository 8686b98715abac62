"""ApiClient: the api's answers and failures as the playground sees them (a MockTransport
stands in for the api; the real one is exercised by the server tests)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from tritonbox_testing.ports import free_port

from tritonbox_playground.api_client import ApiClient, PlaygroundError, PredictionView, RunStarted

PREDICTION = {
    "id": "abc",
    "status": "succeeded",
    "source": "playground",
    "input": {"prompt": "Hi"},
    "applied": {"prompt": "Hi", "max_tokens": 5},
    "output": " there,\nfriend",
    "error": None,
    "finish_reason": "stop_word",
    "metrics": {"prompt_tokens": 1, "completion_tokens": 3},
    "urls": {"web": "http://api/p/abc"},
    "created_at": "2026-11-01T10:00:00Z",
    "model": "m",
}


def client(handler: Callable[[httpx.Request], httpx.Response]) -> ApiClient:
    return ApiClient("http://api", api_key="k", transport=httpx.MockTransport(handler))


def sse(*events: tuple[str, str]) -> bytes:
    lines = []
    for event, data in events:
        lines.append(f"event: {event}")
        lines += [f"data: {line}" for line in data.split("\n")]
        lines.append("")
    return ("\r\n".join(lines) + "\r\n").encode()


async def collect(api: ApiClient, body: dict[str, Any]) -> list[Any]:
    return [event async for event in api.stream_prediction(body)]


def test_stream_yields_the_id_then_exact_pieces_then_the_prediction() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        body = b": ping\r\n\r\n" + sse(
            ("output", " there,"), ("output", "\nfriend"), ("done", json.dumps(PREDICTION))
        )
        return httpx.Response(200, content=body, headers={"X-Prediction-Id": "abc"})

    events = asyncio.run(collect(client(handler), {"prompt": "Hi"}))
    assert events[0] == RunStarted("abc")
    assert events[1:3] == [" there,", "\nfriend"]  # the one space after "data:" only is dropped
    assert isinstance(events[3], PredictionView) and events[3].finish_reason == "stop_word"
    request = seen[0]
    assert request.headers["authorization"] == "Bearer k"
    assert json.loads(request.content) == {
        "input": {"prompt": "Hi"},
        "stream": True,
        "source": "playground",
    }


def test_a_failed_prediction_ends_the_stream_with_its_error() -> None:
    failed = {**PREDICTION, "status": "failed", "error": "the engine broke", "output": ""}

    def handler(request: httpx.Request) -> httpx.Response:
        body = sse(
            ("error", json.dumps({"detail": "the engine broke"})), ("done", json.dumps(failed))
        )
        return httpx.Response(200, content=body, headers={"X-Prediction-Id": "abc"})

    events = asyncio.run(collect(client(handler), {"prompt": "Hi"}))
    assert events[-1].status == "failed" and events[-1].error == "the engine broke"


def test_the_api_error_message_is_the_users_message() -> None:
    message = "max_tokens: must be at most 512 (MAX_OUTPUT_LEN), got 9000"

    def handler(request: httpx.Request) -> httpx.Response:
        body = {"error": {"message": message, "type": "invalid_request_error", "param": "x"}}
        return httpx.Response(422, json=body)

    with pytest.raises(PlaygroundError) as raised:
        asyncio.run(collect(client(handler), {"prompt": "Hi"}))
    assert raised.value.message == message and raised.value.status_code == 422
    with pytest.raises(PlaygroundError, match="MAX_OUTPUT_LEN"):
        asyncio.run(client(handler).get("abc"))


def test_an_error_without_a_json_body_still_says_what_happened() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(502, text="<html>bad gateway</html>")

    with pytest.raises(PlaygroundError, match="the api answered 502 Bad Gateway"):
        asyncio.run(client(handler).list())


def test_a_stream_that_ends_without_its_prediction_is_an_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=sse(("output", "par")))

    with pytest.raises(PlaygroundError, match="ended the answer early"):
        asyncio.run(collect(client(handler), {"prompt": "Hi"}))


def test_an_api_that_is_down_is_named_in_plain_words() -> None:
    port = free_port()  # nothing listens there
    api = ApiClient(f"http://127.0.0.1:{port}", timeout_s=2)
    with pytest.raises(PlaygroundError, match=r"cannot be reached .*Is it running\?"):
        asyncio.run(collect(api, {"prompt": "Hi"}))
    with pytest.raises(PlaygroundError, match="cannot be reached"):
        asyncio.run(api.cancel("abc"))


def test_a_slow_api_is_a_timeout_message() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    with pytest.raises(PlaygroundError, match="did not answer within 60 s"):
        asyncio.run(client(handler).get("abc"))


def test_list_reads_the_results_and_passes_the_filter() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.params["source"] == "playground"
        assert request.url.params["limit"] == "5"
        return httpx.Response(200, json={"results": [PREDICTION], "next": None})

    listed = asyncio.run(client(handler).list(limit=5, source="playground"))
    assert [prediction.id for prediction in listed] == ["abc"]


ADAPTER = {
    "name": "pirate",
    "source": "/adapters/pirate",
    "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "rank": 8,
    "alpha": 16.0,
    "target_modules": ["q_proj", "v_proj"],
    "sha256": "3f2a" + "0" * 60,
    "task_id": 123,
    "size_bytes": 4096,
    "created_at": "2026-11-24T19:00:00Z",
}


def test_adapters_are_listed_and_off_is_not_an_error() -> None:
    answers = {"list": httpx.Response(200, json={"object": "list", "data": [ADAPTER]})}

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/adapters"
        assert request.headers["authorization"] == "Bearer k"  # a route behind the key
        return answers["list"]

    listed = asyncio.run(client(handler).adapters())
    assert listed is not None and [(a.name, a.sha256, a.rank) for a in listed] == [
        ("pirate", ADAPTER["sha256"], 8)
    ]
    answers["list"] = httpx.Response(200, json={"object": "list", "data": []})
    assert asyncio.run(client(handler).adapters()) == []
    # Turned off (MAX_LORA_RANK=0) or an api from before adapters: the base model only.
    for status in (404, 501):
        answers["list"] = httpx.Response(status, json={"error": {"message": "off"}})
        assert asyncio.run(client(handler).adapters()) is None
    answers["list"] = httpx.Response(500, json={"error": {"message": "database is locked"}})
    with pytest.raises(PlaygroundError, match="database is locked"):
        asyncio.run(client(handler).adapters())
    answers["list"] = httpx.Response(200, json={"object": "list"})
    with pytest.raises(PlaygroundError, match="list of adapters has an unexpected shape"):
        asyncio.run(client(handler).adapters())


def test_a_prediction_says_which_adapter_made_it() -> None:
    made = PredictionView.model_validate(
        PREDICTION | {"adapter": {"name": "pirate", "sha256": ADAPTER["sha256"]}}
    )
    assert made.adapter is not None and made.adapter.name == "pirate"
    assert PredictionView.model_validate(PREDICTION | {"adapter": None}).adapter is None
    assert PredictionView.model_validate(PREDICTION).adapter is None  # rows from before
