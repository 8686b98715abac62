"""A batch whose lines have all ended gets its output and error files and its final status.

Any api worker may find it ready; one takes it (`finalizing_at` set by a conditional UPDATE) and
writes the files and the status in one transaction. A worker that stopped half-way leaves the
stamp behind: after FINALIZE_STALE another one takes it again (the files are written only with
the final status, so nothing is written twice).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, Exists, exists, or_, update
from sqlmodel import Session, col, select

from tritonbox_api.db.batch_files import make_file
from tritonbox_api.db.batch_store import get_batch
from tritonbox_api.db.batches import Batch, BatchLine, BatchStatus, LineOutcome, LineState
from tritonbox_api.db.models import utc_now
from tritonbox_api.protocol.batch_lines import CANCELLED, EXPIRED, unanswered

FINALIZE_STALE = timedelta(seconds=60)
_ENDING = (BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING, BatchStatus.FINALIZING)


def _unfinished() -> Exists:
    return exists().where(
        col(BatchLine.batch_id) == col(Batch.id),
        col(BatchLine.state).in_((LineState.PENDING, LineState.RUNNING)),
    )


def _free(now: datetime) -> ColumnElement[bool]:
    return or_(col(Batch.finalizing_at).is_(None), col(Batch.finalizing_at) < now - FINALIZE_STALE)


def ready(session: Session) -> list[str]:
    """Batches whose every line has ended, not being finalized by a live worker."""
    query = select(Batch.id).where(col(Batch.status).in_(_ENDING), ~_unfinished(), _free(utc_now()))
    return list(session.exec(query))


def finalize(session: Session, batch_id: str) -> tuple[Batch, dict[LineOutcome, int]] | None:
    """Write the batch's files and final status; None if another worker has it. With the
    batch: how many lines ended without being begun, by outcome (for the metrics)."""
    stamp = utc_now()
    batch = get_batch(session, batch_id)
    if batch is None or batch.status not in _ENDING:
        return None
    target = BatchStatus.FINALIZING if batch.status is BatchStatus.IN_PROGRESS else batch.status
    taken = session.execute(
        update(Batch)
        .where(
            col(Batch.id) == batch_id,
            col(Batch.status) == batch.status,
            _free(stamp),
            ~_unfinished(),
        )
        .values(status=target, finalizing_at=stamp)
        .execution_options(synchronize_session=False)
    )
    session.commit()
    if not getattr(taken, "rowcount", 0):
        return None
    lines = session.exec(
        select(BatchLine).where(col(BatchLine.batch_id) == batch_id).order_by(col(BatchLine.line))
    )
    outputs: list[str] = []
    errors: list[str] = []
    expired = False
    unbegun: dict[LineOutcome, int] = {}
    for line in lines:
        result = line.result
        if result is None:  # never begun: expired or cancelled
            code, message = EXPIRED if line.outcome is LineOutcome.EXPIRED else CANCELLED
            result = unanswered(line.custom_id, code, message)
            if line.outcome is not None:
                unbegun[line.outcome] = unbegun.get(line.outcome, 0) + 1
        expired = expired or line.outcome is LineOutcome.EXPIRED
        (outputs if line.outcome is LineOutcome.COMPLETED else errors).append(result)
    values: dict[str, object] = {}
    for kind, content in (("output", outputs), ("error", errors)):
        if content:
            data = ("\n".join(content) + "\n").encode()
            made = make_file(
                purpose="batch_output",
                filename=f"{batch_id}_{kind}.jsonl",
                content=data,
                key_name=batch.api_key_name,
            )
            session.add(made)
            values[f"{kind}_file_id"] = made.id
    now = utc_now()
    if batch.status is BatchStatus.CANCELLING:
        values |= {"status": BatchStatus.CANCELLED, "cancelled_at": now}
    elif expired:
        values |= {"status": BatchStatus.EXPIRED, "expired_at": now}
    else:
        values |= {"status": BatchStatus.COMPLETED, "completed_at": now}
    session.execute(
        update(Batch)
        .where(col(Batch.id) == batch_id, col(Batch.finalizing_at) == stamp)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    session.commit()
    final = get_batch(session, batch_id)
    return (final, unbegun) if final is not None else None
