"""Listing predictions a page at a time, newest first: keyset pagination on (created_at, id),
with the last row's key as an opaque cursor for the next page."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime

from sqlalchemy import and_, or_
from sqlmodel import Session, col, select

from tritonbox_api.db.crud import as_utc
from tritonbox_api.db.models import Prediction, Source, Status


def _encode_cursor(row: Prediction) -> str:
    key = f"{as_utc(row.created_at).isoformat()}|{row.id}"
    return base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        key = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        moment, separator, prediction_id = key.partition("|")
        if not separator or not prediction_id:
            raise ValueError("no separator")
        created = as_utc(datetime.fromisoformat(moment))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ValueError("cursor: not a cursor this api gave out (use `next` as is)") from None
    return created, prediction_id


def list_predictions(
    *,
    session: Session,
    limit: int,
    cursor: str | None = None,
    status: Status | None = None,
    source: Source | None = None,
) -> tuple[list[Prediction], str | None]:
    """Newest first; the cursor for the next (older) page, or None on the last page.

    Keyset pagination on (created_at, id): rows inserted meanwhile shift nothing, so pages
    neither repeat nor skip. Raises ValueError for a bad limit or cursor.
    """
    if limit < 1:
        raise ValueError(f"limit: must be at least 1, got {limit}")
    query = select(Prediction)
    if status is not None:
        query = query.where(col(Prediction.status) == status)
    if source is not None:
        query = query.where(col(Prediction.source) == source)
    if cursor is not None:
        created, last_id = _decode_cursor(cursor)
        query = query.where(
            or_(
                col(Prediction.created_at) < created,
                and_(col(Prediction.created_at) == created, col(Prediction.id) < last_id),
            )
        )
    query = query.order_by(col(Prediction.created_at).desc(), col(Prediction.id).desc())
    # One row more than asked tells whether another page follows, without a COUNT.
    rows = list(session.exec(query.limit(limit + 1)))
    if len(rows) <= limit:
        return rows, None
    page = rows[:limit]
    return page, _encode_cursor(page[-1])
