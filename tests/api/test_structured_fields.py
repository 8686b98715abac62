"""The OpenAI routes' structured-output fields, translated into the engine's one guide (no server):
each vLLM/OpenAI form, and the client's field named when the engine side refuses."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from tritonbox_api.protocol.errors import FieldError
from tritonbox_api.protocol.openai import ChatCompletionRequest
from tritonbox_api.routes.openai_errors import client_param

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
# json_object: OpenAI's JSON mode answers an object, so any object, not TensorRT-LLM's any-JSON.
OBJECT = ("json_schema", json.dumps({"type": "object", "additionalProperties": True}))


def request(**fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **fields}
    return ChatCompletionRequest.model_validate(body)


@pytest.mark.parametrize(
    ("fields", "guide"),
    [
        ({}, None),
        ({"response_format": {"type": "text"}}, None),
        ({"response_format": {"type": "json_object"}}, OBJECT),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": SCHEMA},
                }
            },
            ("json_schema", json.dumps(SCHEMA)),
        ),
        ({"guided_json": SCHEMA}, ("json_schema", json.dumps(SCHEMA))),
        ({"guided_json": json.dumps(SCHEMA)}, ("json_schema", json.dumps(SCHEMA))),
        ({"guided_regex": "[0-9]+"}, ("regex", "[0-9]+")),
        ({"guided_choice": ["a", 'say "hi"']}, ("ebnf_grammar", 'root ::= "a" | "say \\"hi\\""')),
        ({"guided_grammar": 'root ::= "x"'}, ("ebnf_grammar", 'root ::= "x"')),
        ({"structured_outputs": {"json_object": True}}, OBJECT),
        ({"structured_outputs": {"regex": "a+"}}, ("regex", "a+")),
        ({"guided_regex": "a", "guided_decoding_backend": "xgrammar"}, ("regex", "a")),
    ],
)
def test_each_form_becomes_the_engine_s_guide(
    fields: dict[str, Any], guide: tuple[str, str | None] | None
) -> None:
    guided = request(**fields).guided_decoding()
    assert (None if guided is None else (guided.guide_type, guided.guide)) == guide


def test_only_xgrammar_is_a_backend() -> None:
    with pytest.raises(ValidationError) as raised:
        request(guided_decoding_backend="outlines")
    assert raised.value.errors()[0]["loc"] == ("guided_decoding_backend",)


def test_an_engine_refusal_names_the_field_the_client_sent() -> None:
    for field, value in (("response_format", {"type": "json_object"}), ("guided_regex", "a")):
        sent = request(**{field: value})
        assert client_param("guided_decoding", sent, chat=True) == field


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"guided_json": "{"}, "guided_json"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
        ({"structured_outputs": {}}, "structured_outputs"),
        ({"guided_choice": ["x" * 60_000, "y" * 60_000]}, "guided_choice"),  # too long a grammar
    ],
)
def test_a_refusal_carries_the_client_s_field_as_data(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(FieldError) as raised:
        request(**fields).guided_decoding()
    assert raised.value.param == param and str(raised.value).startswith(f"{param}: ")
