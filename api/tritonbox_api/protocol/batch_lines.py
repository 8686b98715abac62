"""A batch's input lines and output lines, in OpenAI's JSONL formats.

Input: `{"custom_id", "method": "POST", "url", "body"}` a line. A line that cannot be run
(not JSON, no custom_id, another url, a streamed body) is not the batch's failure: it becomes
that line's answer, the 4xx the route would give, in the error file.
Output: `{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`;
`request_id` is the line's prediction (its permalink `/p/{request_id}`), `error` is set only for
lines that got no answer (`batch_expired`, `batch_cancelled`).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from tritonbox_api.protocol.batches import ENDPOINTS


@dataclass(frozen=True)
class InputLine:
    line: int  # its number in the file, from 1
    custom_id: str | None
    url: str | None = None
    body: str | None = None  # JSON text of the route's body; None when refused
    refusal: tuple[int, dict[str, Any]] | None = None  # (status, OpenAI error body)


def error_body(message: str, *, param: str | None, type: str = "invalid_request_error") -> Any:
    return {"error": {"message": message, "type": type, "param": param, "code": None}}


def content_lines(content: bytes) -> list[tuple[int, bytes]]:
    """The file's lines that are not blank, with their numbers (from 1)."""
    return [(number, raw) for number, raw in enumerate(content.split(b"\n"), 1) if raw.strip()]


def _refused(number: int, custom_id: str | None, status: int, body: Any) -> InputLine:
    return InputLine(line=number, custom_id=custom_id, refusal=(status, body))


def parse_line(number: int, raw: bytes) -> InputLine:
    """One input line, checked as OpenAI's batch input line; refused with the route's 4xx."""
    where = f"line {number}"
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        return _refused(
            number, None, 400, error_body(f"{where}: not valid JSON ({error})", param=None)
        )
    if not isinstance(value, dict):
        return _refused(number, None, 400, error_body(f"{where}: not a JSON object", param=None))
    custom_id = value.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        shown = custom_id if isinstance(custom_id, str) else None
        message = f"custom_id: {where} needs a custom_id, a non-empty string"
        return _refused(number, shown, 400, error_body(message, param="custom_id"))
    method = value.get("method", "POST")
    if method != "POST":
        message = f"method: {where}: {method!r} is not POST, the only method of a batch line"
        return _refused(number, custom_id, 400, error_body(message, param="method"))
    url = value.get("url")
    if url not in ENDPOINTS:
        # The answer a request to a route that is not there gets (404), naming the routes taken.
        message = f"url: {url!r} is not a route batch lines may target ({', '.join(ENDPOINTS)})"
        body = error_body(message, param="url", type="not_found_error")
        return _refused(number, custom_id, 404, body)
    body = value.get("body")
    if not isinstance(body, dict):
        message = f"body: {where} needs a body, the JSON object the route takes"
        return _refused(number, custom_id, 400, error_body(message, param="body"))
    if body.get("stream"):
        message = "stream: a batch line is answered whole: leave `stream` out, or false"
        return _refused(number, custom_id, 400, error_body(message, param="stream"))
    return InputLine(line=number, custom_id=custom_id, url=url, body=json.dumps(body))


def parse(content: bytes) -> list[InputLine]:
    return [parse_line(number, raw) for number, raw in content_lines(content)]


def duplicate(lines: list[InputLine]) -> tuple[str, int, int] | None:
    """The first custom_id two lines share, with their numbers; None if all differ."""
    seen: dict[str, int] = {}
    for each in lines:
        if each.custom_id is None:
            continue
        if each.custom_id in seen:
            return each.custom_id, seen[each.custom_id], each.line
        seen[each.custom_id] = each.line
    return None


def new_request_id() -> str:
    return f"batch_req_{secrets.token_hex(12)}"


def answered(
    custom_id: str | None,
    status: int,
    request_id: str | None,
    body: Any,
    error: tuple[str, str] | None = None,
) -> str:
    """The output line of a line the route answered (any status); `error`: (code, message)
    for a line stopped while it ran (its answer then is the route's 499 with what it wrote)."""
    response = {"status_code": status, "request_id": request_id, "body": body}
    stopped = {"code": error[0], "message": error[1]} if error else None
    line = {"id": new_request_id(), "custom_id": custom_id, "response": response, "error": stopped}
    return json.dumps(line)


def unanswered(custom_id: str | None, code: str, message: str) -> str:
    """The output line of a line that never got an answer (expired, cancelled)."""
    error = {"code": code, "message": message}
    return json.dumps(
        {"id": new_request_id(), "custom_id": custom_id, "response": None, "error": error}
    )


EXPIRED = (
    "batch_expired",
    "This request could not be run before the batch's completion window ended.",
)
CANCELLED = ("batch_cancelled", "This request was not run: its batch was cancelled.")
