"""One batch line through the app, as if a client had POSTed it: the live route's validation,
translation, slots, engine call, recording and error bodies, not a copy of them.

The request is made in-process (an ASGI call, no socket): the body is the line's, the answer is
collected whole, and `stop` is the client leaving: the route's disconnect watcher then cancels
the prediction and stops the engine's request, as for any client that goes away
(routes/common.py). The task that makes the call carries the line's context (batch_context.py):
the batch's key instead of an `Authorization` header, its id and custom_id for the row.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message

from tritonbox_api.service import batch_context
from tritonbox_api.service.batch_context import LineContext


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any  # the JSON the route answered
    prediction_id: str | None  # X-Prediction-Id: the line's prediction, when one was made


def line_slots(body: str) -> int:
    """The engine requests a line asks for: `n` choices of each of its prompts (a list of
    prompts, for completions); the batch runner counts them against its bound."""
    try:
        value = json.loads(body)
        n = int(value.get("n") or 1)
        prompt = value.get("prompt")
        prompts = (
            len(prompt)
            if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int)
            else 1
        )
        return max(1, n) * max(1, prompts)
    except (ValueError, TypeError, AttributeError):
        return 1


async def dispatch(
    app: ASGIApp, line: LineContext, url: str, body: str, stop: asyncio.Event
) -> Answer:
    """POST `body` to `url` on `app` for `line`; `stop` set: the client leaves."""
    data = body.encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": url,
        "raw_path": url.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(data)).encode()),
        ],
        "client": ("batch", 0),
        "server": ("batch", 0),
        "state": {},
    }
    sent = False
    status = 500
    headers: dict[str, str] = {}
    chunks: list[bytes] = []
    done = asyncio.Event()

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": data, "more_body": False}
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(done.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status = int(message["status"])
            headers = {k.decode().lower(): v.decode() for k, v in message.get("headers", [])}
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                done.set()  # answered: the watcher's `receive` ends, as uvicorn's does

    async def call() -> None:
        batch_context.enter(line)  # this task's context only (and the tasks it starts)
        await app(scope, receive, send)

    await asyncio.create_task(call())
    raw = b"".join(chunks)
    try:
        answer = json.loads(raw) if raw else None
    except ValueError:
        answer = raw.decode("utf-8", "replace")
    return Answer(status=status, body=answer, prediction_id=headers.get("x-prediction-id"))
