"""Reading and writing predictions. Every helper takes the session first and commits its writes.

Datetimes: SQLite keeps them as zone-less text. SQLModel's `UTCDateTime` column type (what the
model's `datetime` fields map to) writes them in UTC and reads them back UTC-aware, so rows from
these helpers always carry aware datetimes and comparisons in queries are in UTC. `as_utc`
normalises any other datetime the same way (a naive one is taken as UTC), for code that gets one
from elsewhere, e.g. a `Prediction` built in memory.
"""

from __future__ import annotations

import secrets
from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any, overload

from sqlalchemy import ColumnElement, and_, or_, update
from sqlmodel import Session, col, select

from tritonbox_api.db.models import (
    FinishReason,
    Prediction,
    Source,
    Status,
    utc_now,
)

RUNNING = (Status.STARTING, Status.PROCESSING)
INTERRUPTED_ERROR = "interrupted: the api stopped before this prediction finished"


def new_prediction_id() -> str:
    """192 random bits, URL-safe (32 characters of A-Z a-z 0-9 - _): ids cannot be guessed,
    so a prediction's permalink is as private as the person who shares it."""
    return secrets.token_urlsafe(24)


@overload
def as_utc(moment: datetime) -> datetime: ...
@overload
def as_utc(moment: None) -> None: ...
def as_utc(moment: datetime | None) -> datetime | None:
    """A datetime from the database as UTC-aware (a naive one was stored in UTC)."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def create_prediction(
    *,
    session: Session,
    id: str,
    source: Source,
    model: str,
    input: dict[str, Any],
    applied: dict[str, Any],
    prompt_tokens: int | None,
    owner: str | None = None,
    adapter_name: str | None = None,
    adapter_sha256: str | None = None,
) -> Prediction:
    """Insert a prediction that starts now (status `processing`), run by `owner` (unset = the
    api worker the session's Database serves, `session.info["owner"]`)."""
    now = utc_now()
    row = Prediction(
        id=id,
        owner=owner if owner is not None else session.info.get("owner"),
        status=Status.PROCESSING,
        source=source,
        model=model,
        input=input,
        applied=applied,
        prompt_tokens=prompt_tokens,
        created_at=now,
        started_at=now,
        adapter_name=adapter_name,
        adapter_sha256=adapter_sha256,
    )
    session.add(row)
    session.commit()
    return row


def complete_prediction(
    *,
    session: Session,
    id: str,
    status: Status,
    output: str,
    finish_reason: FinishReason | None,
    error: str | None,
    completion_tokens: int,
    time_to_first_token_s: float | None,
    total_time_s: float,
    stop_word: str | None = None,
    choices: list[dict[str, Any]] | None = None,
) -> Prediction:
    """Record how a prediction ended, with its derived metrics.

    Only a running prediction is completed: one already finished is returned unchanged, so a
    cancel racing the normal end (or a second call) cannot overwrite the first ending.
    Raises LookupError when there is no such prediction.
    """
    if not status.finished:
        raise ValueError(f"status: a prediction ends succeeded, failed or canceled, not {status}")
    per_token = None
    if completion_tokens > 1 and time_to_first_token_s is not None:
        # The first token's time is the prefill's; the rest are one decoding step each.
        per_token = (total_time_s - time_to_first_token_s) / (completion_tokens - 1)
    # One conditional UPDATE: the check and the write cannot be split by another writer.
    session.execute(
        update(Prediction)
        .where(col(Prediction.id) == id, col(Prediction.status).in_(RUNNING))
        .values(
            status=status,
            output=output,
            finish_reason=finish_reason,
            stop_word=stop_word,
            choices=choices,
            error=error,
            completion_tokens=completion_tokens,
            time_to_first_token_s=time_to_first_token_s,
            time_per_output_token_s=per_token,
            total_time_s=total_time_s,
            tokens_per_second=completion_tokens / total_time_s if total_time_s > 0 else None,
            completed_at=utc_now(),
        )
        # The row is read back below: matching it against objects in the session first (the
        # ORM's default) is wasted work, a fifth of this write's CPU under load.
        .execution_options(synchronize_session=False)
    )
    session.commit()
    row = get_prediction(session=session, id=id)
    if row is None:
        raise LookupError(f"prediction {id} not found")
    return row


def update_output(*, session: Session, id: str, output: str) -> bool:
    """Save the output so far of a running prediction; False if it is not running (any more)."""
    result = session.execute(
        update(Prediction)
        .where(col(Prediction.id) == id, col(Prediction.status).in_(RUNNING))
        .values(output=output)
    )
    session.commit()
    return bool(getattr(result, "rowcount", 0))


def get_prediction(*, session: Session, id: str) -> Prediction | None:
    # populate_existing: a row this session already holds is read again, not served stale.
    return session.get(Prediction, id, populate_existing=True)


def recover_interrupted(*, session: Session, live_workers: Collection[str] = ()) -> int:
    """Fail the predictions a crash left running; how many.

    Rows run by one of `live_workers` (ApiWorker ids whose heartbeat is current, see
    `live_worker_ids`) are left alone: another api process is still generating them.
    """
    orphan: ColumnElement[bool] = col(Prediction.status).in_(RUNNING)
    if live_workers:
        orphan = and_(
            orphan,
            or_(col(Prediction.owner).is_(None), col(Prediction.owner).not_in(live_workers)),
        )
    result = session.execute(
        update(Prediction)
        .where(orphan)
        .values(
            status=Status.FAILED,
            finish_reason=FinishReason.ERROR,
            error=INTERRUPTED_ERROR,
            completed_at=utc_now(),
        )
    )
    session.commit()
    return int(getattr(result, "rowcount", 0))


def request_cancel(*, session: Session, id: str) -> bool:
    """Mark a running prediction for cancelling by the api worker that runs it (it watches for
    this, `cancel_requests`); False if it is not running (finished, or no such id)."""
    result = session.execute(
        update(Prediction)
        .where(col(Prediction.id) == id, col(Prediction.status).in_(RUNNING))
        .values(cancel_requested_at=utc_now())
        .execution_options(synchronize_session=False)
    )
    session.commit()
    return bool(getattr(result, "rowcount", 0))


def cancel_requests(*, session: Session, owner: str) -> list[str]:
    """The running predictions of worker `owner` that someone asked to cancel."""
    query = select(Prediction.id).where(
        col(Prediction.owner) == owner,
        col(Prediction.status).in_(RUNNING),
        col(Prediction.cancel_requested_at).is_not(None),
    )
    return list(session.exec(query))
