"""Refuse request bodies above MAX_BODY_BYTES before anything parses them."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyLimitMiddleware:
    """413 for a declared Content-Length over the limit, or a chunked body that grows past it.

    A body without a Content-Length is read here, up to the limit, before the app sees it: an
    error raised from inside the app's own read would reach FastAPI's body parsing, which turns
    any failure into 400 "There was an error parsing the body". With a Content-Length, the
    server delivers exactly that many bytes, so the declared size is the one to check.
    """

    def __init__(
        self, app: ASGIApp, *, max_bytes: int, paths: dict[str, tuple[int, str]] | None = None
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.setting = "MAX_BODY_BYTES"
        # Paths with a limit of their own: path -> (bytes, the setting that names it).
        self.paths = paths or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        own = self.paths.get(scope["path"])
        if own is not None:
            bounded = BodyLimitMiddleware(self.app, max_bytes=own[0])
            bounded.setting = own[1]
            await bounded(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if declared.isdigit() and int(declared) > self.max_bytes:
                await self._refuse(send)
                return
            await self.app(scope, receive, send)
            return
        pieces: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before its body was complete
            piece = message.get("body", b"")
            size += len(piece)
            if size > self.max_bytes:
                await self._refuse(send)
                return
            pieces.append(piece)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # then the disconnect, when it comes
            replayed = True
            return {"type": "http.request", "body": b"".join(pieces), "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(
            {
                "error": {
                    "message": f"body: larger than the limit of {self.max_bytes} bytes "
                    f"({self.setting})",
                    "type": "invalid_request_error",
                    "param": "body",
                    "code": None,
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
