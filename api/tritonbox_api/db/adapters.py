"""The `adapter` table's helpers (keyword-only, each commits its own write)."""

from __future__ import annotations

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from tritonbox_api.db.models import Adapter


class AdapterExistsError(ValueError):
    pass


def create_adapter(*, session: Session, adapter: Adapter) -> Adapter:
    """Insert `adapter`; AdapterExistsError when its name is taken (by any api worker)."""
    session.add(adapter)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        raise AdapterExistsError(adapter.name) from None
    session.refresh(adapter)
    return adapter


def get_adapter(*, session: Session, name: str) -> Adapter | None:
    return session.get(Adapter, name)


def list_adapters(*, session: Session) -> list[Adapter]:
    return list(session.exec(select(Adapter).order_by(col(Adapter.name))))


def delete_adapter(*, session: Session, name: str) -> Adapter | None:
    """Remove the adapter `name`; the removed row, or None when there was none."""
    adapter = session.get(Adapter, name)
    if adapter is not None:
        session.delete(adapter)
        session.commit()
    return adapter
