"""The prediction permalink page (`/p/{id}`): one self-contained HTML page per prediction.

Everything shown is prepared here as plain strings and escaped by Jinja (autoescape), the
request snippets included: no user text ever reaches the page's markup or script unescaped.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, StrictUndefined

from tritonbox_api.db.crud import as_utc
from tritonbox_api.db.models import Prediction
from tritonbox_api.protocol.generation import GenerationInput
from tritonbox_common import snippets

# Shown with the prompt, not in the settings table.
_PROMPT_KEYS = ("prompt", "messages", "engine_prompt")


def _finish_reason(prediction: Prediction) -> str:
    if prediction.finish_reason is None:
        return "–"
    if prediction.stop_word is not None:  # json.dumps: quoted, with whitespace made visible
        return f"{prediction.finish_reason.value} {json.dumps(prediction.stop_word)}"
    return prediction.finish_reason.value


@functools.cache
def _environment() -> Environment:
    return Environment(
        loader=PackageLoader("tritonbox_api", "templates"),
        autoescape=True,
        undefined=StrictUndefined,  # a misspelt name fails the tests, not silently renders ""
        trim_blocks=True,
        lstrip_blocks=True,
    )


@dataclass(frozen=True)
class Message:
    role: str
    content: str


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _messages(value: Any) -> list[Message] | None:
    if not isinstance(value, list):
        return None
    # OpenAI-style content may be a list of parts: shown as JSON rather than dropped.
    return [
        Message(str(m.get("role", "?")), _text(m.get("content", "")))
        if isinstance(m, dict)
        else Message("?", _text(m))
        for m in value
    ]


def _request_input(prediction: Prediction) -> dict[str, Any]:
    """The `input` that asks for this prediction again: the applied parameters (with the seed
    that was used, so the same answer comes back), limited to what /v1/predictions accepts."""
    source = prediction.applied or prediction.input
    return {
        name: value
        for name, value in source.items()
        if name in GenerationInput.model_fields and value is not None
    }


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f} s"


def _milliseconds(value: float | None) -> str:
    if value is None:
        return "–"
    milliseconds = value * 1000
    return f"{milliseconds:.1f} ms" if milliseconds < 10 else f"{milliseconds:.0f} ms"


def _number(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _when(moment: datetime | None) -> str:
    return "" if moment is None else as_utc(moment).strftime("%Y-%m-%d %H:%M:%S UTC")


def render_permalink(
    prediction: Prediction,
    *,
    public_url: str,
    playground_url: str,
    api_key_required: bool = False,
) -> str:
    """The page; `api_key_required` adds the Authorization header to the request snippets."""
    public_url, playground_url = public_url.rstrip("/"), playground_url.rstrip("/")
    request_input = _request_input(prediction)
    sha = prediction.adapter_sha256
    given = prediction.input or {}
    applied = prediction.applied or {}
    prompt = given.get("prompt", applied.get("prompt"))
    messages = _messages(given.get("messages", applied.get("messages")))
    engine_prompt = applied.get("engine_prompt")
    metrics = [
        ("Prompt tokens", _number(prediction.prompt_tokens)),
        ("Completion tokens", _number(prediction.completion_tokens)),
        ("Time to first token", _milliseconds(prediction.time_to_first_token_s)),
        ("Time per output token", _milliseconds(prediction.time_per_output_token_s)),
        ("Total time", _seconds(prediction.total_time_s)),
        ("Tokens per second", _number(prediction.tokens_per_second, 1)),
        ("Finish reason", _finish_reason(prediction)),
    ]
    return (
        _environment()
        .get_template("permalink.html")
        .render(
            found=True,
            prediction=prediction,
            short_id=prediction.id[:8],
            running=not prediction.status.finished,
            created=_when(prediction.created_at),
            created_iso=as_utc(prediction.created_at).isoformat(),
            prompt=None if prompt is None else _text(prompt),
            messages=messages,
            # The chat template's result is worth seeing; a plain prompt's is the prompt again.
            engine_prompt=_text(engine_prompt) if messages and engine_prompt else None,
            settings=[(k, _text(v)) for k, v in applied.items() if k not in _PROMPT_KEYS],
            metrics=metrics,
            playground_link=f"{playground_url}/?p={quote(prediction.id, safe='')}",
            api_link=f"{public_url}/v1/predictions/{quote(prediction.id, safe='')}",
            # The snippets name the adapter that produced this answer, by its hash too.
            curl=snippets.curl(
                request_input, public_url, api_key_required=api_key_required, adapter_sha256=sha
            ),
            python=snippets.python(
                request_input,
                public_url,
                api_key_required=api_key_required,
                stream=False,
                adapter_sha256=sha,
            ),
        )
    )


def render_not_found(prediction_id: str) -> str:
    """The 404 page (the id is echoed back, escaped like everything else)."""
    return (
        _environment()
        .get_template("permalink.html")
        .render(found=False, prediction_id=prediction_id)
    )
