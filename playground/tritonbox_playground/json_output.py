"""The playground's "JSON output" switch: to the api, the guide "any JSON" (`guided_decoding`,
TensorRT-LLM's guide type `json`); a saved prediction with it turns the switch back on."""

from __future__ import annotations

from typing import Any

from tritonbox_common import parameters as p

JSON_OUTPUT = p.GUIDED_DECODING.name  # the form's field: a bool here, the guide to the api
JSON_HINT = (
    "The answer is always valid JSON (say in the prompt what it should hold); Max tokens may "
    "still cut it short."
)


def json_input(switch: Any) -> dict[str, Any]:
    """What the switch adds to the api's `input`."""
    return {JSON_OUTPUT: {"guide_type": "json"}} if switch else {}


def json_restored(source: dict[str, Any]) -> bool:
    """The switch for a saved prediction. Other guides (a schema, a regex: sent to the api
    directly) have no control here and are not restored."""
    guide = source.get(JSON_OUTPUT)
    return isinstance(guide, dict) and guide.get("guide_type") == "json"
