"""The routes' own SSE framing is byte for byte what sse-starlette's ServerSentEvent encodes."""

from __future__ import annotations

import pytest
from sse_starlette import ServerSentEvent

from tritonbox_api.routes.sse import frame, frame_parts

TEXTS = [
    "Hello",
    "",
    "line\nbreak",
    "windows\r\nline\rold mac\n",
    "\n\n",
    "café 🦊 中文",
    "data: inside",
    '{"json": "x"}',
    "trailing\r",
]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("event", [None, "output", "done", "odd\nname"])
def test_frame_is_what_sse_starlette_encodes(text: str, event: str | None) -> None:
    assert frame(text, event) == ServerSentEvent(text, event=event).encode()


def test_frame_parts_wrap_a_one_line_payload() -> None:
    before, after = frame_parts('{"a": ', "}")
    assert before + b'"x"' + after == ServerSentEvent('{"a": "x"}').encode()
