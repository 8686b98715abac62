"""Structured output through the official `openai` SDK against the live api on the cpu engine:
`response_format` (json_object, strict json_schema), vLLM's guided_* and `structured_outputs`,
streamed, with n=2, recorded in the prediction row; and every refusal as a 400 naming the
field the client sent."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import jsonschema
import openai
import pytest

PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 24},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "address"],
    "additionalProperties": False,
}
ASK: Any = [{"role": "user", "content": "Invent a person and give their details as JSON."}]
STRICT: Any = {
    "type": "json_schema",
    "json_schema": {"name": "person", "schema": PERSON, "strict": True},
}


def valid(text: str) -> dict[str, Any]:
    value = json.loads(text)
    jsonschema.validate(value, PERSON)
    assert isinstance(value, dict)
    return value


def test_json_schema_strict_nested_parses_and_validates(client: openai.OpenAI, model: str) -> None:
    for seed in (1, 2):
        reply = client.chat.completions.create(
            model=model,
            messages=ASK,
            max_tokens=120,
            temperature=0.8,
            seed=seed,
            response_format=STRICT,
        )
        assert reply.choices[0].finish_reason == "stop"
        valid(reply.choices[0].message.content or "")


def test_json_schema_streamed_with_two_choices(client: openai.OpenAI, model: str) -> None:
    stream = client.chat.completions.create(
        model=model,
        messages=ASK,
        max_tokens=120,
        temperature=0.8,
        seed=5,
        n=2,
        stream=True,
        response_format=STRICT,
    )
    texts = ["", ""]
    finishes: list[str | None] = [None, None]
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            finishes[choice.index] = choice.finish_reason or finishes[choice.index]
    assert finishes == ["stop", "stop"]
    for text in texts:
        valid(text)


def test_json_object_is_always_an_object(client: openai.OpenAI, model: str) -> None:
    """OpenAI's JSON mode answers an object: never an array or a scalar, whatever the prompt
    invites (lists and numbers included), on completions as on chat."""
    asks = [
        'Answer with {"answer": "yes"} or {"answer": "no"}',
        "List three colours as a JSON array.",
        "What is 2 + 2? Answer with the number only.",
    ]
    for ask in asks:
        reply = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": ask}],
            max_tokens=60,
            temperature=0,
            response_format={"type": "json_object"},
        )
        text = reply.choices[0].message.content or ""
        assert text.lstrip()[:1] == "{", text
        if reply.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(text), dict), text
    completion = client.completions.create(
        model=model,
        prompt=["[1, 2, 3] and then", "The number 42 is", 'A JSON array: ["a",'],
        max_tokens=40,
        temperature=0,
        extra_body={"response_format": {"type": "json_object"}},
    )
    assert len(completion.choices) == 3
    for choice in completion.choices:
        assert choice.text.lstrip()[:1] == "{", choice.text
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.text), dict), choice.text


def test_text_is_no_constraint(client: openai.OpenAI, model: str) -> None:
    plain = dict(model=model, messages=ASK, max_tokens=16, temperature=0)
    free = client.chat.completions.create(**plain)
    text = client.chat.completions.create(**plain, response_format={"type": "text"})
    assert text.choices[0].message.content == free.choices[0].message.content


def test_guided_choice_and_regex_on_completions_and_chat(client: openai.OpenAI, model: str) -> None:
    choices = ["positive", "negative", "neutral"]
    picked = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Classify: what a lovely day!"}],
        max_tokens=10,
        temperature=0,
        extra_body={"guided_choice": choices},
    )
    assert picked.choices[0].message.content in choices
    assert picked.choices[0].finish_reason == "stop"
    dated = client.completions.create(
        model=model,
        prompt="The first moon landing happened on",
        max_tokens=20,
        temperature=0,
        extra_body={"guided_regex": r" [0-9]{4}-[0-9]{2}-[0-9]{2}"},
    )
    assert re.fullmatch(r" [0-9]{4}-[0-9]{2}-[0-9]{2}", dated.choices[0].text)
    newer = client.completions.create(
        model=model,
        prompt="Is water wet? Answer:",
        max_tokens=10,
        temperature=0,
        stream=True,
        extra_body={"structured_outputs": {"choice": [" yes", " no"]}},
    )
    assert "".join(chunk.choices[0].text for chunk in newer if chunk.choices) in (" yes", " no")


def test_guided_json_and_grammar(client: openai.OpenAI, model: str) -> None:
    reply = client.chat.completions.create(
        model=model,
        messages=ASK,
        max_tokens=120,
        temperature=0,
        extra_body={"guided_json": json.dumps(PERSON)},
    )
    valid(reply.choices[0].message.content or "")
    grammar = 'root ::= "The answer is " [0-9] [0-9]? "."'
    answer = client.completions.create(
        model=model,
        prompt="6 times 7?",
        max_tokens=12,
        temperature=0,
        extra_body={"guided_grammar": grammar},
    )
    assert re.fullmatch(r"The answer is [0-9][0-9]?\.", answer.choices[0].text)


def test_the_constraint_is_recorded_and_shown(
    client: openai.OpenAI, model: str, api: httpx.Client
) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=ASK, max_tokens=120, temperature=0, response_format=STRICT
    )
    prediction_id = raw.headers["x-prediction-id"]
    row = api.get(f"/v1/predictions/{prediction_id}").json()
    assert row["input"]["response_format"]["json_schema"]["schema"] == PERSON  # as sent
    applied = row["applied"]["guided_decoding"]
    assert applied["guide_type"] == "json_schema" and json.loads(applied["guide"]) == PERSON
    page = api.get(f"/p/{prediction_id}").text
    assert "guided_decoding" in page and "json_schema" in page


def test_the_native_routes_take_the_engine_s_guide(api: httpx.Client) -> None:
    guide = {"guide_type": "regex", "guide": "(red|green|blue)"}
    body = {"input": {"prompt": "My favourite colour is", "max_tokens": 8, "temperature": 0}}
    body["input"]["guided_decoding"] = guide
    prediction = api.post("/v1/predictions", json=body).json()
    assert prediction["output"] in ("red", "green", "blue"), prediction
    assert prediction["finish_reason"] == "stop"
    assert prediction["applied"]["guided_decoding"] == guide
    text = api.post("/predict", json={**body["input"], "stream": False}).json()
    assert text["output"] == prediction["output"]
    refused = api.post(
        "/v1/predictions",
        json={"input": {"prompt": "Hi", "guided_decoding": {"guide_type": "regex", "guide": "("}}},
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["param"] == "guided_decoding.guide"


@pytest.mark.parametrize(
    ("extra", "param", "says"),
    [
        ({"guided_regex": "(a"}, "guided_regex", "regular expression"),
        ({"guided_json": "{not json"}, "guided_json", "not JSON"),
        ({"guided_json": {"type": "objekt"}}, "guided_json", "schema.type"),
        ({"guided_grammar": 'start ::= "a"'}, "guided_grammar", "root"),
        ({"guided_choice": []}, "guided_choice", ""),
        ({"guided_choice": ["a"], "guided_regex": "a"}, "guided_choice", "only one kind"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs.choice", ""),
        ({"structured_outputs": {}}, "structured_outputs", "name one kind"),
        (
            {"response_format": {"type": "json_object"}, "guided_json": {"type": "object"}},
            "guided_json",
            "only one kind",
        ),
        ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"properties": []}},
                }
            },
            "response_format",
            "properties",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format", ""),
    ],
)
def test_refusals_name_the_client_s_field(
    api: httpx.Client, model: str, extra: dict[str, Any], param: str, says: str
) -> None:
    body = {"model": model, "messages": ASK, "max_tokens": 4, **extra}
    answer = api.post("/v1/chat/completions", json=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"].startswith(param), error
    assert says in error["message"], error


def test_a_guide_only_the_engine_finds_wrong_is_still_a_400(
    client: openai.OpenAI, model: str
) -> None:
    """Python's `re` takes a lookbehind, xgrammar does not: the engine refuses the request
    before any token, and the api answers as for its own checks (never a 5xx)."""
    try:
        client.chat.completions.create(
            model=model, messages=ASK, max_tokens=4, extra_body={"guided_regex": "(?<=a)b"}
        )
    except openai.BadRequestError as error:
        body: Any = error.body
        assert body["param"] == "guided_regex", body
        assert "Lookbehind is not supported" in body["message"], body
    else:
        raise AssertionError("the request was not refused")


def test_log_probs_of_a_guided_answer_are_finite(client: openai.OpenAI, model: str) -> None:
    """The constrained distribution gives banned tokens -inf: shown as vLLM shows them
    (-9999.0), never as JSON's missing -Infinity."""
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Yes or no?"}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=8,  # more than the 5 tokens the guide allows first (y, ye, yes, n, no)
        extra_body={"guided_choice": ["yes", "no"]},
    )
    assert reply.choices[0].message.content in ("yes", "no")
    assert reply.choices[0].logprobs is not None and reply.choices[0].logprobs.content
    for entry in reply.choices[0].logprobs.content:
        assert entry.logprob > -1e4
        assert len(entry.top_logprobs) == 8
        assert all(-9999.0 <= alternative.logprob <= 0 for alternative in entry.top_logprobs)
        assert min(alternative.logprob for alternative in entry.top_logprobs) == -9999.0
