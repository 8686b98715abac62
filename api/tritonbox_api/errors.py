"""Exception handlers: every error is JSON in the OpenAI shape, none carries a traceback."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import Match

from tritonbox_api.protocol.errors import ApiError

log = logging.getLogger(__name__)


# Pydantic names the member of a union that failed in `loc` ("str", "list[constrained-str]"):
# no field of the request, so no part of the name the client sees.
_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _union_member(part: str) -> bool:
    return not part.isidentifier() or part in _TYPE_NAMES


def _field(loc: tuple[Any, ...]) -> str:
    # ("body", "input", "stop_words_list", 2) -> "input.stop_words_list[2]";
    # ("body", "stop", "list[constrained-str]", 1) -> "stop[1]"
    name = ""
    for part in loc[1:] if loc and loc[0] in ("body", "query", "path") else loc:
        if isinstance(part, int):
            name += f"[{part}]"
        elif not (name and _union_member(str(part))):
            name += f".{part}" if name else str(part)
    return name or "body"


def describe(error: dict[str, Any]) -> tuple[str, str]:
    """(field, message) for one pydantic error, naming the limit and the value given."""
    field = _field(tuple(error.get("loc", ())))
    message = str(error.get("msg", "is invalid"))
    if message.startswith("Value error, "):
        message = message.removeprefix("Value error, ")
        if ":" in message.split(" ")[0]:
            return message.split(":", 1)[0], message  # the validator named the field itself
    if error.get("type") == "extra_forbidden":
        return field, f"{field}: unknown field"
    if error.get("type") == "missing":
        return field, f"{field}: is required"
    if error.get("type") == "json_invalid":
        return "body", f"body: not valid JSON ({error.get('ctx', {}).get('error', message)})"
    return field, f"{field}: {message[:1].lower()}{message[1:]}, got {shown(error.get('input'))}"


def shown(value: Any) -> str:
    """The value a message repeats: whole when short; a long string by its start and length,
    a long list or object not at all. An error never reflects a large input back (a prompt of
    200,000 characters was answered with all of them)."""
    text = repr(value)
    if len(text) < 80:
        return text
    if isinstance(value, str):
        return f"{value[:32]!r}… ({len(value)} characters)"
    return "…"


def _json(error: ApiError) -> JSONResponse:
    return JSONResponse(
        error.body().model_dump(), status_code=error.status_code, headers=error.headers
    )


async def _api_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, ApiError)
    return _json(error)


def validation_error(error: RequestValidationError, status_code: int = 422) -> ApiError:
    """The ApiError for a request pydantic refused: every problem, `param` the first's field."""
    problems = [describe(e) for e in error.errors()]
    first, _ = problems[0] if problems else ("body", "")
    # A union's members each report. The deepest name under the first field says where
    # ("stop[1]" for the empty second word of a list): the member that did not fit at all
    # ("stop: input should be a valid string") is left out then.
    field = max(
        (f for f, _ in problems if f == first or f.startswith((f"{first}[", f"{first}."))),
        key=len,
        default=first,
    )
    if field != first:
        problems = [(f, m) for f, m in problems if f != first]
    # The same text twice (a union's members alike) says nothing more.
    message = "; ".join(dict.fromkeys(m for _, m in problems)) or "invalid request"
    return ApiError(status_code, message, param=field)


async def _validation_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    return _json(validation_error(error))


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this request's path (Starlette's 405 names only those
    of the first route it matched, one of several when GET and POST are separate routes)."""
    allowed = [
        method
        for method in ("GET", "POST", "PUT", "PATCH", "DELETE")
        if any(
            route.matches({**request.scope, "method": method})[0] is Match.FULL
            for route in request.app.router.routes
        )
    ]
    return allowed + ["HEAD"] * ("GET" in allowed)  # HeadMiddleware: HEAD wherever GET is


async def _http_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, HTTPException)
    kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
    headers = dict(error.headers or {})
    if error.status_code == 405:
        headers["Allow"] = ", ".join(allowed_methods(request))
    if error.status_code == 400 and error.__cause__ is not None:  # FastAPI could not parse it
        return _json(ApiError(400, unreadable_body(error.__cause__), param="body"))
    return _json(ApiError(error.status_code, str(error.detail), type=kind, headers=headers))


def unreadable_body(cause: BaseException) -> str:
    """Why FastAPI could not read a body, for what it answers as "There was an error parsing
    the body" (what it does not take for malformed JSON: lists nested past the parser's
    recursion limit in a few kilobytes, bytes that are not UTF-8, a malformed form)."""
    if isinstance(cause, RecursionError):
        return "body: not valid JSON (nested too deeply to read)"
    if isinstance(cause, UnicodeDecodeError):
        return "body: not valid JSON (not UTF-8)"
    return f"body: cannot be read ({type(cause).__name__})"


async def _unexpected(request: Request, error: Exception) -> JSONResponse:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return _json(ApiError(500, "internal error (logged on the server)", type="server_error"))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
