"""Structured output (guided decoding), as the engine takes it: TensorRT-LLM 0.20's guide types.

One request constraint, `{"guide_type", "guide"}`, sent to the `tensorrt_llm` step as the inputs
`guided_decoding_guide_type` and `guided_decoding_guide` (both engines; the cpu engine compiles
it with xgrammar, TensorRT-LLM's executor too). The api's native routes take it as it is
(`guided_decoding`); the OpenAI routes translate `response_format` and vLLM's guided fields into
it. `check_guide` is what the api can check without xgrammar (which needs torch): a schema that
is not JSON or not a schema (jsonschema checks it against draft 2020-12's meta-schema), a regex
that does not compile, a grammar without a root rule; what only xgrammar finds wrong, the engine
refuses for that request alone.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

GUIDE_TYPE_INPUT = "guided_decoding_guide_type"
GUIDE_INPUT = "guided_decoding_guide"
# TensorRT-LLM 0.20's strings (its backend's guideTypeMapping); "json" is any JSON, no guide.
GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar")
GuideType = Literal["json", "json_schema", "regex", "ebnf_grammar"]
MAX_GUIDE_CHARS = 100_000
# The cpu engine's wait for a guide's compilation (triton/tritonbox_triton/engine/guide_pool.py).
# On the 2-core test machine a 600-property schema compiles in 0.04 s, but each distinct bounded
# repetition of a broad class costs about 1.5 s (`.{1,1000}`; a string's maxLength of 200 up):
# five strings with maxLengths 200-204 took 8.4 s, sixteen of about 1,000 26 s.
GUIDE_COMPILE_TIMEOUT_S = 10.0
GuideCompileTimeout = Annotated[
    float,
    Field(
        gt=0,
        description="Longest a request waits for the cpu engine to compile its structured-output "
        "guide (seconds); past it, a 400 naming the guide's field and this limit. A compilation "
        "is tried first in a process of its own, killed at this limit (docs/api.md, 'Structured "
        "output'). TensorRT-LLM compiles guides itself, without a limit.",
    ),
]
# JSON levels of a schema (objects and lists, about two a schema): deeper ones are refused
# before jsonschema walks them (its recursion) or xgrammar compiles them.
MAX_SCHEMA_NESTING = 64
VALID_SCHEMAS_KEPT = 1024
_ROOT_RULE = re.compile(r"^\s*root\s*::=", re.MULTILINE)
# Schemas already found valid, by their text's digest: checking one against the meta-schema
# costs 0.5-3 ms of the event loop (scripts/benchmarks/private_apis.py), a client's next
# request with the same schema a digest.
_valid: dict[bytes, None] = {}


@functools.cache
def _meta_validator() -> Any:
    """jsonschema's validator of draft 2020-12 schemas (imported when first needed: the api's
    dependency, not the engine's, which imports this module for its constants)."""
    from jsonschema import Draft202012Validator

    meta = Draft202012Validator.META_SCHEMA
    return Draft202012Validator(meta, format_checker=Draft202012Validator.FORMAT_CHECKER)


def _nesting(value: Any, limit: int) -> int:
    """How deeply `value`'s objects and lists nest, counted no further than `limit` + 1."""
    if limit < 0 or not isinstance(value, dict | list):
        return 0
    children = value.values() if isinstance(value, dict) else value
    return 1 + max((_nesting(child, limit - 1) for child in children), default=0)


def _where(path: Any) -> str:
    return "schema" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def check_schema(schema: Any) -> None:
    """ValueError when `schema` is not a JSON Schema (draft 2020-12, checked by jsonschema
    against its meta-schema, `pattern`s compiled), or nests deeper than xgrammar should go."""
    from jsonschema.exceptions import best_match

    if _nesting(schema, MAX_SCHEMA_NESTING) > MAX_SCHEMA_NESTING:
        raise ValueError(f"schema: nested deeper than {MAX_SCHEMA_NESTING} levels")
    digest = hashlib.sha256(json.dumps(schema, sort_keys=True).encode()).digest()
    if digest in _valid:
        return
    error = best_match(_meta_validator().iter_errors(schema))
    if error is not None:
        while error.context:  # "not valid under any of the given schemas": the likeliest why
            error = best_match(error.context)
        raise ValueError(f"{_where(error.absolute_path)}: {error.message}")
    if len(_valid) >= VALID_SCHEMAS_KEPT:
        del _valid[next(iter(_valid))]  # the oldest
    _valid[digest] = None


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
