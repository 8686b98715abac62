"""Batches and their lines in the database (db/batches.py): create, read, count, cancel,
expire. Each helper commits its writes; what the workers do with lines is in batch_claims.py."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import func, insert, update
from sqlmodel import Session, col, select

from tritonbox_api.db.batches import Batch, BatchLine, BatchStatus, LineOutcome, LineState
from tritonbox_api.db.models import utc_now
from tritonbox_api.protocol.batch_lines import InputLine, answered

OPEN = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)
# Batches whose lines may still run or wait.
LIVE = (*OPEN, BatchStatus.CANCELLING, BatchStatus.FINALIZING)


def create_batch(session: Session, *, batch: Batch, lines: list[InputLine]) -> Batch:
    """The batch and a row per line; a line refused as it stands is done at once (failed)."""
    session.add(batch)
    now = utc_now()
    rows = []
    for each in lines:
        row = {
            "batch_id": batch.id,
            "line": each.line,
            "custom_id": each.custom_id,
            "url": each.url,
            "body": each.body,
            "state": LineState.PENDING,
            "outcome": None,
            "attempts": 0,
            "result": None,
            "ended_at": None,
        }
        if each.refusal is not None:
            status, body = each.refusal
            row |= {
                "state": LineState.DONE,
                "outcome": LineOutcome.FAILED,
                "ended_at": now,
                "result": answered(each.custom_id, status, None, body),
            }
        rows.append(row)
    session.flush()  # the batch first (the lines name it)
    if rows:
        session.execute(insert(BatchLine), rows)
    session.commit()
    return batch


def get_batch(session: Session, batch_id: str) -> Batch | None:
    return session.get(Batch, batch_id, populate_existing=True)


def list_batches(session: Session, *, after: str | None, limit: int) -> tuple[list[Batch], bool]:
    query = select(Batch)
    created, ident = col(Batch.created_at), col(Batch.id)
    anchor = get_batch(session, after) if after else None
    if anchor is not None:
        query = query.where(
            (created < anchor.created_at) | ((created == anchor.created_at) & (ident < anchor.id))
        )
    rows = list(session.exec(query.order_by(created.desc(), ident.desc()).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


def counts(session: Session, batch_ids: Collection[str]) -> dict[str, tuple[int, int]]:
    """(completed, failed) of each batch's lines done so far (failed: all in the error file)."""
    query = (
        select(BatchLine.batch_id, BatchLine.outcome, func.count())
        .where(col(BatchLine.batch_id).in_(batch_ids), col(BatchLine.state) == LineState.DONE)
        .group_by(col(BatchLine.batch_id), col(BatchLine.outcome))
    )
    found: dict[str, tuple[int, int]] = {ident: (0, 0) for ident in batch_ids}
    for ident, outcome, count in session.exec(query):
        completed, failed = found[ident]
        if outcome == LineOutcome.COMPLETED:
            found[ident] = (completed + count, failed)
        else:
            found[ident] = (completed, failed + count)
    return found


def of_open_batches() -> Any:
    """The lines of batches not ended (by the batch index, then the line's: ended batches' lines,
    however many, are never scanned)."""
    live = select(Batch.id).where(col(Batch.status).in_(LIVE))
    return col(BatchLine.batch_id).in_(live)


def waiting(session: Session) -> int:
    """Lines not yet begun, over every open batch."""
    query = select(func.count()).where(of_open_batches(), col(BatchLine.state) == LineState.PENDING)
    return int(session.exec(query).one())


def _close_pending(session: Session, batch_ids: Collection[str], outcome: LineOutcome) -> None:
    """The batches' lines not begun end now, unanswered (finalize writes their output lines)."""
    session.execute(
        update(BatchLine)
        .where(col(BatchLine.batch_id).in_(batch_ids), col(BatchLine.state) == LineState.PENDING)
        .values(state=LineState.DONE, outcome=outcome, ended_at=utc_now())
        .execution_options(synchronize_session=False)
    )


def request_cancel(session: Session, batch_id: str) -> Batch | None:
    """An open batch goes `cancelling`: its lines not begun end cancelled; the workers running
    the others stop them. The batch as it is then (None: no such batch)."""
    found = session.execute(
        update(Batch)
        .where(col(Batch.id) == batch_id, col(Batch.status).in_(OPEN))
        .values(status=BatchStatus.CANCELLING, cancelling_at=utc_now())
        .execution_options(synchronize_session=False)
    )
    if getattr(found, "rowcount", 0):
        _close_pending(session, [batch_id], LineOutcome.CANCELLED)
    session.commit()
    return get_batch(session, batch_id)


def begin_batches(session: Session) -> None:
    """Validated batches (their lines are checked at create) start."""
    session.execute(
        update(Batch)
        .where(col(Batch.status) == BatchStatus.VALIDATING)
        .values(status=BatchStatus.IN_PROGRESS, in_progress_at=utc_now())
        .execution_options(synchronize_session=False)
    )
    session.commit()


def expire_due(session: Session) -> None:
    """Open batches past their completion window: the lines not begun end expired (running
    ones are stopped by their workers, `stopping`)."""
    due = select(Batch.id).where(col(Batch.status).in_(OPEN), col(Batch.expires_at) < utc_now())
    ids = list(session.exec(due))
    if ids:
        _close_pending(session, ids, LineOutcome.EXPIRED)
        session.commit()


def any_open(session: Session) -> bool:
    """Whether a batch is not ended yet (its lines may run)."""
    query = select(Batch.id).where(col(Batch.status).in_(LIVE)).limit(1)
    return session.exec(query).first() is not None


def key_names(session: Session, batch_ids: set[str]) -> dict[str, str | None]:
    """The name of the key that created each batch (its lines run as it)."""
    query = select(Batch.id, Batch.api_key_name).where(col(Batch.id).in_(batch_ids))
    return dict(session.exec(query).all())
