"""Reading a text/event-stream body (the api's streamed predictions): each event's name and its
data, a blank line ending an event."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx


async def server_sent_events(response: httpx.Response) -> AsyncIterator[tuple[str, str]]:
    """(event, data) pairs of a text/event-stream body; comments (keep-alive pings) skipped."""
    event, data = "message", list[str]()
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", list[str]()
            continue
        field, _, value = line.partition(":")
        # The spec strips exactly one space after the colon: text pieces keep their own spaces.
        value = value.removeprefix(" ")
        if field == "event":
            event = value
        elif field == "data":
            data.append(value)
    if data:
        yield event, "\n".join(data)
