"""Reading a Triton model's `parameters` block."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tritonbox_common.model_params import (
    ParameterError,
    bool_parameter,
    config_parameters,
    dir_parameter,
    int_parameter,
    text_parameter,
)


def test_config_parameters_from_json() -> None:
    config = json.dumps(
        {"name": "m", "parameters": {"a": {"string_value": "1"}, "b": {"string_value": ""}}}
    )
    assert config_parameters(config) == {"a": "1", "b": ""}
    assert config_parameters({"name": "m"}) == {}


def test_text_parameter_rejects_missing_empty_and_unrendered() -> None:
    with pytest.raises(ParameterError, match="'x' is missing"):
        text_parameter({}, "x")
    with pytest.raises(ParameterError, match="'x' is missing or empty"):
        text_parameter({"x": " "}, "x")
    with pytest.raises(ParameterError, match=r"'x' was never rendered: '\$\{x\}'"):
        text_parameter({"x": "${x}"}, "x")


def test_int_parameter() -> None:
    assert int_parameter({"n": " 12 "}, "n") == 12
    assert int_parameter({"n": "0"}, "n", minimum=0) == 0
    with pytest.raises(ParameterError, match="'n' must be an integer, got 'x'"):
        int_parameter({"n": "x"}, "n")
    with pytest.raises(ParameterError, match="'n' must be >= 1, got 0"):
        int_parameter({"n": "0"}, "n")


def test_bool_parameter() -> None:
    assert bool_parameter({}, "b", True) is True
    assert bool_parameter({"b": "FALSE"}, "b", True) is False
    assert bool_parameter({"b": "1"}, "b", False) is True
    with pytest.raises(ParameterError, match="true or false, got 'maybe'"):
        bool_parameter({"b": "maybe"}, "b", True)


def test_dir_parameter(tmp_path: Path) -> None:
    assert dir_parameter({"d": str(tmp_path)}, "d") == tmp_path
    with pytest.raises(ParameterError, match="is not a directory"):
        dir_parameter({"d": str(tmp_path / "missing")}, "d")
