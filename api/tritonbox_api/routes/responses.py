"""What the routes can answer, for the OpenAPI document: each status's meaning is written once
here, and every route names the statuses it can really produce (`errors(...)`), so generated
clients and contract tests (schemathesis) see the api as it is.

Every error body is OpenAI's (`ErrorResponse`): the native routes answer an invalid field with
422, the OpenAI routes with 400 (openai_errors.py), and FastAPI's own 422 schema
(`HTTPValidationError`), which it adds to every route with parameters, describes no answer of
this api: `install` takes it out of the document where a route does not declare 422.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute, RouteContext, iter_route_contexts

from tritonbox_api.protocol.errors import ErrorResponse

Responses = dict[int | str, dict[str, Any]]

_RETRY = {"Retry-After": {"description": "Seconds to wait.", "schema": {"type": "integer"}}}
# OpenAI's rate-limit headers, on every answer of a key with limits (rate_limit.py).
_RATE = {
    f"x-ratelimit-{what}-{kind}": {"description": meaning, "schema": {"type": schema}}
    for kind in ("requests", "tokens")
    for what, meaning, schema in (
        ("limit", f"The key's {kind} per minute (this api worker's share).", "integer"),
        ("remaining", f"The {kind} left now.", "integer"),
        ("reset", "Until the limit is whole again, as `1s`, `250ms`, `1m30s`.", "string"),
    )
}

# status: (meaning, headers it carries)
_ERRORS: dict[int, tuple[str, dict[str, Any]]] = {
    400: ("The body could not be read as JSON text, or (OpenAI routes) a field is invalid.", {}),
    401: (
        "API_KEY is set and `Authorization: Bearer <API_KEY>` is missing or wrong.",
        {"WWW-Authenticate": {"description": "`Bearer`.", "schema": {"type": "string"}}},
    ),
    403: ("The key lacks the role the route needs (`manage`): `error.message` names it.", {}),
    404: ("What the request names does not exist: `error.message` says which.", {}),
    409: (
        "The adapter is already registered, or its files changed since it was registered.",
        {},
    ),
    413: ("The body is larger than MAX_BODY_BYTES.", {}),
    422: ("A field is invalid: `error.param` names it, `error.message` the limit.", {}),
    429: (
        "At capacity (MAX_CONCURRENT_REQUESTS, or the engine's queue is full), or past the "
        "key's requests or tokens per minute (`x-ratelimit-*` say which): retry after "
        "`Retry-After` (none: the request alone exceeds the key's tokens per minute).",
        {**_RETRY, **_RATE},
    ),
    499: ("The prediction was cancelled before it finished (POST .../cancel).", {}),
    502: ("The engine failed the prediction.", {}),
    503: ("The engine is not available (starting, or gone): retry shortly.", _RETRY),
}

# Statuses beside the error table's: the bodies and media types that are not JSON models.
TEXT = {"schema": {"type": "string"}}
EVENT_STREAM = "text/event-stream"
# OpenAPI 3.2's schema of each event of a stream, as FastAPI declares its own streams'.
_EVENT = {
    "type": "object",
    "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
    "required": ["data"],
}


def errors(*statuses: int, notes: dict[int, str] | None = None) -> Responses:
    """The OpenAPI `responses` of these error statuses; `notes`: what one means on this route."""
    declared: Responses = {}
    for status in statuses:
        meaning, headers = _ERRORS[status]
        entry: dict[str, Any] = {"model": ErrorResponse, "description": meaning}
        if notes and status in notes:
            entry["description"] = notes[status]
        if headers:
            entry["headers"] = headers
        declared[status] = entry
    return declared


# Guarded routes (deps.Guarded) declare 401; the test ties the two together.
GUARDED = errors(401)
# What every route that starts a prediction can answer besides its own success and refusals:
# an unknown adapter (404), an adapter whose files changed (409), a body over the limit (413),
# no room (429) and an engine not ready (503).
GENERATING = (404, 409, 413, 429, 503)


def streamed(status: int, media_type: str, description: str) -> Responses:
    """A success answered either as JSON (the route's model) or, when asked, as a stream."""
    return {status: {"description": description, "content": {media_type: {"itemSchema": _EVENT}}}}


def api_routes(app: FastAPI) -> Iterator[RouteContext]:
    """Every route of the app's routers, as served (with its router's prefix and responses)."""
    for context in iter_route_contexts(app.routes):
        if isinstance(context.original_route, APIRoute):
            yield context


# FastAPI's OpenAPI model holds `minimum`/`maximum` as floats, which turns every integer bound
# into 0.0-style numbers and rounds those past 2**53: seed's 2**63 - 1 came out as 2**63, so a
# client that trusts the document sends a seed the api refuses. The integer bounds this api sets
# past 2**53 are int64's and uint64's limits, recovered from their rounded value here.
_WIDE_BOUNDS = {float(bound): bound for bound in (2**63 - 1, -(2**63), 2**64 - 1)}


def _exact_integer_bounds(node: Any) -> None:
    """Give every integer schema in `node` its bounds back as integers (exact ones)."""
    if isinstance(node, list):
        for item in node:
            _exact_integer_bounds(item)
        return
    if not isinstance(node, dict):
        return
    if node.get("type") == "integer":
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            bound = node.get(key)
            if isinstance(bound, float) and bound.is_integer():
                node[key] = _WIDE_BOUNDS.get(bound, int(bound))
    for value in node.values():
        _exact_integer_bounds(value)


def install(app: FastAPI) -> None:
    """Build the document as FastAPI does, then drop the 422s no route of this api answers."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = generate()
        for route in api_routes(app):
            if 422 in route.responses:
                continue
            operations = document["paths"].get(route.path_format, {})
            for method in route.methods or ():
                operations.get(method.lower(), {}).get("responses", {}).pop("422", None)
        if "HTTPValidationError" not in json.dumps(document["paths"]):
            for name in ("HTTPValidationError", "ValidationError"):
                document.get("components", {}).get("schemas", {}).pop(name, None)
        _exact_integer_bounds(document)
        return document

    app.openapi = openapi  # type: ignore[method-assign]
