"""Alembic's environment: migrations run on the connection `tritonbox_api.db.migrate` passes."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine
from sqlmodel import SQLModel

from tritonbox_api.db import batches, models  # noqa: F401  (the tables, for autogenerate)


def run() -> None:
    connection = context.config.attributes.get("connection")
    if connection is None:
        # Alembic's own command line (a developer writing a revision): the configured URL.
        url = context.config.get_main_option("sqlalchemy.url")
        if not url:
            raise RuntimeError("set sqlalchemy.url (alembic -x is not read): the database")
        with create_engine(url).connect() as own:
            _migrate(own)
            own.commit()
        return
    _migrate(connection)


def _migrate(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=SQLModel.metadata,
        # SQLite alters most columns only by copying the table: autogenerate writes it so.
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


run()
