"""Structured output (guided decoding), as the engine takes it: TensorRT-LLM 0.20's guide types.

One request constraint, `{"guide_type", "guide"}`, sent to the `tensorrt_llm` step as the inputs
`guided_decoding_guide_type` and `guided_decoding_guide` (both engines; the cpu engine compiles
it with xgrammar, TensorRT-LLM's executor too). The api's native routes take it as it is
(`guided_decoding`); the OpenAI routes translate `response_format` and vLLM's guided fields into
it. `check_guide` is what the api can check without xgrammar (which needs torch): a schema that
is not JSON or not a schema, a regex that does not compile, a grammar without a root rule; what
only xgrammar finds wrong, the engine refuses for that request alone.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

GUIDE_TYPE_INPUT = "guided_decoding_guide_type"
GUIDE_INPUT = "guided_decoding_guide"
# TensorRT-LLM 0.20's strings (its backend's guideTypeMapping); "json" is any JSON, no guide.
GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar")
GuideType = Literal["json", "json_schema", "regex", "ebnf_grammar"]
MAX_GUIDE_CHARS = 100_000
MAX_SCHEMA_DEPTH = 32
JSON_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}
# Keywords whose value is a schema, a list of schemas, or a map of names to schemas.
_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains")
_MANY = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "$defs", "definitions", "patternProperties")
_ROOT_RULE = re.compile(r"^\s*root\s*::=", re.MULTILINE)


def _check_schema(schema: Any, where: str, depth: int = 0) -> None:
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise ValueError(f"{where}: a schema must be a JSON object, got {json.dumps(schema)}")
    if depth > MAX_SCHEMA_DEPTH:
        raise ValueError(f"{where}: nested deeper than {MAX_SCHEMA_DEPTH} levels")
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for name in kinds:
        if name not in JSON_TYPES:
            raise ValueError(f"{where}.type: must be one of {sorted(JSON_TYPES)}, got {name!r}")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ValueError(f"{where}.required: must be a list of property names")
    if "enum" in schema and not isinstance(schema["enum"], list):
        raise ValueError(f"{where}.enum: must be a list")
    if "pattern" in schema:
        check_regex(schema["pattern"], f"{where}.pattern")
    for key in _ONE:
        if key in schema:
            _check_schema(schema[key], f"{where}.{key}", depth + 1)
    for key in _MANY:
        if key in schema:
            if not isinstance(schema[key], list):
                raise ValueError(f"{where}.{key}: must be a list of schemas")
            for i, item in enumerate(schema[key]):
                _check_schema(item, f"{where}.{key}[{i}]", depth + 1)
    for key in _MAP:
        if key in schema:
            if not isinstance(schema[key], dict):
                raise ValueError(f"{where}.{key}: must be an object of schemas")
            for name, item in schema[key].items():
                _check_schema(item, f"{where}.{key}.{name}", depth + 1)


def check_schema(schema: Any) -> None:
    """ValueError when `schema` is not a JSON Schema xgrammar could compile (its structure)."""
    _check_schema(schema, "schema")


def check_regex(pattern: Any, where: str = "regex") -> None:
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"{where}: must be a non-empty string")
    try:
        re.compile(pattern)
    except re.error as error:
        raise ValueError(f"{where}: not a valid regular expression: {error}") from None


def check_guide(guide_type: str, guide: str | None) -> None:
    """ValueError (its message a plain reason) when the engine could not follow the guide."""
    if guide_type == "json":
        if guide is not None:
            raise ValueError("guide: not used with guide_type json (any JSON); leave it out")
        return
    if not guide:
        raise ValueError(f"guide: required with guide_type {guide_type}")
    if guide_type == "json_schema":
        try:
            schema = json.loads(guide)
        except json.JSONDecodeError as error:
            raise ValueError(f"guide: the schema is not JSON: {error}") from None
        check_schema(schema)
    elif guide_type == "regex":
        check_regex(guide, "guide")
    elif not _ROOT_RULE.search(guide):
        raise ValueError("guide: an EBNF grammar needs a `root ::= ...` rule")


def choice_grammar(choices: list[str]) -> str:
    """An EBNF grammar whose only sentences are `choices` (vLLM's guided_choice)."""
    return "root ::= " + " | ".join(json.dumps(choice) for choice in choices)


class GuidedDecoding(BaseModel):
    """Constrain the answer: any JSON, a JSON schema, a regular expression or an EBNF grammar."""

    model_config = ConfigDict(extra="forbid")

    guide_type: GuideType = Field(
        description="json (any JSON value), json_schema, regex or ebnf_grammar "
        "(TensorRT-LLM's guide types)."
    )
    guide: str | None = Field(
        default=None,
        max_length=MAX_GUIDE_CHARS,
        description="The schema (as JSON text), the regex or the grammar; none for json.",
    )

    @model_validator(mode="after")
    def _checked(self) -> Self:
        try:
            check_guide(self.guide_type, self.guide)
        except ValueError as error:  # named from the request's top: guided_decoding.guide
            raise ValueError(f"guided_decoding.{error}") from None
        return self
