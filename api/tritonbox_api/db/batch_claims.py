"""Batch lines as the api workers run them (db/batches.py): claim, end, give back, recover.
Each helper commits its writes.

Lines are claimed, ended and given back by conditional UPDATEs (`state` must still be what the
caller saw), so two api workers never both run a line and a line's end is written once: on
PostgreSQL the claim also locks the rows it picks (`FOR UPDATE SKIP LOCKED`: another worker's
claim takes the next lines instead of waiting); on SQLite a write transaction whose snapshot went
stale is refused, never applied twice.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import update
from sqlmodel import Session, col, select

from tritonbox_api.db import workers
from tritonbox_api.db.batch_store import of_open_batches
from tritonbox_api.db.batches import Batch, BatchLine, BatchStatus, LineOutcome, LineState
from tritonbox_api.db.crud import as_utc
from tritonbox_api.db.models import utc_now


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
    return _back_to_pending(session, mine)


def recover(session: Session, *, live_workers: Collection[str]) -> int:
    """Running lines of workers that are gone (stopped, crashed) back to pending."""
    orphan = [of_open_batches(), col(BatchLine.state) == LineState.RUNNING]
    if live_workers:
        orphan.append(col(BatchLine.claimed_by).not_in(live_workers))
    return _back_to_pending(session, orphan)


def recover_gone(session: Session, worker: str) -> int:
    """`recover`, `worker` (this one) and the workers whose heartbeat is fresh being live; a
    worker of this host whose process is gone is not (it restarted: its lines come back now)."""
    live = workers.live_worker_ids(session=session, within=workers.STALE_AFTER)
    live = [each for each in live if not workers.gone_from_this_host(each)]
    return recover(session, live_workers=[*live, worker])


def _back_to_pending(session: Session, where: list[Any]) -> int:
    """The running lines `where` selects back to pending, unclaimed; how many there were."""
    result = session.execute(
        update(BatchLine)
        .where(*where)
        .values(state=LineState.PENDING, claimed_by=None)
        .execution_options(synchronize_session=False)
    )
    session.commit()
    return int(getattr(result, "rowcount", 0))
