"""Batches and their lines in the database (db/batches.py). Each helper commits its writes.

Lines are claimed, ended and given back by conditional UPDATEs (`state` must still be what the
caller saw), so two api workers never both run a line and a line's end is written once: on
PostgreSQL the claim also locks the rows it picks (`FOR UPDATE SKIP LOCKED`: another worker's
claim takes the next lines instead of waiting); on SQLite a write transaction whose snapshot went
stale is refused, never applied twice.
"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import func, insert, update
from sqlmodel import Session, col, select

from tritonbox_api.db.batches import Batch, BatchLine, BatchStatus, LineOutcome, LineState
from tritonbox_api.db.crud import as_utc
from tritonbox_api.db.models import utc_now
from tritonbox_api.protocol.batch_lines import InputLine, answered

OPEN = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)


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


def waiting(session: Session) -> int:
    """Lines not yet begun, over every batch."""
    query = select(func.count()).where(col(BatchLine.state) == LineState.PENDING)
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


def stopping(session: Session, batch_ids: Collection[str]) -> dict[str, LineOutcome]:
    """Which of these batches' running lines must stop now, and how they end."""
    query = select(Batch.id, Batch.status, Batch.expires_at).where(col(Batch.id).in_(batch_ids))
    stop: dict[str, LineOutcome] = {}
    now = utc_now()
    for ident, status, expires in session.exec(query):
        if status == BatchStatus.CANCELLING:
            stop[ident] = LineOutcome.CANCELLED
        elif as_utc(expires) < now:
            stop[ident] = LineOutcome.EXPIRED
    return stop


def claim(session: Session, *, worker: str, limit: int, postgres: bool) -> list[BatchLine]:
    """Up to `limit` pending lines of running batches (oldest batch first, in file order),
    now `running` for `worker`."""
    query = (
        select(BatchLine.id)
        .join(Batch, col(Batch.id) == col(BatchLine.batch_id))
        .where(
            col(Batch.status) == BatchStatus.IN_PROGRESS,
            col(Batch.expires_at) > utc_now(),
            col(BatchLine.state) == LineState.PENDING,
        )
        .order_by(col(Batch.created_at), col(BatchLine.batch_id), col(BatchLine.line))
        .limit(limit)
    )
    if postgres:
        query = query.with_for_update(skip_locked=True, of=BatchLine)
    ids = list(session.exec(query))
    if not ids:
        session.rollback()
        return []
    session.execute(
        update(BatchLine)
        .where(col(BatchLine.id).in_(ids), col(BatchLine.state) == LineState.PENDING)
        .values(state=LineState.RUNNING, claimed_by=worker, attempts=BatchLine.attempts + 1)
        .execution_options(synchronize_session=False)
    )
    session.commit()
    mine = select(BatchLine).where(
        col(BatchLine.id).in_(ids),
        col(BatchLine.claimed_by) == worker,
        col(BatchLine.state) == LineState.RUNNING,
    )
    return list(session.exec(mine.order_by(col(BatchLine.id))))


def end_line(
    session: Session,
    *,
    line_id: int,
    worker: str,
    outcome: LineOutcome,
    result: str,
    prediction_id: str | None,
) -> bool:
    """Record a line's end, once: False if it is no longer this worker's running line."""
    ended = session.execute(
        update(BatchLine)
        .where(
            col(BatchLine.id) == line_id,
            col(BatchLine.state) == LineState.RUNNING,
            col(BatchLine.claimed_by) == worker,
        )
        .values(
            state=LineState.DONE,
            outcome=outcome,
            result=result,
            prediction_id=prediction_id,
            ended_at=utc_now(),
        )
        .execution_options(synchronize_session=False)
    )
    session.commit()
    return bool(getattr(ended, "rowcount", 0))


def release(session: Session, *, worker: str, line_ids: Collection[int] | None = None) -> int:
    """This worker's running lines (all, or these) back to pending, to be run again."""
    mine = [col(BatchLine.claimed_by) == worker, col(BatchLine.state) == LineState.RUNNING]
    if line_ids is not None:
        mine.append(col(BatchLine.id).in_(line_ids))
    result = session.execute(
        update(BatchLine)
        .where(*mine)
        .values(state=LineState.PENDING, claimed_by=None)
        .execution_options(synchronize_session=False)
    )
    session.commit()
    return int(getattr(result, "rowcount", 0))


def recover(session: Session, *, live_workers: Collection[str]) -> int:
    """Running lines of workers that are gone (stopped, crashed) back to pending."""
    orphan = [col(BatchLine.state) == LineState.RUNNING]
    if live_workers:
        orphan.append(col(BatchLine.claimed_by).not_in(live_workers))
    result = session.execute(
        update(BatchLine)
        .where(*orphan)
        .values(state=LineState.PENDING, claimed_by=None)
        .execution_options(synchronize_session=False)
    )
    session.commit()
    return int(getattr(result, "rowcount", 0))
