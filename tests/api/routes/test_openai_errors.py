"""Refusals on the OpenAI routes through the official `openai` SDK: 400 (`BadRequestError`)
with OpenAI's error body, `param` naming the field as the client sent it, also for checks made
after the request became the api's own GenerationInput (stop words' tokens, max_tokens)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

MESSAGES: Any = [{"role": "user", "content": "Hi"}]
LONG_WORD = "1 2 3 4 5 6 7 8 9 " * 5  # 90 characters, far more than 32 tokens


def refusal(call: Callable[[], Any]) -> dict[str, Any]:
    """The error body of the 400 that `call` raises, checked to be OpenAI's."""
    with pytest.raises(openai.BadRequestError) as raised:
        call()
    assert raised.value.status_code == 400
    body: dict[str, Any] = raised.value.body  # type: ignore[assignment]
    assert set(body) == {"message", "type", "param", "code"}
    assert body["type"] == "invalid_request_error"
    assert body["message"].startswith(f"{body['param']}: ")
    return body


def test_chat_refusals_name_the_clients_fields(client: openai.OpenAI, model: str) -> None:
    def chat(**fields: Any) -> Callable[[], Any]:
        request = {"model": model, "messages": MESSAGES, "max_completion_tokens": 2, **fields}
        return lambda: client.chat.completions.create(**request)

    assert refusal(chat(temperature=2.5))["param"] == "temperature"
    assert refusal(chat(stop=["x"] * 33))["param"] == "stop"
    assert refusal(chat(stop=["x", ""]))["param"] == "stop[1]"
    # Checked on the engine's tokens, after translation to `stop_words_list`.
    too_long = refusal(chat(stop=["x", LONG_WORD]))
    assert too_long["param"] == "stop[1]" and "at most 32" in too_long["message"]
    assert refusal(chat(stop=LONG_WORD))["param"] == "stop"
    assert refusal(chat(max_completion_tokens=0))["param"] == "max_completion_tokens"
    over = refusal(chat(max_completion_tokens=100_000))  # checked against MAX_OUTPUT_LEN
    assert over["param"] == "max_completion_tokens" and "MAX_OUTPUT_LEN" in over["message"]
    assert refusal(chat(extra_body={"bad_words": ["x"] * 33}))["param"] == "bad_words"
    assert refusal(chat(extra_body={"bad_words": [LONG_WORD]}))["param"] == "bad_words[0]"
    assert refusal(chat(extra_body={"colour": "red"}))["param"] == "colour"
    assert refusal(chat(top_logprobs=30, logprobs=True))["param"] == "top_logprobs"
    assert refusal(chat(n=9))["param"] == "n"
    content = refusal(chat(messages=[{"role": "user", "content": 3}]))
    assert content["param"] == "messages[0].content"
    assert "stop_words_list" not in str(refusal(chat(stop=["x", LONG_WORD])))


def test_completion_refusals_name_the_clients_fields(client: openai.OpenAI, model: str) -> None:
    def complete(**fields: Any) -> Callable[[], Any]:
        request = {"model": model, "prompt": "Hi", "max_tokens": 2, **fields}
        return lambda: client.completions.create(**request)

    assert refusal(complete(max_tokens=100_000))["param"] == "max_tokens"
    assert refusal(complete(temperature=-1))["param"] == "temperature"
    assert refusal(complete(stop=[LONG_WORD]))["param"] == "stop[0]"
    # A list of prompts is accepted (OpenAI's forms); prompts x n past the bound is not.
    assert refusal(complete(prompt=["a"] * 5, n=8))["param"] == "prompt"
    assert refusal(complete(prompt=[[1], [10**9]]))["param"] == "prompt[1]"


def test_malformed_json_is_a_400_here_and_a_422_on_native_routes(api: httpx.Client) -> None:
    broken = {"content": b"{not json", "headers": {"content-type": "application/json"}}
    openai_route = api.post("/v1/completions", **broken)  # type: ignore[arg-type]
    assert openai_route.status_code == 400 and openai_route.json()["error"]["param"] == "body"
    native = {"input": {"prompt": "Hi", "stop_words_list": ["x"] * 33}}
    refused = api.post("/v1/predictions", json=native)
    assert refused.status_code == 422
    assert refused.json()["error"]["param"] == "input.stop_words_list"


def test_the_openapi_document_declares_the_400(api: httpx.Client) -> None:
    paths = api.get("/openapi.json").json()["paths"]
    for path in ("/v1/completions", "/v1/chat/completions"):
        declared = paths[path]["post"]["responses"]["400"]["content"]["application/json"]
        assert declared["schema"]["$ref"] == "#/components/schemas/ErrorResponse"
    assert "400" not in paths["/v1/models"]["get"]["responses"]
