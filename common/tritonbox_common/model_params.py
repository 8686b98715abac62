"""Read a Triton model's `parameters` block (the `model_config` JSON a Python model is given).

The renderer already refuses to leave a `${placeholder}` in a config; these readers still check,
because a hand-edited repository can bypass it, and a model that starts on a bad value fails
later and less clearly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class ParameterError(ValueError):
    """A model parameter is missing or malformed; the message names it."""


def config_parameters(model_config: str | Mapping[str, Any]) -> dict[str, str]:
    """The `parameters` block as plain strings, from the JSON text or the parsed config."""
    config = json.loads(model_config) if isinstance(model_config, str) else model_config
    block = config.get("parameters") or {}
    return {key: str(value.get("string_value", "")) for key, value in block.items()}


def text_parameter(params: Mapping[str, str], key: str) -> str:
    value = params.get(key)
    if value is None or not value.strip():
        raise ParameterError(f"model parameter {key!r} is missing or empty")
    if "${" in value:
        raise ParameterError(f"model parameter {key!r} was never rendered: {value!r}")
    return value.strip()


def int_parameter(params: Mapping[str, str], key: str, *, minimum: int = 1) -> int:
    value = text_parameter(params, key)
    try:
        number = int(value)
    except ValueError:
        raise ParameterError(f"model parameter {key!r} must be an integer, got {value!r}") from None
    if number < minimum:
        raise ParameterError(f"model parameter {key!r} must be >= {minimum}, got {number}")
    return number


def bool_parameter(params: Mapping[str, str], key: str, default: bool) -> bool:
    if key not in params:
        return default
    value = text_parameter(params, key).lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise ParameterError(f"model parameter {key!r} must be true or false, got {value!r}")


def dir_parameter(params: Mapping[str, str], key: str) -> Path:
    path = Path(text_parameter(params, key))
    if not path.is_dir():
        raise ParameterError(f"model parameter {key!r}: {path} is not a directory")
    return path
