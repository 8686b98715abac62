"""Which batch line the current task runs, for the code a line goes through unchanged.

The batch runner sends each line through the app itself (service/batch_dispatch.py), so a line
takes the live route's every step; what differs is set here, in a context variable of the task
that runs the line (tasks it starts inherit it; no HTTP client can set one): the key the batch
was created with stands in for the `Authorization` header (deps.require_api_key), the row gets
the batch's id and the line's custom_id, and the slots it takes are the batch's, not the live
requests' MAX_CONCURRENT_REQUESTS (service/admission.py).
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

from tritonbox_api.keys import ApiKey, Role


@dataclass(frozen=True)
class LineContext:
    batch_id: str
    custom_id: str | None
    key: ApiKey | None  # the batch creator's key (its name: roles are checked at create)


_CURRENT: ContextVar[LineContext | None] = ContextVar("tritonbox_batch_line", default=None)


def of_line(batch_id: str, custom_id: str | None, key_name: str | None) -> LineContext:
    """A line's context; it runs as the key named `key_name` (its roles were checked when the
    batch was created: `use` is all a line needs)."""
    key = ApiKey(key_name, frozenset({Role.USE}), b"") if key_name else None
    return LineContext(batch_id=batch_id, custom_id=custom_id, key=key)


def current() -> LineContext | None:
    """The batch line this task runs; None for a live request."""
    return _CURRENT.get()


def enter(line: LineContext) -> None:
    """Mark the calling task (and those it starts) as running `line`."""
    _CURRENT.set(line)
