"""A guide's JSON schema is checked by jsonschema against draft 2020-12's meta-schema (guided.py):
what is wrong is named by its place in the schema, and a schema found valid once is not checked
again."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tritonbox_common import guided
from tritonbox_common.guided import MAX_SCHEMA_NESTING, check_guide, check_schema


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"type": "objekt"}, "schema.type: 'objekt' is not one of"),
        ({"type": ["string", "bogus"]}, "schema.type[1]: 'bogus'"),
        ({"required": "name"}, "schema.required: 'name' is not of type 'array'"),
        ({"enum": 3}, "schema.enum: 3 is not of type 'array'"),
        (
            {"properties": {"a": {"pattern": "("}}},
            "schema.properties.a.pattern: '(' is not a 'regex'",
        ),
        ({"anyOf": {}}, "schema.anyOf: {} is not of type 'array'"),
        ({"$defs": {"id": {"minimum": "x"}}}, "schema.$defs.id.minimum: 'x' is not of type"),
        ([1], "schema: [1] is not of type 'object', 'boolean'"),
    ],
)
def test_what_is_wrong_is_named_by_its_place(schema: Any, says: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(says)):
        check_schema(schema)


def test_valid_schemas_pass_and_are_remembered() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    check_schema(schema)
    check_schema(True)
    check_guide("json_schema", json.dumps(schema))
    assert len(guided._valid) >= 1


def test_a_schema_nested_too_deep_is_refused_before_jsonschema_walks_it() -> None:
    deep: dict[str, Any] = {}
    inner = deep
    for _ in range(5000):  # deeper than Python's recursion limit
        inner["items"] = {}
        inner = inner["items"]
    with pytest.raises(ValueError, match=f"nested deeper than {MAX_SCHEMA_NESTING}"):
        check_schema(deep)
