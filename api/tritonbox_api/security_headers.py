"""Security headers on every response: no sniffing, no framing, no referrer, a strict CSP.

A pure ASGI middleware (not Starlette's BaseHTTPMiddleware, which runs the app in a separate task
and so hides client disconnects from streaming routes): it only adds headers to
`http.response.start` and passes every other message through untouched.

The permalink page is the one HTML page the api renders. Its inline `<script>` and `<style>` are
static, so the page's policy allows exactly those by hash and nothing else: no other script,
style, image, font, frame or form target, even if a prompt smuggled markup past the escaping.
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

from starlette.types import ASGIApp, Message, Receive, Scope, Send

TEMPLATE = Path(__file__).parent / "templates" / "permalink.html"
# OpenAPI's interactive pages load Swagger UI / ReDoc with inline code of FastAPI's own; they
# show the schema only (no data), so they keep the headers below but no CSP.
DOCS_PATHS = frozenset({"/docs", "/redoc", "/docs/oauth2-redirect"})

COMMON_HEADERS = (
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    # Permalinks are capabilities (an unguessable id): never leak one to another site.
    ("referrer-policy", "no-referrer"),
    ("cross-origin-opener-policy", "same-origin"),
)
# JSON, SSE and plain text: nothing in them may run or load anything.
API_CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"


def _inline_hashes(html: str, tag: str) -> list[str]:
    """CSP source expressions for the static inline `<tag>` blocks of a template."""
    blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.DOTALL)
    for block in blocks:
        if "{{" in block or "{%" in block:
            raise ValueError(f"{TEMPLATE.name}: an inline <{tag}> must be static to be hashed")
    return [
        "'sha256-" + base64.b64encode(hashlib.sha256(b.encode()).digest()).decode() + "'"
        for b in blocks
    ]


def page_csp(html: str) -> str:
    """The permalink page's policy: its own inline script and style, nothing else."""
    scripts = " ".join(_inline_hashes(html, "script")) or "'none'"
    styles = " ".join(_inline_hashes(html, "style")) or "'none'"
    return (
        f"default-src 'none'; script-src {scripts}; style-src {styles}; img-src data:; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    )


def _encoded(*headers: tuple[str, str]) -> list[tuple[bytes, bytes]]:
    return [(name.encode(), value.encode()) for name, value in headers]


class SecurityHeadersMiddleware:
    def __init__(self, app: ASGIApp, *, page_prefix: str = "/p/") -> None:
        self.app = app
        self.page_prefix = page_prefix
        # Built once: three header sets, one picked per request.
        self.page_headers = _encoded(
            *COMMON_HEADERS, ("content-security-policy", page_csp(TEMPLATE.read_text()))
        )
        self.api_headers = _encoded(*COMMON_HEADERS, ("content-security-policy", API_CSP))
        self.docs_headers = _encoded(*COMMON_HEADERS)

    def _headers(self, path: str) -> list[tuple[bytes, bytes]]:
        if path.startswith(self.page_prefix):
            return self.page_headers
        return self.docs_headers if path in DOCS_PATHS else self.api_headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = self._headers(scope.get("path", ""))

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                added = [(k, v) for k, v in extra if k not in present]
                message = {**message, "headers": [*message.get("headers", []), *added]}
            await send(message)

        await self.app(scope, receive, send_with_headers)
