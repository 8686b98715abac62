"""The OpenAI delta chunk's cached template encodes exactly what encoding the whole chunk does,
and its SSE event is exactly what sse-starlette frames from that."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import cast

import pytest
from sse_starlette import ServerSentEvent

from tritonbox_api.routes.openai_shape import Shape
from tritonbox_api.service.runner import Started

TEXTS = [
    "Hello",
    "",
    ' "quoted" \\ back',
    "line\nbreak\t",
    "café 🦊 中文",
    "\u0000text\u0000",
    "}]}",
]


@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("model", ["SmolLM2", 'odd "\u0000text\u0000" model'])
def test_delta_json_equals_encoding_the_whole_chunk(chat: bool, model: str) -> None:
    shape = Shape(chat, cast(Started, SimpleNamespace(id="abc", model=model)))
    for first in (True, False):
        for text in TEXTS:
            whole = json.dumps(shape.delta(text, first=first), ensure_ascii=False)
            assert shape.delta_json(text, first=first) == whole
            assert json.loads(shape.delta_json(text, first=first)) == shape.delta(text, first=first)
            # The event as sent: what sse-starlette would have framed from the encoded chunk.
            assert shape.delta_event(text, first=first) == ServerSentEvent(whole).encode()
