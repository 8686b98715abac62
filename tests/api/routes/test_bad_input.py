"""Every malformed request gets a 4xx naming the field and the limit; none reaches a 500."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

OK = {"prompt": "Hello", "max_tokens": 4}


def error_of(response: httpx.Response, status: int = 422) -> str:
    assert response.status_code == status, response.text
    message: str = response.json()["error"]["message"]
    return message


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"prompt": ""}, "prompt: string should have at least 1 character"),
        ({"prompt": "   "}, "prompt: is empty"),
        ({"max_tokens": 0}, "max_tokens: input should be greater than or equal to 1, got 0"),
        ({"max_tokens": 100000}, "max_tokens: must be at most 512 (MAX_OUTPUT_LEN), got 100000"),
        ({"temperature": 2.5}, "temperature: input should be less than or equal to 2, got 2.5"),
        ({"top_p": -1}, "top_p: input should be greater than or equal to 0"),
        ({"top_k": "many"}, "top_k: input should be a valid integer"),
        ({"seed": -1}, "seed: input should be greater than or equal to 0"),
        ({"stop_words_list": ["x"] * 33}, "stop_words_list: list should have at most 32 items"),
        ({"stop_words_list": [""]}, "stop_words_list[0]: string should have at least 1"),
        ({"stop_words_list": ["  "]}, "stop_words_list[0]: empty or blank word"),
        ({"bad_words_list": "word"}, "bad_words_list: input should be a valid list"),
        ({"min_tokens": 10}, "min_tokens: must be at most max_tokens (4), got 10"),
        ({"beam_width": 4}, "beam_width: must be at most 1 (MAX_BEAM_WIDTH"),
        ({"colour": "red"}, "colour: unknown field"),
        ({"prompt": None}, "give either `prompt` or `messages`"),
    ],
)
def test_bad_input_names_field_and_limit(
    api: httpx.Client, change: dict[str, Any], expected: str
) -> None:
    body = {**OK, **change}
    body = {key: value for key, value in body.items() if value is not None}
    message = error_of(api.post("/v1/predictions", json={"input": body}))
    assert expected.lower() in message.lower()


def test_prompt_too_long_for_the_engine_counts_tokens(api: httpx.Client) -> None:
    message = error_of(api.post("/predict", json={"prompt": "word " * 600, "max_tokens": 4}))
    assert "prompt:" in message and "MAX_INPUT_LEN" in message and "512" in message


def test_streaming_with_beam_search_is_refused(api: httpx.Client) -> None:
    response = api.post("/predict", json={**OK, "beam_width": 2, "stream": True})
    assert "beam_width" in error_of(response)


def test_malformed_json_and_wrong_types(api: httpx.Client) -> None:
    response = api.post(
        "/v1/predictions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert "JSON" in error_of(response)
    assert "input: input should be" in error_of(api.post("/v1/predictions", json={"input": 3}))


def test_body_too_large(api: httpx.Client) -> None:
    response = api.post("/predict", json={"prompt": "x" * 2_000_000})
    assert "MAX_BODY_BYTES" in error_of(response, 413)


def test_unknown_route_and_method_are_json(api: httpx.Client) -> None:
    assert api.get("/nope").json()["error"]["type"] == "not_found_error"
    assert api.get("/predict").status_code == 405


def test_bad_cursor(api: httpx.Client) -> None:
    assert "cursor" in error_of(api.get("/v1/predictions", params={"cursor": "garbage"}))


def test_a_failed_request_is_not_logged_but_the_server_keeps_serving(api: httpx.Client) -> None:
    error_of(api.post("/v1/predictions", json={"input": {"prompt": ""}}))
    assert api.post("/v1/predictions", json={"input": OK}).status_code == 201
