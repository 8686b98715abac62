"""Reading and writing predictions. Every helper takes the session first and commits its writes,
except `add_prediction` and `end_predictions`: they leave the commit to their caller, so that a
group of writes shares one (db.group_commit).

Datetimes: SQLite keeps them as zone-less text. SQLModel's `UTCDateTime` column type (what the
model's `datetime` fields map to) writes them in UTC and reads them back UTC-aware, so rows from
these helpers always carry aware datetimes and comparisons in queries are in UTC. `as_utc`
normalises any other datetime the same way (a naive one is taken as UTC), for code that gets one
from elsewhere, e.g. a `Prediction` built in memory.
"""

from __future__ import annotations

import secrets
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from typing import Any, NotRequired, TypedDict, Unpack, overload

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


class NewPrediction(TypedDict):
    """A prediction that starts now: `create_prediction`'s arguments."""

    id: str
    source: Source
    model: str
    input: dict[str, Any]
    applied: dict[str, Any]
    prompt_tokens: int | None
    owner: NotRequired[str | None]
    adapter_name: NotRequired[str | None]
    adapter_sha256: NotRequired[str | None]
    api_key_name: NotRequired[str | None]
    batch_id: NotRequired[str | None]
    custom_id: NotRequired[str | None]


class Ending(TypedDict):
    """How a prediction ended: `complete_prediction`'s arguments."""

    id: str
    status: Status
    output: str
    finish_reason: FinishReason | None
    error: str | None
    completion_tokens: int
    time_to_first_token_s: float | None
    total_time_s: float
    stop_word: NotRequired[str | None]
    choices: NotRequired[list[dict[str, Any]] | None]


def create_prediction(*, session: Session, **new: Unpack[NewPrediction]) -> Prediction:
    """Insert a prediction that starts now (status `processing`), run by `owner` (unset = the
    api worker the session's Database serves, `session.info["owner"]`)."""
    row = add_prediction(session=session, **new)
    session.commit()
    return row


def add_prediction(*, session: Session, **new: Unpack[NewPrediction]) -> Prediction:
    """`create_prediction` without the commit."""
    now = utc_now()
    row = Prediction(**new, status=Status.PROCESSING, created_at=now, started_at=now)
    if row.owner is None:
        row.owner = session.info.get("owner")
    session.add(row)
    return row


def complete_prediction(*, session: Session, **ending: Unpack[Ending]) -> Prediction:
    """Record how a prediction ended, with its derived metrics.

    Only a running prediction is completed: one already finished is returned unchanged, so a
    cancel racing the normal end (or a second call) cannot overwrite the first ending.
    Raises LookupError when there is no such prediction.
    """
    end_predictions(session=session, endings=[ending])
    session.commit()
    row = get_prediction(session=session, id=ending["id"])
    if row is None:
        raise LookupError(f"prediction {ending['id']} not found")
    return row


def end_predictions(*, session: Session, endings: Sequence[Ending]) -> None:
    """`complete_prediction` for several predictions, without the commit or the read back.

    One UPDATE executed for each ending in turn (executemany), each conditional on the row still
    running: the check and the write cannot be split by another writer, and when two endings of
    one prediction come together the first one stays.
    """
    if not endings:
        return
    # The ORM's bulk UPDATE by primary key, the running check added to each row's WHERE (which
    # turns off its rowcount check: a finished row is no error). The check is spelled as
    # equalities: an IN list is expanded at each execution, which executemany refuses. The rows
    # are read back by the caller: matching them against objects in the session first (the
    # ORM's default) is wasted work, a fifth of a lone write's CPU under load.
    running = or_(*(col(Prediction.status) == status for status in RUNNING))
    session.execute(
        update(Prediction).where(running).execution_options(synchronize_session=False),
        [_ending_values(ending, utc_now()) for ending in endings],
    )


def _ending_values(ending: Ending, completed_at: datetime) -> dict[str, Any]:
    status = ending["status"]
    if not status.finished:
        raise ValueError(f"status: a prediction ends succeeded, failed or canceled, not {status}")
    tokens, total = ending["completion_tokens"], ending["total_time_s"]
    first = ending["time_to_first_token_s"]
    per_token = None
    if tokens > 1 and first is not None:
        # The first token's time is the prefill's; the rest are one decoding step each.
        per_token = (total - first) / (tokens - 1)
    return dict(
        id=ending["id"],
        status=status,
        output=ending["output"],
        finish_reason=ending["finish_reason"],
        stop_word=ending.get("stop_word"),
        choices=ending.get("choices"),
        error=ending["error"],
        completion_tokens=tokens,
        time_to_first_token_s=first,
        time_per_output_token_s=per_token,
        total_time_s=total,
        tokens_per_second=tokens / total if total > 0 else None,
        completed_at=completed_at,
    )


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


def get_predictions(*, session: Session, ids: Collection[str]) -> dict[str, Prediction]:
    """The predictions with these ids (in one query), by id; a missing one is left out."""
    query = select(Prediction).where(col(Prediction.id).in_(ids))
    rows = session.exec(query.execution_options(populate_existing=True))
    return {row.id: row for row in rows}


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
