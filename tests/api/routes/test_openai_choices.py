"""`n` > 1 through the official `openai` SDK against the live api: each choice is its own
engine request seeded seed + index, so every choice is exactly the one-choice answer to that
seed; streamed chunks carry their index; usage and the prediction row keep every choice."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

PROMPT = "Once upon a time"
SAMPLED: Any = {"max_tokens": 12, "temperature": 1.0, "top_p": 1.0, "seed": 1234}


def test_each_choice_is_the_answer_to_its_seed(
    client: openai.OpenAI, model: str, api: httpx.Client
) -> None:
    raw = client.completions.with_raw_response.create(model=model, prompt=PROMPT, n=3, **SAMPLED)
    answer = raw.parse()
    assert [choice.index for choice in answer.choices] == [0, 1, 2]
    for choice in answer.choices:
        alone = client.completions.create(
            model=model, prompt=PROMPT, **{**SAMPLED, "seed": SAMPLED["seed"] + choice.index}
        )
        assert choice.text == alone.choices[0].text
        assert choice.finish_reason == alone.choices[0].finish_reason
    assert len({choice.text for choice in answer.choices}) > 1  # three seeds, three answers
    row = api.get(f"/v1/predictions/{raw.headers['x-prediction-id']}").json()
    assert [c["output"] for c in row["choices"]] == [c.text for c in answer.choices]
    assert row["output"] == answer.choices[0].text
    total = sum(c["completion_tokens"] for c in row["choices"])
    assert answer.usage is not None and answer.usage.completion_tokens == total
    assert row["metrics"]["completion_tokens"] == total


def test_streamed_choices_interleave_with_their_index(client: openai.OpenAI, model: str) -> None:
    messages: Any = [{"role": "user", "content": "Tell me a story."}]
    whole = client.chat.completions.create(model=model, messages=messages, n=2, **SAMPLED)
    stream = client.chat.completions.create(
        model=model, messages=messages, n=2, stream=True,
        stream_options={"include_usage": True}, **SAMPLED,
    )  # fmt: skip
    texts: dict[int, str] = {0: "", 1: ""}
    reasons: dict[int, str | None] = {}
    usage = None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason is not None:
                reasons[choice.index] = choice.finish_reason
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert reasons == {c.index: c.finish_reason for c in whole.choices}
    assert usage is not None and whole.usage is not None
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_too_many_choices_are_refused_and_each_choice_has_its_log_probs(
    client: openai.OpenAI, model: str
) -> None:
    with pytest.raises(openai.APIStatusError) as too_many:
        client.completions.create(model=model, prompt=PROMPT, max_tokens=2, n=9)
    assert too_many.value.body["param"] == "n"  # type: ignore[index]
    answer = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=2, n=2, logprobs=1, seed=3
    )
    for choice in answer.choices:
        assert choice.logprobs is not None and choice.logprobs.tokens
        assert "".join(choice.logprobs.tokens).startswith(choice.text)
