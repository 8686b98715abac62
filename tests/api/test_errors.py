"""Validation errors become one readable message naming field, limit and value."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tritonbox_api.errors import describe
from tritonbox_api.protocol.predictions import PredictionCreate


def messages(body: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(ValidationError) as raised:
        PredictionCreate.model_validate(body)
    errors: list[Any] = raised.value.errors()
    return [describe({**e, "loc": ("body", *e["loc"])}) for e in errors]


def test_out_of_range_names_field_limit_and_value() -> None:
    [(field, message)] = messages({"input": {"prompt": "a", "top_p": 3}})
    assert field == "input.top_p"
    assert message == "input.top_p: input should be less than or equal to 1, got 3"


def test_list_items_and_unknown_fields() -> None:
    found = dict(messages({"input": {"prompt": "a", "stop_words_list": ["ok", ""]}, "x": 1}))
    assert "input.stop_words_list[1]" in found
    assert found["x"] == "x: unknown field"
