"""Structured output on the OpenAI routes: OpenAI's `response_format` and vLLM's extras, all
translated into the engine's one guide (tritonbox_common.guided).

Accepted, as vLLM accepts them (its OpenAI protocol): `response_format` `text` (no constraint),
`json_object` (a JSON object: OpenAI's JSON mode answers an object, never an array or a scalar,
so it is sent as the schema JSON_OBJECT, not as TensorRT-LLM's any-JSON `json`) and
`json_schema` (`{"name", "schema", "strict"}`; enforced whether strict or not, as vLLM does);
the extra fields `guided_json` (a schema, as an object or JSON text), `guided_regex`,
`guided_choice` (a list of strings) and `guided_grammar` (EBNF); and their newer form
`structured_outputs: {"json" | "regex" | "choice" | "grammar" | "json_object"}`. One kind per
request: a second one is refused with 400 naming it, as vLLM refuses ("You can only use one kind
of ...").
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tritonbox_api.protocol.errors import FieldError
from tritonbox_common.guided import (
    MAX_GUIDE_CHARS,
    GuidedDecoding,
    check_guide,
    check_schema,
    choice_grammar,
)

MAX_CHOICES = 256
STRUCTURED = (
    "response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
    "structured_outputs",
)  # fmt: skip
Choice = list[str]


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema", description="The JSON Schema to follow.")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs` (the constraint kinds only)."""

    model_config = ConfigDict(extra="forbid")

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = Field(default=None, max_length=MAX_GUIDE_CHARS)
    choice: Choice | None = Field(default=None, min_length=1, max_length=MAX_CHOICES)
    grammar: str | None = Field(default=None, max_length=MAX_GUIDE_CHARS)
    json_object: bool | None = None


class StructuredFields(BaseModel):
    """The request fields that ask for structured output; mixed into the OpenAI requests."""

    response_format: ResponseFormat | None = Field(
        default=None,
        description="text, json_object (a JSON object) or json_schema (the answer follows the "
        "schema).",
    )
    guided_json: dict[str, Any] | str | None = Field(
        default=None, description="vLLM's: the answer follows this JSON schema."
    )
    guided_regex: str | None = Field(
        default=None, max_length=MAX_GUIDE_CHARS, description="vLLM's: the answer matches it."
    )
    guided_choice: Choice | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_CHOICES,
        description="vLLM's: the answer is exactly one of these.",
    )
    guided_grammar: str | None = Field(
        default=None, max_length=MAX_GUIDE_CHARS, description="vLLM's: an EBNF grammar."
    )
    structured_outputs: StructuredOutputs | None = Field(
        default=None, description="vLLM's newer form of the guided_* fields (one of them)."
    )
    # vLLM's per-request choice of grammar engine: only xgrammar here (auto picks it too).
    guided_decoding_backend: str | None = Field(
        default=None,
        max_length=64,
        pattern=r"^(auto|xgrammar)(:[A-Za-z0-9_,-]*)?$",
        description="vLLM's: the grammar engine; xgrammar (or auto) is the only one here.",
    )

    def structured_field(self) -> str:
        """The field the client asked for structured output with (for error messages)."""
        asked = [
            n for n in type(self).model_fields if n in STRUCTURED and n in self.model_fields_set
        ]
        return asked[0] if asked else "response_format"

    def guided_decoding(self) -> GuidedDecoding | None:
        """The engine's guide; FieldError naming the client's field."""
        asked = _asked(self)
        if not asked:
            return None
        if len(asked) > 1:
            names = ", ".join(name for name, _ in asked)
            raise FieldError(
                asked[1][0], f"only one kind of structured output per request; got {names}"
            )
        name, (guide_type, guide) = asked[0]
        try:
            check_guide(guide_type, guide)
        except ValueError as error:
            raise FieldError(name, str(error).removeprefix("guide: ")) from None
        return GuidedDecoding(guide_type=guide_type, guide=guide)  # type: ignore[arg-type]


def _schema(name: str, schema: dict[str, Any] | str) -> tuple[str, str]:
    if isinstance(schema, str):
        try:
            parsed = json.loads(schema)
        except json.JSONDecodeError as error:
            raise FieldError(name, f"the schema is not JSON: {error}") from None
    else:
        parsed = schema
    try:
        check_schema(parsed)
    except ValueError as error:
        raise FieldError(name, str(error)) from None
    text = json.dumps(parsed, ensure_ascii=False)
    if len(text) > MAX_GUIDE_CHARS:
        raise FieldError(name, f"the schema is longer than {MAX_GUIDE_CHARS} characters")
    return "json_schema", text


# `json_object`: any object, any members (`additionalProperties` said outright, as xgrammar's
# strict mode would otherwise close an object whose schema names none).
JSON_OBJECT = ("json_schema", json.dumps({"type": "object", "additionalProperties": True}))


def _choice(name: str, choices: Choice) -> tuple[str, str]:
    if any(not choice for choice in choices):
        raise FieldError(name, "every choice must be a non-empty string")
    grammar = choice_grammar(choices)
    if len(grammar) > MAX_GUIDE_CHARS:  # the engine's guide would refuse it, naming no field
        raise FieldError(
            name, f"the choices make a grammar longer than {MAX_GUIDE_CHARS} characters"
        )
    return "ebnf_grammar", grammar


def _asked(fields: StructuredFields) -> list[tuple[str, tuple[str, str | None]]]:
    """Each constraint the request names, as (the client's field, (guide type, guide))."""
    asked: list[tuple[str, tuple[str, str | None]]] = []
    response = fields.response_format
    if response is not None and response.type == "json_object":
        asked.append(("response_format", JSON_OBJECT))
    elif response is not None and response.type == "json_schema":
        if response.json_schema is None:
            raise FieldError("response_format", "json_schema needs its `json_schema` object")
        asked.append(("response_format", _schema("response_format", response.json_schema.schema_)))
    if fields.guided_json is not None:
        asked.append(("guided_json", _schema("guided_json", fields.guided_json)))
    if fields.guided_regex is not None:
        asked.append(("guided_regex", ("regex", fields.guided_regex)))
    if fields.guided_choice is not None:
        asked.append(("guided_choice", _choice("guided_choice", fields.guided_choice)))
    if fields.guided_grammar is not None:
        asked.append(("guided_grammar", ("ebnf_grammar", fields.guided_grammar)))
    outputs = fields.structured_outputs
    if outputs is not None:
        kinds: list[tuple[str, tuple[str, str | None]]] = []
        if outputs.json_ is not None:
            kinds.append(
                ("structured_outputs.json", _schema("structured_outputs.json", outputs.json_))
            )
        if outputs.regex is not None:
            kinds.append(("structured_outputs.regex", ("regex", outputs.regex)))
        if outputs.choice is not None:
            kinds.append(
                ("structured_outputs.choice", _choice("structured_outputs.choice", outputs.choice))
            )
        if outputs.grammar is not None:
            kinds.append(("structured_outputs.grammar", ("ebnf_grammar", outputs.grammar)))
        if outputs.json_object:
            kinds.append(("structured_outputs.json_object", JSON_OBJECT))
        if not kinds:
            raise FieldError("structured_outputs", "name one kind (json, regex, choice, grammar)")
        asked += kinds
    return asked
