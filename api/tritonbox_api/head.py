"""`HEAD` on every `GET` route: answered as the `GET` would be, headers and all, with no body.

Starlette's own routes (the OpenAPI pages) accept HEAD, FastAPI's routes do not: a route
declared with HEAD would also be a second operation in the OpenAPI document. So this pure ASGI
middleware hands the app a HEAD request as a GET (the same dependencies, API key check
included) and sends the client the response's start (status, headers, Content-Length) and an
empty body. No GET route streams, so the body it drops is one bounded message.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class HeadMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        ended = False

        async def without_body(message: Message) -> None:
            nonlocal ended
            if message["type"] != "http.response.body":
                await send(message)
            elif not ended:
                ended = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})

        await self.app({**scope, "method": "GET"}, receive, without_body)
