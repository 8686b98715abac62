"""Database on a real PostgreSQL server: concurrent writers off the event loop, writability,
and URLs (SQLite's own behaviour is in test_session.py)."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from sqlalchemy import make_url
from tritonbox_testing.ports import free_port
from tritonbox_testing.postgres import RunningPostgres
from tritonbox_testing.predictions import count, write_concurrently

from tritonbox_api.db.session import Database


@pytest.fixture
def database_url(postgres_server: RunningPostgres) -> str:
    """PostgreSQL only here (the `database` fixture opens it)."""
    return postgres_server.create_database()


def test_concurrent_writes_land_off_the_event_loop(database: Database) -> None:
    rows, counts, threads, loop_thread = write_concurrently(database, 300)
    assert len({row.id for row in rows}) == 300
    assert all(0 <= c <= 300 for c in counts)
    with database.session() as session:
        assert count(session) == 300
    assert loop_thread not in threads
    # PostgreSQL takes concurrent writers: commits overlap on several threads.
    assert len(threads) > 1


def test_is_writable(database: Database, database_url: str) -> None:
    assert database.is_writable()
    assert asyncio.run(database.check_writable())
    name = make_url(database_url).database
    admin = make_url(database_url).set(drivername="postgresql", database="postgres")
    with psycopg.connect(admin.render_as_string(hide_password=False), autocommit=True) as db:
        db.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    read_only = Database(database_url)
    # Opening migrates, which a read-only database refuses: the probe runs on a closed one's
    # engine instead, opened without migrating.
    read_only.open(migrate_schema=False)
    try:
        assert not read_only.is_writable()
    finally:
        read_only.close()


def test_an_unreachable_server_is_not_writable() -> None:
    database = Database(f"postgresql+psycopg://nobody:secret@127.0.0.1:{free_port()}/none")
    database.open(migrate_schema=False)
    try:
        assert not database.is_writable()
        assert "secret" not in database.name and "***" in database.name
    finally:
        database.close()


def test_only_sqlite_and_postgresql() -> None:
    with pytest.raises(ValueError, match="SQLite or PostgreSQL"):
        Database("mysql+pymysql://u@h/db")
    with pytest.raises(ValueError, match="needs a file"):
        Database("sqlite://")
