"""docs/api.md's parameter table is generated from the single definition of each parameter."""

from __future__ import annotations

from pathlib import Path

from tritonbox_api.protocol.generation import GenerationInput
from tritonbox_common.config_docs import with_table
from tritonbox_common.parameter_docs import parameter_table
from tritonbox_common.parameters import ALL_PARAMETERS

REPO = Path(__file__).resolve().parents[2]


def test_api_doc_parameter_table_is_generated() -> None:
    document = (REPO / "docs" / "api.md").read_text()
    assert document == with_table(document, parameter_table(), name="parameter-table"), (
        "run `.venv/bin/python scripts/gen_config_docs.py`"
    )


def test_the_request_model_and_openapi_schema_use_the_definitions() -> None:
    schema = GenerationInput.model_json_schema()["properties"]
    for parameter in ALL_PARAMETERS:
        field = schema[parameter.name]
        assert field["description"] == parameter.description
        assert parameter.hint in field["description"]
        assert str(parameter.size_limit or "") in field["description"]
        if parameter.default is not None:
            assert field["default"] == parameter.default
        if parameter.le is not None:
            assert parameter.le in (
                field.get("maximum"),
                *(o.get("maximum") for o in field.get("anyOf", [])),
            )
