"""The OpenAI-compatible routes through the official `openai` SDK."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

MESSAGES: Any = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def model(client: openai.OpenAI) -> str:
    """The base model, and it alone (no adapter registered by this module)."""
    models = client.models.list().data
    assert len(models) == 1
    return models[0].id


def test_chat_completion(client: openai.OpenAI, model: str) -> None:
    answer = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=24, temperature=0
    )
    assert "Paris" in (answer.choices[0].message.content or "")
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    assert answer.id.startswith("chatcmpl-")


def test_streamed_chat_equals_the_whole_answer(client: openai.OpenAI, model: str) -> None:
    whole = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=24, temperature=0
    )
    stream = client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage = [], None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
    assert len([p for p in pieces if p]) >= 2
    assert "".join(pieces) == whole.choices[0].message.content
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]


def test_completion_with_stop_and_extras(client: openai.OpenAI, model: str) -> None:
    prompt = "The capital of France is"
    free = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0)
    assert "Paris" in free.choices[0].text
    stopped = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=12,
        temperature=0,
        stop=["Paris"],
        extra_body={"top_k": 1, "repetition_penalty": 1.0},
    )
    assert "Paris" not in stopped.choices[0].text
    assert stopped.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model=model, prompt=prompt, max_tokens=12, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == free.choices[0].text


def test_errors_reach_the_sdk_as_openai_errors(client: openai.OpenAI, model: str) -> None:
    # 400, as OpenAI and vLLM answer a bad field (the native routes answer 422).
    with pytest.raises(openai.BadRequestError) as raised:
        client.completions.create(model=model, prompt="hi", max_tokens=1, temperature=5)
    assert "temperature" in str(raised.value)
    assert raised.value.body["param"] == "temperature"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=1)


def test_predictions_from_openai_are_logged(
    client: openai.OpenAI, model: str, api: httpx.Client
) -> None:
    raw = client.completions.with_raw_response.create(model=model, prompt="Hi", max_tokens=3)
    prediction_id = raw.headers["x-prediction-id"]
    stored = api.get(f"/v1/predictions/{prediction_id}").json()
    assert stored["source"] == "openai"
    assert stored["output"] == raw.parse().choices[0].text
