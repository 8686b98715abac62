"""Reading and writing batch files (db/batches.py `batch_file`). Each helper commits its writes."""

from __future__ import annotations

import secrets

from sqlalchemy import delete, or_
from sqlalchemy.orm import defer
from sqlmodel import Session, col, select

from tritonbox_api.db.batches import BatchFile
from tritonbox_api.db.models import utc_now


def new_id(prefix: str) -> str:
    """96 random bits after OpenAI's prefix (`file-`, `batch_`)."""
    return f"{prefix}{secrets.token_hex(12)}"


def add_file(
    session: Session, *, purpose: str, filename: str, content: bytes, key_name: str | None
) -> BatchFile:
    row = make_file(purpose=purpose, filename=filename, content=content, key_name=key_name)
    session.add(row)
    session.commit()
    return row


def make_file(*, purpose: str, filename: str, content: bytes, key_name: str | None) -> BatchFile:
    return BatchFile(
        id=new_id("file-"),
        purpose=purpose,
        filename=filename,
        bytes=len(content),
        created_at=utc_now(),
        api_key_name=key_name,
        content=content,
    )


def get_file(session: Session, file_id: str, *, content: bool = False) -> BatchFile | None:
    query = select(BatchFile).where(col(BatchFile.id) == file_id)
    if not content:  # a file's bytes are read only when asked for (they may be megabytes)
        query = query.options(defer(BatchFile.content))  # type: ignore[arg-type]
    return session.exec(query).first()


def list_files(
    session: Session, *, purpose: str | None, after: str | None, limit: int, ascending: bool
) -> tuple[list[BatchFile], bool]:
    """A page of files, newest first (oldest with `ascending`), after the file `after`; and
    whether more follow."""
    query = select(BatchFile).options(defer(BatchFile.content))  # type: ignore[arg-type]
    if purpose:
        query = query.where(col(BatchFile.purpose) == purpose)
    created, ident = col(BatchFile.created_at), col(BatchFile.id)
    if after:
        anchor = get_file(session, after)
        if anchor is not None:
            if ascending:
                later = or_(
                    created > anchor.created_at,
                    (created == anchor.created_at) & (ident > anchor.id),
                )
            else:
                later = or_(
                    created < anchor.created_at,
                    (created == anchor.created_at) & (ident < anchor.id),
                )
            query = query.where(later)
    order = (created.asc(), ident.asc()) if ascending else (created.desc(), ident.desc())
    rows = list(session.exec(query.order_by(*order).limit(limit + 1)))
    return rows[:limit], len(rows) > limit


def delete_file(session: Session, file_id: str) -> bool:
    result = session.execute(delete(BatchFile).where(col(BatchFile.id) == file_id))
    session.commit()
    return bool(getattr(result, "rowcount", 0))
