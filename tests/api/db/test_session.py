"""Database: a real SQLite file in WAL mode, every call off the event loop, writes serialised."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, func, select
from tritonbox_testing.predictions import count, new_prediction, write_concurrently

from tritonbox_api.db import crud
from tritonbox_api.db.models import Prediction, Source
from tritonbox_api.db.session import Database, DatabaseClosedError
from tritonbox_api.db.url import settings_url
from tritonbox_api.settings import ApiSettings


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    """SQLite only here, in a folder not made yet (the `database` fixture opens it)."""
    return f"sqlite:///{tmp_path / 'nested' / 'tritonbox.db'}"


def _pragma(session: Session, name: str) -> object:
    return session.connection().exec_driver_sql(f"PRAGMA {name}").scalar()


def test_open_creates_the_file_in_wal_mode(database: Database) -> None:
    assert database.path is not None and database.path.is_file()
    with database.session() as session:
        assert _pragma(session, "journal_mode") == "wal"
        assert _pragma(session, "busy_timeout") == 5000
        assert _pragma(session, "synchronous") == 1  # NORMAL
        assert _pragma(session, "foreign_keys") == 1
    # The setting is in the file: any other client sees WAL too.
    with sqlite3.connect(str(database.path)) as other:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_every_thread_s_connection_is_configured(database: Database) -> None:
    async def main() -> tuple[object, object]:
        written = await database.run(lambda s: _pragma(s, "busy_timeout"))
        read = await database.read(lambda s: _pragma(s, "busy_timeout"))
        return written, read

    assert asyncio.run(main()) == (5000, 5000)


def test_concurrent_writes_all_land_on_one_thread(database: Database) -> None:
    rows, counts, threads, _ = write_concurrently(database, 200)
    assert len({row.id for row in rows}) == 200
    assert all(0 <= c <= 200 for c in counts)
    with database.session() as session:
        assert count(session) == 200
    assert len(threads) == 1
    assert threading.get_ident() not in threads  # never on the event loop's thread


def test_calls_run_off_the_event_loop(database: Database) -> None:
    async def main() -> tuple[int, int, int]:
        loop_thread = threading.get_ident()
        writer = await database.run(lambda _: threading.get_ident())
        reader = await database.read(lambda _: threading.get_ident())
        return loop_thread, writer, reader

    loop_thread, writer, reader = asyncio.run(main())
    assert loop_thread not in (writer, reader)
    assert writer != reader


def test_submitted_calls_run_without_a_waiter(database: Database) -> None:
    async def main() -> int:
        return await asyncio.wrap_future(database.submit(lambda _: threading.get_ident()))

    submitted = database.submit(lambda session: new_prediction(session, "unawaited"))
    writer = asyncio.run(main())
    assert submitted.result(timeout=10).id == "unawaited"
    assert writer != threading.get_ident()
    database.close()
    with pytest.raises(DatabaseClosedError):
        database.submit(lambda _: None)


def test_uncommitted_changes_are_rolled_back(database: Database) -> None:
    def forgetful(session: Session) -> None:
        session.add(Prediction(id="x", source=Source.API, model="m"))
        session.flush()

    asyncio.run(database.run(forgetful))
    with database.session() as session:
        assert crud.get_prediction(session=session, id="x") is None


def test_is_writable(database: Database) -> None:
    assert database.is_writable()
    assert asyncio.run(database.check_writable())
    with database.session() as session:
        new_prediction(session, "a")
    # is_writable changes nothing.
    with database.session() as session:
        assert session.exec(select(func.count()).select_from(Prediction)).one() == 1


def test_not_writable_while_another_process_holds_the_lock(tmp_path: Path) -> None:
    database = Database(tmp_path / "locked.db", busy_timeout_ms=100)
    database.open()
    other = sqlite3.connect(str(database.path), isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        assert not database.is_writable()
        other.execute("ROLLBACK")
        assert database.is_writable()
    finally:
        other.close()
        database.close()


def test_closed_database(tmp_path: Path) -> None:
    database = Database(tmp_path / "closed.db")
    assert not database.is_writable()
    with pytest.raises(DatabaseClosedError):
        asyncio.run(database.run(lambda _: None))
    database.open()
    database.open()  # a second open changes nothing
    database.close()
    database.close()
    assert not database.is_writable()
    assert not asyncio.run(database.check_writable())
    with pytest.raises(DatabaseClosedError):
        asyncio.run(database.read(lambda _: None))


def test_close_leaves_one_self_contained_file(tmp_path: Path) -> None:
    path = tmp_path / "closed.db"
    database = Database(path)
    database.open()
    with database.session() as session:
        new_prediction(session, "a")
    database.close()
    wal = Path(f"{path}-wal")
    assert not wal.exists() or wal.stat().st_size == 0  # checkpointed into the file
    with sqlite3.connect(path) as other:
        assert other.execute("SELECT id FROM prediction").fetchall() == [("a",)]


def test_the_url_from_the_settings(tmp_path: Path) -> None:
    factory: Any = ApiSettings  # `_env_file=None`: tests ignore a developer's .env
    default = settings_url(factory(_env_file=None, database_path=tmp_path / "x.db"))
    assert default.render_as_string() == f"sqlite:///{tmp_path / 'x.db'}"
    # A password with URL-special characters needs no encoding when given on its own.
    postgres = settings_url(
        factory(
            _env_file=None,
            database_url="postgresql+psycopg://tritonbox@db:5432/tritonbox",
            postgres_password="p@ss/w:rd%",
        )
    )
    assert postgres.password == "p@ss/w:rd%" and postgres.host == "db"
    assert "p@ss" not in Database(postgres).name
    named = settings_url(
        factory(
            _env_file=None,
            database_url="postgresql+psycopg://u:inline@db/x",
            postgres_password="other",
        )
    )
    assert named.password == "inline"  # the URL's own password wins
