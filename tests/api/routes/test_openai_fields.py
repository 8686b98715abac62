"""vLLM's OpenAI fields through the official `openai` SDK against the live api: `ignore_eos`."""

from __future__ import annotations

from typing import Any

import httpx
import openai

MESSAGES: Any = [{"role": "user", "content": "What is the capital of France?"}]
LONG = 60  # far more than the default model's short answer to MESSAGES


def test_ignore_eos_runs_to_max_tokens(client: openai.OpenAI, model: str) -> None:
    plain = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=LONG, temperature=0
    )
    assert plain.usage is not None and plain.usage.completion_tokens < LONG
    assert plain.choices[0].finish_reason == "stop"
    forced = client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=LONG,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert forced.usage is not None and forced.usage.completion_tokens == LONG
    assert forced.choices[0].finish_reason == "length"
    # Greedy: the same answer, then more after the point where the model would have ended.
    content = forced.choices[0].message.content or ""
    assert content.startswith(plain.choices[0].message.content or "")
    assert len(content) > len(plain.choices[0].message.content or "")


def test_ignore_eos_streams_and_keeps_stop_words(client: openai.OpenAI, model: str) -> None:
    prompt = "The capital of France is"
    stream = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=LONG,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    usage = None
    for chunk in stream:
        usage = chunk.usage or usage
    assert usage is not None and usage.completion_tokens == LONG
    stopped = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=LONG,
        temperature=0,
        stop=["Paris"],
        extra_body={"ignore_eos": True},
    )
    assert "Paris" not in stopped.choices[0].text
    assert stopped.choices[0].finish_reason == "stop"


def test_ignore_eos_on_the_native_route_is_recorded(api: httpx.Client) -> None:
    body = {
        "input": {"messages": MESSAGES, "max_tokens": LONG, "temperature": 0, "ignore_eos": True},
        "stream": False,
    }
    prediction = api.post("/v1/predictions", json=body).json()
    assert prediction["metrics"]["completion_tokens"] == LONG, prediction
    assert prediction["finish_reason"] == "length"
    assert prediction["applied"]["ignore_eos"] is True
